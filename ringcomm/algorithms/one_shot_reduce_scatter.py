"""One-shot reduce-scatter through a shared window: each rank reduces its part out of every slot.

Round i: every rank copies the i-th piece of every other rank's part of its input (q = C/(n-1)
elements of each, fewer or none once a part is done) side by side into its window slot and posts
the round; once all have posted, rank r reduces piece i of part r out of the peers' slots and its
own input, always in rank order (x0 OP x1 OP ...), into its output. Laying each round out across
all parts keeps every rank busy in every round, instead of rank r idling through the rounds of
others' parts; leaving a rank's own part out of its slot saves S/n of copying and, on 2 ranks,
half the rounds.

Bytes per rank: (n-1)/n S written, S read (S = the input size), (n-1)/n S reduced. Cost:
ceil(S (n-1)/n / C) alpha_w + (2n-1)/n S beta_w + (n-1)/n S gamma on the window link.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..core.schedule import largest, layout
from ..selection.cost import Network
from . import _planned
from ._rounds import piece, pieces_of, places, sync
from .base import PlannedAlgorithm


class OneShotReduceScatter(PlannedAlgorithm):
    name = "one_shot"
    collective = "reduce_scatter"

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        sent = nbytes * (n - 1) / n
        return (net.window_rounds(sent) * net.window.alpha + (sent + nbytes) * net.window_beta(nbytes)
                + sent * net.gamma)

    def planned(self, window, src, dst, shape, reducer, word):
        q = places(window, src.itemsize)
        if largest(shape) <= q and reducer.code >= 0 and _planned.usable(window, src, dst):
            return _plan(shape, window.rank, src.itemsize, q), reducer.code
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        me, n = window.rank, window.size
        q = places(window, src.itemsize)
        parts = layout(shape)
        pieces = pieces_of(max(c for _, c in parts), q)
        reduce, combine = reducer.reduce, reducer.combine
        own, mine = parts[me]
        # out may be exactly this rank's part of x: from rank 2 on, the first combine would
        # overwrite that part before the rank-order reduction reaches it, so read a copy then.
        aliased = me >= 2 and mine > 0 and np.may_share_memory(dst, src)
        for i in range(pieces):
            lo = i * q
            slot = window.next_slot(src.dtype, (n - 1) * q)
            for r, (o, c) in enumerate(parts):
                m = min(q, c - lo)
                if m > 0 and r != me:
                    slot[piece(r, me, q, m)] = src[o + lo:o + lo + m]
            k = sync(window, stamp, word, trouble, i, pieces)
            m = min(q, mine - lo)
            if m <= 0:
                continue
            views = window.views(k, src.dtype, (n - 1) * q)
            mine_now = src[own + lo:own + lo + m]
            if aliased:
                mine_now = mine_now.copy()
            operands = [mine_now if w == me else views[w][piece(me, w, q, m)] for w in range(n)]
            out = dst[lo:lo + m]
            combine(out, operands[0], operands[1])   # rank order: x0 OP x1 OP x2 ...
            for r in range(2, n):
                reduce(out, operands[r])


@lru_cache(maxsize=256)
def _plan(shape, me: int, item: int, q: int) -> bytes:
    """One round, compiled: every other rank's part of this rank's input into its place in the
    slot; then this rank's part reduced in rank order out of every peer's slot and its own input
    (read from a copy where the output is that very part: _planned)."""
    parts, n = layout(shape), shape.size
    own, mine = parts[me]
    writes = [(o * item, (r - (r > me)) * q * item, c * item) for r, (o, c) in enumerate(parts) if r != me and c]
    reads = [(-1, own * item, 0, mine * item) if w == me else (w, (me - (me > w)) * q * item, 0, mine * item)
             for w in range(n)] if mine else []
    return _planned.pack(writes, reads)
