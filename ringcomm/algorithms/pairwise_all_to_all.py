"""Pairwise-exchange all-to-all.

In step k (k = 1..n-1) rank r sends its block for rank r+k and receives the block rank r-k has
for it; its own block is copied locally while the first step's transfers run. Every pair of
ranks meets in exactly one step, each rank sends to one peer and receives from one per step, so
no link is ever contended. Blocks may differ in size (uneven splits); each comes straight out of
the input and lands straight in the output, in segments.
Steps: n-1. Bytes sent per rank: (n-1)/n S (S = its whole input). Cost: (n-1) alpha + (n-1)/n S beta.
Bandwidth-optimal; its n-1 latencies make it lose to Bruck for small blocks on many ranks.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network
from .base import ScheduleAlgorithm


def offsets(counts: tuple) -> list:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


class PairwiseAllToAll(ScheduleAlgorithm):
    name = "pairwise"
    collective = "all_to_all"
    out_of_place = True

    def program(self, rank, shape):
        n, seg = shape.size, shape.seg
        sends, recvs = shape.counts, shape.recv_counts
        soff, roff = offsets(sends), offsets(recvs)
        steps = [[Copy(roff[rank], recvs[rank], OUT, IN, soff[rank])] if recvs[rank] else []]
        for k in range(1, n):
            to, frm = (rank + k) % n, (rank - k) % n
            ops = send_segments(to, soff[to], sends[to], seg, buf=IN) + recv_segments(frm, roff[frm], recvs[frm], seg)
            if k == 1:
                ops = steps.pop() + ops   # the own block moves while the first exchange runs
            steps.append(ops)
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return (n - 1) * net.alpha + (n - 1) / n * nbytes * net.beta
