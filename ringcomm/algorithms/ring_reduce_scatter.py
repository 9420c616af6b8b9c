"""Ring reduce-scatter.

The vector is split into parts (even, or the per-rank counts of an uneven call); rank r ends
owning part r reduced over all ranks. Steps: size-1. In step s rank r sends part (r-s-1) to r+1
and reduces part (r-s-2) from r-1, so part c starts at rank c+1 and travels the ring once,
reduced in the fixed order c+1, c+2, ..., c: one owner computes each element.
Bytes sent per rank: (n-1)/n * S. Segments of one part pipeline the transfer with the reduce.
Out of place without a copy: the first step sends straight from the input, partial results go
to scratch (TMP), and the last reduction writes the output. Wins for large messages; latency
grows linearly with n.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, TMP, Copy, compact, layout, recv_segments, send_segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


def steps(rank: int, parts: list, seg: int, channel: int = 0, *, acc: int = OUT, own=None,
          last=None) -> list:
    """Ring reduce-scatter of ``parts`` [(offset, length) per rank] on ``acc`` (partials at the
    parts' offsets). ``own``: the buffer holding this rank's operands when it is not ``acc``;
    ``last``: (buffer, offset) where this rank's own part lands, when not in ``acc``."""
    size = len(parts)
    right, left = (rank + 1) % size, (rank - 1) % size
    out = []
    for s in range(size - 1):
        send_off, send_n = parts[(rank - s - 1) % size]
        recv_off, recv_n = parts[(rank - s - 2) % size]
        source = own if (s == 0 and own is not None) else acc
        dst, dst_off = (last if (s == size - 2 and last is not None) else (acc, recv_off))
        out.append(send_segments(right, send_off, send_n, seg, channel, buf=source)
                   + recv_segments(left, dst_off, recv_n, seg, channel, reduce=True, buf=dst,
                                   own=own, own_off=recv_off if own is not None else None))
    return out


class RingReduceScatter(ScheduleAlgorithm):
    name = "ring"
    collective = "reduce_scatter"
    out_of_place = True

    def program(self, rank, shape):
        parts = layout(shape)
        off, n = parts[rank]
        if shape.size == 1:
            return compact([[Copy(0, n, OUT, IN, off)]])
        return compact(steps(rank, parts, shape.seg, acc=TMP, own=IN, last=(OUT, 0)))

    def cost(self, nbytes, net: Network) -> float:
        # nbytes is the input size (size * output).
        n = net.size
        return (n - 1) * net.alpha + (n - 1) / n * nbytes * (net.beta + net.gamma)
