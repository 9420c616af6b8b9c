"""One-shot reduce-scatter through a shared window: each rank reduces its part out of every slot.

Round i: every rank copies the i-th piece of every rank's part of its input (q = C/n elements
of each, fewer or none once a part is done) side by side into its window slot and posts the
round; once all have posted, rank r reduces piece i of part r straight out of the slots, always
in rank order (x0 OP x1 OP ...), into its output. Laying each round out across all parts keeps
every rank busy in every round, instead of rank r idling through the rounds of others' parts.

Bytes per rank: S written, S read (S = the input size), (n-1)/n S reduced. Cost: ceil(S/C)
alpha_w + 2 S beta_w + (n-1)/n S gamma on the window link.
"""
from __future__ import annotations

import math

from ..core.schedule import layout
from ..selection.cost import Network
from ._rounds import pieces_of, sync
from .base import WindowAlgorithm


class OneShotReduceScatter(WindowAlgorithm):
    name = "one_shot"
    collective = "reduce_scatter"

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return (math.ceil(nbytes / net.window_bytes) * net.window.alpha + 2 * nbytes * net.window.beta
                + (n - 1) / n * nbytes * net.gamma)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        parts, me, n = layout(shape), window.rank, window.size
        q = max(1, window.capacity // src.itemsize // n)
        pieces = pieces_of(max(c for _, c in parts), q)
        reduce, combine = reducer.reduce, reducer.combine
        mine = parts[me][1]
        for i in range(pieces):
            lo = i * q
            slot = window.next_slot(src.dtype, n * q)
            for r, (o, c) in enumerate(parts):
                m = min(q, c - lo)
                if m > 0:
                    slot[r * q:r * q + m] = src[o + lo:o + lo + m]
            k = sync(window, stamp, word, trouble, i, pieces)
            m = min(q, mine - lo)
            if m <= 0:
                continue
            slots = [s[me * q:me * q + m] for s in window.views(k, src.dtype, n * q)]
            out = dst[lo:lo + m]
            combine(out, slots[0], slots[1])   # rank order: x0 OP x1 OP x2 ...
            for r in range(2, n):
                reduce(out, slots[r])
