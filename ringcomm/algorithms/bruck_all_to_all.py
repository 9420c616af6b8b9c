"""Bruck all-to-all (Bruck, Ho, Kipnis, Upfal, Weathersby, 1997), for blocks of equal size.

1. Rank r rotates its input locally so that block i is the one for rank r+i.
2. In round k (k = 0..ceil(log2 n)-1) it packs every block whose index has bit k set, sends the
   pack to rank r + 2^k, and unpacks what rank r - 2^k sent into the same block positions. A
   block for rank r+i thus travels i in hops of its set bits and arrives at index i.
3. Block i of rank r then came from rank r-i: an inverse rotation puts it into the output.
Steps: ceil(log2 n). Bytes sent per rank: about S/2 per round; plus about 2 S of local copies.
Cost: ceil(log2 n)(alpha + S/2 beta) + 2 S gamma (the local passes): few latencies, so it wins small blocks on
many ranks; pairwise exchange wins once the blocks are large.
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, TMP, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm


class BruckAllToAll(ScheduleAlgorithm):
    name = "bruck"
    collective = "all_to_all"
    out_of_place = True
    even_only = True

    def program(self, rank, shape):
        n, m, seg = shape.size, shape.counts[0], shape.seg
        if m == 0:
            return []
        if n == 1:
            return compact([[Copy(0, m, OUT, IN, 0)]])
        rounds = []
        dist = 1
        while dist < n:
            rounds.append([i for i in range(1, n) if i & dist])
            dist <<= 1
        send_at = n * m                                  # TMP: [rotated blocks | send pack | recv pack]
        recv_at = send_at + max(len(b) for b in rounds) * m
        head = (n - rank) * m                            # rotation: TMP block i = IN block (r + i) % n
        ops = [Copy(0, head, TMP, IN, rank * m), Copy(head, rank * m, TMP, IN, 0)]
        steps, previous, dist = [], [], 1
        for blocks in rounds:
            ops += [Copy(i * m, m, TMP, TMP, recv_at + j * m) for j, i in enumerate(previous)]   # unpack
            ops += [Copy(send_at + j * m, m, TMP, TMP, i * m) for j, i in enumerate(blocks)]      # pack
            ops += send_segments((rank + dist) % n, send_at, len(blocks) * m, seg, buf=TMP)
            ops += recv_segments((rank - dist) % n, recv_at, len(blocks) * m, seg, buf=TMP)
            steps.append(ops)
            ops, previous, dist = [], blocks, dist << 1
        ops += [Copy(i * m, m, TMP, TMP, recv_at + j * m) for j, i in enumerate(previous)]
        ops += [Copy(j * m, m, OUT, TMP, ((rank - j) % n) * m) for j in range(n)]   # inverse rotation
        steps.append(ops)
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        if n == 1:
            return nbytes * net.gamma
        rounds = log2_ceil(n)
        return rounds * (net.alpha + nbytes / 2 * net.beta) + 2 * nbytes * net.gamma
