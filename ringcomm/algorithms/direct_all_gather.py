"""Direct all-gather: every rank writes its part straight into every other rank's output.

Round 1 trades the addresses of every rank's output; each rank then goes through its part (its
input, or its place in its output when in place) a chunk at a time: copies the chunk into its
own output unless in place, and writes it into every peer's output at its place (window.writer)
while it is still in cache; round 2 says every write is done, and only then may a rank return.
Only rank r writes part r anywhere, so in place is safe. Ranks that disagree on the parts
(uneven counts) fail round 1's check of the shape word, before any write.

Writing from the part's owner rather than reading from it (the first version) copies the same
bytes; 2 ranks, two alternating launches each way (`allreduce_perf.py --collective all_gather
--algorithm direct`): 4 MiB 229-237 us -> 190-192 us, 16 MiB 1.12-1.32 ms -> 0.53-0.61 ms,
64 MiB 1.01-1.05x MPI_Allgather's time -> 0.91-0.95x. The same change to all_to_all measured no
better than reading, and is not made there. Copying and writing the whole part one after the
other read it from memory twice; chunk by chunk (as the direct broadcast does), once: 2 ranks,
three alternating launches each way (``--algorithm direct``, 4-64 MiB), 64 MiB 7.99-8.73 ms
(1.14-1.24x MPI_Allgather) -> 4.59-5.90 ms (0.74-0.85x), 16 MiB 1.00-1.55 ms -> 0.91-1.42 ms.
Cost: 2 alpha_w + (n-1) alpha_d + (n-1)/n S beta_d (S gathered; writes priced as reads).
"""
from __future__ import annotations

from functools import partial

from ..core.schedule import layout
from ..selection.cost import Network
from ._direct import CHUNK_BYTES, exchange, moves_plan, moves_road, reads
from ._rounds import sync
from .base import PlannedAlgorithm


class DirectAllGather(PlannedAlgorithm):
    name = "direct"
    collective = "all_gather"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        outputs = exchange(window, stamp, word, trouble, (dst,), 2)
        _move(window, src, dst, shape, outputs)
        sync(window, stamp, word, trouble, 1, 2)

    def road(self, window, src, dst, shape, reducer, word):
        """Both rounds and the moves in one compiled call (_direct.moves_road): the part copied
        whole, then written whole to each peer (the chunks are for Python's copies, whose
        pieces then stay in cache between the copy and the writes)."""
        me, item = window.rank, dst.itemsize
        off, mine = layout(shape)[me]
        start = off * item if shape.in_place else 0   # where this rank's part lies in src
        copies = [] if shape.in_place else [(0, off * item, mine * item)]
        writes = [(r, start, off * item, mine * item) for r in range(window.size) if r != me]
        return moves_road(window, src, dst, dst, moves_plan(window, copies=copies, writes=writes),
                          partial(_move, window, src, dst, shape, copy_own=False))


def _move(window, src, dst, shape, outputs: list, copy_own: bool = True) -> None:
    """This rank's part, a chunk at a time: into its own output unless in place (or ``copy_own`` is
    False: the compiled call copied it before it handed the rest back), and into every peer's
    output at its place (``outputs``: every rank's posted addresses)."""
    parts, me = layout(shape), window.rank
    off, mine = parts[me]
    own = src[off:off + mine] if shape.in_place else src
    item, write = dst.itemsize, window.writer
    peers = [r for r in range(len(parts)) if r != me]
    per = max(1, CHUNK_BYTES // item)
    for lo in range(0, mine, per):
        piece = own[lo:lo + per]
        if copy_own and not shape.in_place:
            dst[off + lo:off + lo + piece.size] = piece
        for r in peers:
            write(r, outputs[r][0] + (off + lo) * item, piece)
