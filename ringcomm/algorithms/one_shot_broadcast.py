"""One-shot broadcast through a shared window: the root writes, every other rank reads in place.

Each round the root copies a piece of x into its window slot and every rank posts the round;
once all have posted, the others copy the root's slot into their x. The rounds pipeline: the
root writes piece i+1 into its other slot while the others still read piece i (it may, since
they posted round i+1 only after reading round i-1 from that slot). Every round is also a
barrier that checks every rank's stamp and root, so it needs no confirmation barrier after it.

Bytes per rank: the root writes S, every other rank reads S. Cost: ceil(S/C) alpha_w +
(S + min(S, C)) beta_w on the window link: the root's writes and the others' reads overlap but
for the first piece (the reads of all non-roots run at once, on their own cores). Priced as two
copies one after the other, it lost to direct from 4 MiB; it beats direct by 20-30% at 16-64 MiB,
and at 1-8 MiB the two are close (docs/performance.md, round seven).
"""
from __future__ import annotations

from functools import lru_cache

from ..selection.cost import Network
from . import _planned
from ._rounds import pieces_of, sync
from .base import PlannedAlgorithm


class OneShotBroadcast(PlannedAlgorithm):
    name = "one_shot"
    collective = "broadcast"

    def seconds(self, nbytes, net: Network) -> float:
        first = min(nbytes, net.window_bytes)
        return net.window_rounds(nbytes) * net.window.alpha + (nbytes + first) * net.window_beta(nbytes)

    def planned(self, window, src, dst, shape, reducer, word):
        if dst.nbytes <= window.capacity and _planned.usable(window, dst):
            return _plan(window.rank, shape.root, dst.nbytes), _planned.COPY
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        x, root = dst, shape.root
        per = window.capacity // x.itemsize
        pieces = pieces_of(x.size, per)
        for i in range(pieces):
            part = x if pieces == 1 else x[i * per:(i + 1) * per]
            if window.rank == root:
                window.next_slot(x.dtype, part.size)[...] = part
                sync(window, stamp, word, trouble, i, pieces)
            else:
                k = sync(window, stamp, word, trouble, i, pieces)
                part[...] = window.views(k, x.dtype, part.size)[root]


@lru_cache(maxsize=256)
def _plan(me: int, root: int, nbytes: int) -> bytes:
    """One round, compiled: the root writes its vector into its slot, the others copy it out."""
    if me == root:
        return _planned.pack([(0, 0, nbytes)], [])
    return _planned.pack([], [(root, 0, 0, nbytes)])
