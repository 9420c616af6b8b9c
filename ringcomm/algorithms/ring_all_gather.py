"""Ring all-gather.

Rank r starts owning part r of the output (even, or the per-rank counts of an uneven call);
after size-1 steps every rank holds every part. In step s rank r sends part (r-s) to r+1 and
receives part (r-s-1) from r-1. Out of place without a copy of the whole: the first step sends
this rank's part straight from the input, and the input is copied into its place in the output
while the transfers run. Bytes sent per rank: (n-1)/n * S (S = the gathered size).
Bandwidth-optimal; n-1 latencies.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, Copy, compact, layout, recv_segments, send_segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


def steps(rank: int, parts: list, seg: int, channel: int = 0, *, own=None) -> list:
    """Ring all-gather of ``parts`` on OUT; ``own`` = (buffer, offset) holding this rank's part
    when it is not yet in OUT (then it is sent from there and copied into OUT in step 0)."""
    size = len(parts)
    right, left = (rank + 1) % size, (rank - 1) % size
    out = []
    for s in range(size - 1):
        send_off, send_n = parts[(rank - s) % size]
        recv_off, recv_n = parts[(rank - s - 1) % size]
        if s == 0 and own is not None:
            ops = [Copy(send_off, send_n, OUT, own[0], own[1])]
            ops += send_segments(right, own[1], send_n, seg, channel, buf=own[0])
        else:
            ops = send_segments(right, send_off, send_n, seg, channel)
        out.append(ops + recv_segments(left, recv_off, recv_n, seg, channel))
    return out


class RingAllGather(ScheduleAlgorithm):
    name = "ring"
    collective = "all_gather"
    out_of_place = True

    def program(self, rank, shape):
        parts = layout(shape)
        own = None if shape.in_place else (IN, 0)
        if shape.size == 1:
            return compact([[Copy(0, parts[0][1], OUT, IN, 0)]] if own else [])
        return compact(steps(rank, parts, shape.seg, own=own))

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return (n - 1) * net.alpha + (n - 1) / n * nbytes * net.beta
