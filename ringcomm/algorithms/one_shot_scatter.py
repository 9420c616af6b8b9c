"""One-shot scatter through a shared window: the root posts every block, each rank copies its own.

Each round the root lays the next piece of every other rank's block side by side in its slot
(q = C/(n-1) elements each, its own left out) and posts the round; once all have posted, every
other rank copies its piece out of the root's slot (the root's own block goes to its output
straight from its x). A call that fits one round runs in the compiled core (_planned.py).

Bytes: (n-1)/n S written by the root, S/n read per non-root (S the root's x). Cost:
ceil(S (n-1)/n / C) alpha_w + S beta_w on the window link, the mirror of one-shot gather.
"""
from __future__ import annotations

from functools import lru_cache

from ..selection.cost import Network
from . import _planned
from ._rounds import piece, pieces_of, places, sync
from .base import PlannedAlgorithm


class OneShotScatter(PlannedAlgorithm):
    name = "one_shot"
    collective = "scatter"

    def seconds(self, nbytes, net: Network) -> float:
        return net.window_rounds(nbytes * (net.size - 1) / net.size) * net.window.alpha + nbytes * net.window.beta

    def planned(self, window, src, dst, shape, reducer, word):
        q = places(window, dst.itemsize)
        if shape.count <= q and _planned.usable(window, src, dst):
            return _plan(window.rank, shape.root, window.size, shape.count * dst.itemsize, q * dst.itemsize), \
                _planned.COPY
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        count, root, me, n = shape.count, shape.root, window.rank, window.size
        if me == root:
            dst[...] = src[me * count:(me + 1) * count]
        q = places(window, dst.itemsize)
        pieces = pieces_of(count, q)
        for i in range(pieces):
            lo = i * q
            m = min(q, count - lo)
            if me == root:
                slot = window.next_slot(dst.dtype, (n - 1) * q)
                for r in range(n):
                    if r != root:
                        slot[piece(r, root, q, m)] = src[r * count + lo:r * count + lo + m]
            k = sync(window, stamp, word, trouble, i, pieces)
            if me != root:
                dst[lo:lo + m] = window.views(k, dst.dtype, (n - 1) * q)[root][piece(me, root, q, m)]


@lru_cache(maxsize=256)
def _plan(me: int, root: int, n: int, block: int, place: int) -> bytes:
    """One round, compiled: the root's blocks for the others into their places in its slot and its
    own from its x; a non-root's block out of its place in the root's slot."""
    if me == root:
        return _planned.pack([(r * block, (r - (r > root)) * place, block) for r in range(n) if r != root],
                             [(-1, me * block, 0, block)])
    return _planned.pack([], [(root, (me - (me > root)) * place, 0, block)])
