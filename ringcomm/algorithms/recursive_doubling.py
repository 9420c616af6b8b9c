"""Recursive doubling all-reduce.

In round k (k = 0..log2(p)-1) rank r exchanges its whole vector with r XOR 2^k and both reduce.
Both sides compute lower OP higher (the lower rank's vector first: the higher one reduces with
the message first), so the pair holds identical bits, and by induction so does every group of
2^k ranks. Commutative is not enough: bitwise, maximum(-0.0, 0.0) and a sum of two different
NaNs return their first operand, and with own-data-first the pair once ended -0.0 and 0.0.
Non-powers of two fold in first (see _fold).
Steps: log2(p) (+2). Bytes sent per rank: S log2(p). Cost: log2(p) (alpha + S beta + S gamma).
Fewest latencies of all, so it wins for tiny messages; it moves S per round, so it loses on big ones.
"""
from __future__ import annotations

from ..core.schedule import compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil, pow2_floor
from ._fold import fold, fold_cost
from .base import ScheduleAlgorithm


class RecursiveDoubling(ScheduleAlgorithm):
    name = "recursive_doubling"
    collective = "all_reduce"

    def program(self, rank, shape):
        size, count, seg = shape.size, shape.count, shape.seg
        if size == 1 or count == 0:
            return []
        before, after, core, p = fold(rank, size, count, seg)
        rounds = []
        if core is not None:
            mask = 1
            while mask < p:
                partner = core ^ mask
                rounds.append(send_segments(partner, 0, count, seg)
                              + recv_segments(partner, 0, count, seg, reduce=True, first=partner < core))
                mask <<= 1
        return compact(before + rounds + after)

    def cost(self, nbytes, net: Network) -> float:
        size, link = net.size, net.link
        rounds = log2_ceil(pow2_floor(size))
        return rounds * (link.alpha + nbytes * (link.beta + link.gamma)) + fold_cost(nbytes, size, link)
