"""One-shot gather through a shared window: every rank posts its block, the root copies them all.

Each round every non-root copies the next piece of its x into its window slot and posts the
round; once all have posted, the root copies every other rank's piece into its place in the
output (its own block goes there straight from its x). A rank rewrites a slot only two rounds
later, after the root posted the round in between, which it did after reading: no
acknowledgement needed. A call that fits one round runs in the compiled core (_planned.py).

Bytes: S/n written per non-root, (n-1)/n S read by the root (S the gathered size). Cost:
ceil(S/(n C)) alpha_w + S beta_w on the window link. It beats the direct gather's address round
and system call for small blocks; the direct gather's writes, every rank on its own core, win
for large ones.
"""
from __future__ import annotations

from functools import lru_cache

from ..selection.cost import Network
from . import _planned
from ._rounds import pieces_of, sync
from .base import PlannedAlgorithm


class OneShotGather(PlannedAlgorithm):
    name = "one_shot"
    collective = "gather"

    def seconds(self, nbytes, net: Network) -> float:
        return net.window_rounds(nbytes / net.size) * net.window.alpha + nbytes * net.window.beta

    def planned(self, window, src, dst, shape, reducer, word):
        if shape.count * src.itemsize <= window.capacity and _planned.usable(window, src, dst):
            return _plan(window.rank, shape.root, window.size, shape.count * src.itemsize), _planned.COPY
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        count, root, me = shape.count, shape.root, window.rank
        if me == root:
            dst[me * count:(me + 1) * count] = src
        per = window.capacity // src.itemsize
        pieces = pieces_of(count, per)
        for i in range(pieces):
            lo = i * per
            m = min(per, count - lo)
            if me != root:
                window.next_slot(src.dtype, m)[...] = src[lo:lo + m]
            k = sync(window, stamp, word, trouble, i, pieces)
            if me == root:
                slots = window.views(k, src.dtype, m)
                for r in range(window.size):
                    if r != root:
                        dst[r * count + lo:r * count + lo + m] = slots[r]


@lru_cache(maxsize=256)
def _plan(me: int, root: int, n: int, block: int) -> bytes:
    """One round, compiled: a non-root's block into its slot; the root's own block from its x and
    every other block out of its owner's slot, into place."""
    if me != root:
        return _planned.pack([(0, 0, block)], [])
    return _planned.pack([], [(-1, 0, me * block, block)] + [(r, 0, r * block, block) for r in range(n) if r != root])
