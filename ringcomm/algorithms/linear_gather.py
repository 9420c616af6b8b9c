"""Linear gather: every rank sends its block straight to the root.

The root posts one receive per peer at once (straight into its output) and copies its own block
meanwhile. Steps: 1. The root's link carries (n-1)/n S (S = the gathered size) and every message
pays one latency at the root: Cost: (n-1) alpha + (n-1)/n S beta. Fine for few ranks or large
blocks (the root's link is the bottleneck either way); binomial wins small blocks on many ranks.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


class LinearGather(ScheduleAlgorithm):
    name = "linear"
    collective = "gather"
    out_of_place = True
    even_only = True

    def program(self, rank, shape):
        n, m, root, seg = shape.size, shape.count, shape.root, shape.seg
        if rank != root:
            return compact([send_segments(root, 0, m, seg, buf=IN)])
        ops = [Copy(root * m, m, OUT, IN, 0)]
        for peer in range(n):
            if peer != root:
                ops += recv_segments(peer, peer * m, m, seg)
        return compact([ops])

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return (n - 1) * net.alpha + (n - 1) / n * nbytes * net.beta
