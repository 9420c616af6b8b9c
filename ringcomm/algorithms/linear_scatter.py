"""Linear scatter: the root sends every rank its block directly.

The root posts one send per peer at once (straight out of its input) and copies its own block
meanwhile. Steps: 1. Cost: (n-1) alpha + (n-1)/n S beta (S = the root's whole input).
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


class LinearScatter(ScheduleAlgorithm):
    name = "linear"
    collective = "scatter"
    out_of_place = True
    even_only = True

    def program(self, rank, shape):
        n, m, root, seg = shape.size, shape.count, shape.root, shape.seg
        if rank != root:
            return compact([recv_segments(root, 0, m, seg)])
        ops = [Copy(0, m, OUT, IN, root * m)]
        for peer in range(n):
            if peer != root:
                ops += send_segments(peer, peer * m, m, seg, buf=IN)
        return compact([ops])

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return (n - 1) * net.alpha + (n - 1) / n * nbytes * net.beta
