"""Ring all-gather.

Rank r starts owning chunk r of W; after size-1 steps every rank holds every chunk.
In step s rank r sends chunk (r-s) to r+1 and receives chunk (r-s-1) from r-1.
Bytes sent per rank: (n-1)/n * S (S = the gathered size). Bandwidth-optimal; n-1 latencies.
"""
from __future__ import annotations

from ..core.schedule import chunk, compact, recv_segments, send_segments
from ..selection.cost import Link
from .base import Algorithm


def steps(rank: int, size: int, count: int, seg: int, channel: int = 0) -> list:
    right, left = (rank + 1) % size, (rank - 1) % size
    out = []
    for s in range(size - 1):
        send_off, send_n = chunk(count, size, (rank - s) % size)
        recv_off, recv_n = chunk(count, size, (rank - s - 1) % size)
        out.append(send_segments(right, send_off, send_n, seg, channel)
                   + recv_segments(left, recv_off, recv_n, seg, channel))
    return out


class RingAllGather(Algorithm):
    name = "ring"
    collective = "all_gather"

    def program(self, rank, size, count, root, seg):
        return compact(steps(rank, size, count, seg))

    def cost(self, nbytes, size, link: Link) -> float:
        return (size - 1) * link.alpha + (size - 1) / size * nbytes * link.beta
