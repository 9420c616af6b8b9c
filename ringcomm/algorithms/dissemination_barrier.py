"""Dissemination barrier (Hensgen, Finkel, Manber).

In round k rank r sends an empty message to r + 2^k and waits for one from r - 2^k. After
ceil(log2 n) rounds every rank has heard, transitively, from every other, so none can leave
before all have entered. Cost: ceil(log2 n) alpha; no bytes.
"""
from __future__ import annotations

from ..core.schedule import Recv, Send, compact
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm


class DisseminationBarrier(ScheduleAlgorithm):
    name = "dissemination"
    collective = "barrier"

    def program(self, rank, shape):
        size = shape.size
        steps, dist = [], 1
        while dist < size:
            steps.append([Send((rank + dist) % size, 0, 0), Recv((rank - dist) % size, 0, 0)])
            dist <<= 1
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        return log2_ceil(net.size) * net.alpha
