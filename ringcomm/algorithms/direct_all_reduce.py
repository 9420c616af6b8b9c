"""Direct all-reduce: each rank reduces its part straight out of every rank's buffer, then reads
the other reduced parts straight out of their owners' outputs.

Round 1 trades buffer addresses. Rank r then computes part r as x0 OP x1 OP ... in rank order,
reading its peers' part r in place (window.reader), and writes it into its own output. Round 2
says every part is reduced; rank r copies every other part from its owner's output. Round 3 says
every read is done. Each part is reduced once, by its owner, and copied bit for bit to everyone:
every rank ends with the same bits. In place works too: rank r writes only part r of its buffer,
which no peer reads before round 2.

Bytes per rank: (n-1)/n S read and reduced, (n-1)/n S read again: about 2.5 S of memory traffic
on 2 ranks (S the vector), against 3 S for a local ``x += y``. Cost: 3 alpha_w + (n-1)/n S
(2 beta_d + gamma) + the reads' alpha_d.
"""
from __future__ import annotations

from ..core.schedule import chunk
from ..selection.cost import Network
from ._direct import exchange, reads, reduce_part
from ._rounds import sync
from .base import WindowAlgorithm


class DirectAllReduce(WindowAlgorithm):
    name = "direct"
    collective = "all_reduce"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        part = (n - 1) / n * nbytes
        return 3 * net.window.alpha + 2 * reads(part, net, n - 1) + part * net.gamma

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        n, me, item = window.size, window.rank, dst.itemsize
        addrs = exchange(window, stamp, word, trouble, (src, dst), 3)
        o, c = chunk(dst.size, n, me)
        if c:
            reduce_part(window, reducer, [a[0] for a in addrs], src[o:o + c], dst[o:o + c], o, src is dst)
        sync(window, stamp, word, trouble, 1, 3)
        for r in range(n):
            o, c = chunk(dst.size, n, r)
            if r != me and c:
                window.reader(r, addrs[r][1] + o * item, dst[o:o + c])
        sync(window, stamp, word, trouble, 2, 3)
