"""One-shot all-gather through a shared window: each rank writes its part, every rank reads all.

Each round every rank copies a piece of its own part (even, or its count of an uneven call;
fewer or none once its part is done) into its window slot and posts the round; once all have
posted, each copies every other rank's piece into its place in the output. This rank's own part
goes to the output straight from the input (nothing to do in place).

Bytes per rank: S/n written, (n-1)/n S read (S the gathered size). Cost: ceil(S/(n C)) alpha_w +
S beta_w on the window link (S/(n C) rounds for an even call; an uneven one takes as many as its
largest part needs).
"""
from __future__ import annotations

from functools import lru_cache

from ..core.schedule import largest, layout
from ..selection.cost import Network
from . import _planned
from ._rounds import pieces_of, sync
from .base import PlannedAlgorithm


class OneShotAllGather(PlannedAlgorithm):
    name = "one_shot"
    collective = "all_gather"

    def seconds(self, nbytes, net: Network) -> float:
        return net.window_rounds(nbytes / net.size) * net.window.alpha + nbytes * net.window.beta

    def planned(self, window, src, dst, shape, reducer, word):
        if largest(shape) * dst.itemsize <= window.capacity and _planned.usable(window, src, dst):
            return _plan(shape, window.rank, dst.itemsize), _planned.COPY
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        me, per = window.rank, window.capacity // dst.itemsize
        parts = layout(shape)
        off, mine = parts[me]
        own = src[off:off + mine] if shape.in_place else src
        if not shape.in_place and mine:
            dst[off:off + mine] = own
        pieces = pieces_of(max(n for _, n in parts), per)
        for i in range(pieces):
            lo = i * per
            piece = own[lo:lo + per]
            window.next_slot(dst.dtype, piece.size)[...] = piece
            k = sync(window, stamp, word, trouble, i, pieces)
            slots = window.views(k, dst.dtype, per)
            for r, (o, n) in enumerate(parts):
                m = min(per, n - lo)
                if r != me and m > 0:
                    dst[o + lo:o + lo + m] = slots[r][:m]


@lru_cache(maxsize=256)
def _plan(shape, me: int, item: int) -> bytes:
    """One round, compiled: this rank's part into its slot (and its output, out of place), every
    other rank's part out of that rank's slot into its place."""
    parts = layout(shape)
    off, mine = parts[me]
    writes = [(off * item if shape.in_place else 0, 0, mine * item)] if mine else []
    reads = [(-1, 0, off * item, mine * item)] if mine and not shape.in_place else []
    reads += [(r, 0, o * item, n * item) for r, (o, n) in enumerate(parts) if r != me and n]
    return _planned.pack(writes, reads)
