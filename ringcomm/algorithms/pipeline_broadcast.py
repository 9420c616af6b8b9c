"""Pipelined chain broadcast.

Ranks form a chain from the root (v = (r - root) mod n, v receives from v-1 and sends to v+1).
The message moves in segments: in step t a rank receives segment t while forwarding segment t-1.
Steps: n-1 + G for G segments. Bytes sent per rank: S (the last rank sends nothing).
Cost: (n - 2 + G)(alpha + S/G beta): for large S the time approaches S beta, independent of n.
"""
from __future__ import annotations

import math

from ..core.schedule import DEFAULT_SEGMENT_BYTES, Recv, Send, compact, segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


class PipelineBroadcast(ScheduleAlgorithm):
    name = "pipeline"
    collective = "broadcast"

    def program(self, rank, shape):
        size, count, root, seg = shape.size, shape.count, shape.root, shape.seg
        v = (rank - root) % size
        prev, nxt = (rank - 1) % size, (rank + 1) % size
        segs = segments(0, count, seg)
        steps = []
        for t in range(len(segs) + 1):
            ops = []
            if t < len(segs) and v > 0:
                ops.append(Recv(prev, *segs[t]))
            if t and v < size - 1:
                ops.append(Send(nxt, *segs[t - 1]))
            steps.append(ops)
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        size, link = net.size, net.link
        if size == 1:
            return 0.0
        pieces = max(1, math.ceil(nbytes / DEFAULT_SEGMENT_BYTES))
        return (size - 2 + pieces) * (link.alpha + nbytes / pieces * link.beta)
