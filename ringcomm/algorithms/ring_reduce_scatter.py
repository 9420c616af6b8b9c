"""Ring reduce-scatter.

W is split into ``size`` chunks; rank r ends owning chunk r reduced over all ranks.
Steps: size-1. In step s rank r sends chunk (r-s-1) to r+1 and reduces chunk (r-s-2) from r-1,
so chunk c starts at rank c+1 and travels the ring once, reduced in the fixed order
c+1, c+2, ..., c: one owner computes each element.
Bytes sent per rank: (n-1)/n * S. Segments of one chunk pipeline the transfer with the reduce.
Wins for large messages; latency grows linearly with n.
"""
from __future__ import annotations

from ..core.schedule import chunk, compact, recv_segments, send_segments
from ..selection.cost import Link
from .base import Algorithm


def steps(rank: int, size: int, count: int, seg: int, channel: int = 0) -> list:
    right, left = (rank + 1) % size, (rank - 1) % size
    out = []
    for s in range(size - 1):
        send_off, send_n = chunk(count, size, (rank - s - 1) % size)
        recv_off, recv_n = chunk(count, size, (rank - s - 2) % size)
        out.append(send_segments(right, send_off, send_n, seg, channel)
                   + recv_segments(left, recv_off, recv_n, seg, channel, reduce=True))
    return out


class RingReduceScatter(Algorithm):
    name = "ring"
    collective = "reduce_scatter"

    def program(self, rank, size, count, root, seg):
        return compact(steps(rank, size, count, seg))

    def cost(self, nbytes, size, link: Link) -> float:
        # nbytes is the input size (size * output).
        return (size - 1) * link.alpha + (size - 1) / size * nbytes * (link.beta + link.gamma)
