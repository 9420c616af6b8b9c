"""Direct broadcast: the root's vector reaches every rank in n parts, each carried by its own
rank, so all the node's cores copy at once.

Round 1 trades the addresses of every rank's output (the root's is its x). Part r of the vector
(n even parts) is rank r's to deliver: the root writes its own part into every non-root's
output; a non-root reads its part out of the root's memory into its own output, a chunk at a
time, and writes each chunk into every other non-root's output while it is still in cache
(window.reader, window.writer). Round 2 says every copy is done, and only then may a rank
return (the root's x must not change while it is read; no output may be left half written).
Only rank r writes part r anywhere, and only the root's copy of it is read, so no rank reads
what another writes.

Letting the non-roots read the whole vector each (the first version) made one core copy S on
2 ranks while the root's waited; split, each copies S/2. Cost: 2 alpha_w + (n-1) alpha_d +
(n-1)/n S beta_d (the root's writes; a non-root moves S/n in and (n-2)/n S out), writes priced
as reads.
"""
from __future__ import annotations

from functools import partial

from ..core.schedule import layout
from ..selection.cost import Network
from ._direct import CHUNK_BYTES, exchange, moves_plan, moves_road, reads
from ._rounds import sync
from .base import PlannedAlgorithm


class DirectBroadcast(PlannedAlgorithm):
    name = "direct"
    collective = "broadcast"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        outputs = exchange(window, stamp, word, trouble, (dst,), 2)
        _move(window, dst, shape, outputs)
        sync(window, stamp, word, trouble, 1, 2)

    def road(self, window, src, dst, shape, reducer, word):
        """Both rounds and the moves in one compiled call (_direct.moves_road): a non-root's part
        read whole, then written whole to the other non-roots (the core reads before it writes)."""
        root, me, item = shape.root, window.rank, dst.itemsize
        off, mine = layout(shape)[me]
        at, nbytes = off * item, mine * item
        reads = [] if me == root else [(root, at, at, nbytes)]
        writes = [(r, at, at, nbytes) for r in range(window.size) if r not in (me, root)]
        return moves_road(window, dst, dst, dst, moves_plan(window, reads=reads, writes=writes),
                          partial(_move, window, dst, shape))


def _move(window, dst, shape, outputs: list) -> None:
    """This rank's part, a chunk at a time: read out of the root (off the root), and written into
    every other non-root's output (``outputs``: every rank's posted addresses)."""
    root, me, n = shape.root, window.rank, window.size
    off, mine = layout(shape)[me]
    item, read, write = dst.itemsize, window.reader, window.writer
    targets = [r for r in range(n) if r not in (me, root)]
    per = max(1, CHUNK_BYTES // item)
    for lo in range(off, off + mine, per):
        chunk = dst[lo:min(lo + per, off + mine)]
        if me != root:
            read(root, outputs[root][0] + lo * item, chunk)
        for r in targets:
            write(r, outputs[r][0] + lo * item, chunk)
