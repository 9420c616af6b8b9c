"""Rabenseifner all-reduce: reduce-scatter by recursive halving, all-gather by recursive doubling.

Halving: in round k rank r pairs with r XOR (p/2^(k+1)); the pair splits its current range in
two, each sends the half it gives up and reduces the half it keeps. After log2(p) rounds each
rank owns 1/p of the vector, fully reduced by that rank alone. Doubling then exchanges owned
ranges in reverse order until everyone has everything. Non-powers of two fold in first.
Steps: 2 log2(p) (+2). Bytes sent per rank: 2(p-1)/p S.
Cost: 2 log2(p) alpha + 2(p-1)/p S beta + (p-1)/p S gamma: ring's bandwidth with log latency,
so it wins at mid-to-large sizes on many ranks.
"""
from __future__ import annotations

from ..core.schedule import compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil, pow2_floor
from ._fold import fold, fold_cost
from .base import ScheduleAlgorithm


class Rabenseifner(ScheduleAlgorithm):
    name = "rabenseifner"
    collective = "all_reduce"

    def program(self, rank, shape):
        size, count, seg = shape.size, shape.count, shape.seg
        if size == 1 or count == 0:
            return []
        before, after, core, p = fold(rank, size, count, seg)
        halving, doubling = [], []
        if core is not None:
            lo, hi = 0, count
            mask = p >> 1
            while mask:
                partner, mid = core ^ mask, lo + (hi - lo) // 2
                keep, give = ((lo, mid), (mid, hi)) if core < partner else ((mid, hi), (lo, mid))
                halving.append(send_segments(partner, give[0], give[1] - give[0], seg)
                               + recv_segments(partner, keep[0], keep[1] - keep[0], seg, reduce=True))
                # Undo the split in reverse: send what we own, receive what the partner owns.
                doubling.insert(0, send_segments(partner, keep[0], keep[1] - keep[0], seg)
                                + recv_segments(partner, give[0], give[1] - give[0], seg))
                lo, hi = keep
                mask >>= 1
        return compact(before + halving + doubling + after)

    def cost(self, nbytes, net: Network) -> float:
        size, link = net.size, net.link
        p = pow2_floor(size)
        f = (p - 1) / p
        return (2 * log2_ceil(p) * link.alpha + 2 * f * nbytes * link.beta + f * nbytes * link.gamma
                + fold_cost(nbytes, size, link))
