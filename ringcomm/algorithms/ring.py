"""Ring all-reduce: ring reduce-scatter, then ring all-gather of the reduced chunks.

Steps: 2(n-1). Bytes sent per rank: 2(n-1)/n * S; bytes reduced per rank: (n-1)/n * S.
Cost: 2(n-1) alpha + 2(n-1)/n S beta + (n-1)/n S gamma. Bandwidth-optimal, so it wins for
large messages; its latency term grows with n, so trees and recursive doubling win small ones.
Each chunk is reduced by one rank in ring order and then copied verbatim: identical bits everywhere.
"""
from __future__ import annotations

from ..core.schedule import compact
from ..selection.cost import Link
from . import ring_all_gather, ring_reduce_scatter
from .base import Algorithm


class RingAllReduce(Algorithm):
    name = "ring"
    collective = "all_reduce"

    def program(self, rank, size, count, root, seg):
        return compact(ring_reduce_scatter.steps(rank, size, count, seg)
                       + ring_all_gather.steps(rank, size, count, seg))

    def cost(self, nbytes, size, link: Link) -> float:
        f = (size - 1) / size
        return 2 * (size - 1) * link.alpha + 2 * f * nbytes * link.beta + f * nbytes * link.gamma
