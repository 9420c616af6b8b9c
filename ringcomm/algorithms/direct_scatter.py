"""Direct scatter: every rank copies its block straight out of the root's x.

Round 1 trades addresses (only the root's is used); rank r reads block r of the root's x in
place (window.reader), the root copies its own; round 2 says every read is done, so the root
may return. One copy per byte. Cost: 2 alpha_w + alpha_d + S/n beta_d (S the root's x; the
ranks read their blocks at once, each on its own core).
"""
from __future__ import annotations

from functools import partial

from ..selection.cost import Network
from ._direct import exchange, moves_plan, moves_road, reads
from ._rounds import sync
from .base import PlannedAlgorithm


class DirectScatter(PlannedAlgorithm):
    name = "direct"
    collective = "scatter"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        return 2 * net.window.alpha + reads(nbytes / net.size, net)

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        addrs = exchange(window, stamp, word, trouble, (dst if src is None else src,), 2)
        _move(window, src, dst, shape, addrs)
        sync(window, stamp, word, trouble, 1, 2)

    def road(self, window, src, dst, shape, reducer, word):
        """Both rounds and the moves in one compiled call (_direct.moves_road)."""
        count, root, me = shape.count, shape.root, window.rank
        nbytes = count * dst.itemsize
        if me == root:
            plan = moves_plan(window, copies=[(me * nbytes, 0, nbytes)])
        else:
            plan = moves_plan(window, reads=[(root, me * nbytes, 0, nbytes)])
        return moves_road(window, src, dst, dst if src is None else src, plan,
                          partial(_move, window, src, dst, shape, copy_own=False))


def _move(window, src, dst, shape, addrs: list, copy_own: bool = True) -> None:
    """The root copies its own block (unless ``copy_own`` is False: the compiled call copied it before
    it handed the rest back); every other rank reads its block out of the root's x (``addrs``:
    every rank's posted addresses)."""
    count, root, me = shape.count, shape.root, window.rank
    if count:
        if me == root:
            if copy_own:
                dst[...] = src[me * count:(me + 1) * count]
        else:
            window.reader(root, addrs[root][0] + me * count * dst.itemsize, dst)
