"""Ring all-reduce: ring reduce-scatter, then ring all-gather of the reduced parts.

Steps: 2(n-1). Bytes sent per rank: 2(n-1)/n * S; bytes reduced per rank: (n-1)/n * S.
Cost: 2(n-1) alpha + 2(n-1)/n S beta + (n-1)/n S gamma. Bandwidth-optimal, so it wins for
large messages; its latency term grows with n, so trees and recursive doubling win small ones.
Each part is reduced by one rank in ring order and then copied verbatim: identical bits everywhere.
Out of place without a copy: the first step sends from the input and every reduction reads its
own operand from the input and writes the output.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, Copy, compact, layout
from ..selection.cost import Network
from . import ring_all_gather, ring_reduce_scatter
from .base import ScheduleAlgorithm


class RingAllReduce(ScheduleAlgorithm):
    name = "ring"
    collective = "all_reduce"
    out_of_place = True

    def program(self, rank, shape):
        if shape.count == 0:
            return []
        if shape.size == 1:
            return [] if shape.in_place else compact([[Copy(0, shape.count, OUT, IN, 0)]])
        parts = layout(shape._replace(counts=None))
        rs = ring_reduce_scatter.steps(rank, parts, shape.seg, own=None if shape.in_place else IN)
        # After the reduce-scatter this rank's part r is reduced, in OUT: the all-gather starts there.
        return compact(rs + ring_all_gather.steps(rank, parts, shape.seg))

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        f = (n - 1) / n
        return 2 * (n - 1) * net.alpha + 2 * f * nbytes * net.beta + f * nbytes * net.gamma
