"""Direct gather: every rank writes its x straight into the root's output.

Round 1 trades addresses (only the root's output is used); rank r writes its block in place
(window.writer) at r's place in the root's output while the root copies its own; round 2 says
every write is done, so the root may return. One copy per byte, no staging, every rank's copy at
once on its own core: pulled by the root instead, the blocks would come one after another (2
ranks, 1 MiB: 110-118 us pulled against 50-59 pushed, docs/performance.md round eight). No byte is written
before round 1 has checked every rank's stamp and shape word, so a rank in another call or with
another count or root never writes into the root; a root that gives up later (a writer late
past the timeout) keeps its output alive (Communicator._failed_call), so a late block lands there
and nowhere else. Cost: 2 alpha_w + alpha_d + S/n beta_d (S the gathered size), as direct
scatter, its mirror.
"""
from __future__ import annotations

from functools import partial

from ..selection.cost import Network
from ._direct import exchange, moves_plan, moves_road, reads
from ._rounds import sync
from .base import PlannedAlgorithm


class DirectGather(PlannedAlgorithm):
    name = "direct"
    collective = "gather"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        return 2 * net.window.alpha + reads(nbytes / net.size, net)

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        addrs = exchange(window, stamp, word, trouble, (dst if window.rank == shape.root else src,), 2)
        _move(window, src, dst, shape, addrs)
        sync(window, stamp, word, trouble, 1, 2)

    def road(self, window, src, dst, shape, reducer, word):
        """Both rounds and the moves in one compiled call (_direct.moves_road)."""
        count, root, me = shape.count, shape.root, window.rank
        nbytes = count * src.itemsize
        if me == root:
            plan = moves_plan(window, copies=[(0, me * nbytes, nbytes)])
        else:
            plan = moves_plan(window, writes=[(root, 0, me * nbytes, nbytes)])
        return moves_road(window, src, dst, dst if me == root else src, plan,
                          partial(_move, window, src, dst, shape, copy_own=False))


def _move(window, src, dst, shape, addrs: list, copy_own: bool = True) -> None:
    """The root copies its own block (unless ``copy_own`` is False: the compiled call copied it before
    it handed the rest back); every other rank writes its x at its place in the root's output
    (``addrs``: every rank's posted addresses)."""
    count, root, me = shape.count, shape.root, window.rank
    if count:
        if me == root:
            if copy_own:
                dst[me * count:(me + 1) * count] = src
        else:
            window.writer(root, addrs[root][0] + me * count * src.itemsize, src)
