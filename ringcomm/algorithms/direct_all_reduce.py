"""Direct all-reduce: each rank reduces its part straight out of every rank's buffer and writes
it straight into every rank's output.

Round 1 trades buffer addresses. Rank r then computes part r as x0 OP x1 OP ... in rank order,
reading its peers' part r in place (window.reader) a chunk at a time, writes the chunk into its
own output and, while it is still in cache, into every peer's output (window.writer). Round 2
says every write is done; only then may a rank return (its buffers may change after). Each part
is reduced once, by its owner, and copied bit for bit to everyone: every rank ends with the same
bits. In place works too: only rank r reads or writes part r of anyone's buffer, and it writes a
chunk only after it has read that chunk from every rank.

Writing the reduced chunk while it is hot, instead of letting each peer read the whole reduced
part back afterwards (the first version: three rounds), saves a read of (n-1)/n S from memory
per rank and a round. 2 ranks, three alternating launches each way
(`allreduce_perf.py --algorithm direct`): 64 MiB 6.9-7.9 ms -> 4.8-5.4 ms, 256 MiB 22-27 ms ->
18-24 ms; in a state of the VM where reading a peer's freshly written memory was slow, 4 MiB
0.98-1.00 ms -> 0.39-0.42 ms.

Bytes per rank: (n-1)/n S read and reduced, (n-1)/n S written to peers from cache: about 2 S of
memory traffic on 2 ranks (S the vector), against 3 S for a local ``x += y``. Cost: 2 alpha_w +
(n-1)/n S (2 beta_d + gamma) + the reads' and writes' alpha_d.
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
        return 2 * net.window.alpha + 2 * reads(part, net, n - 1) + part * net.gamma   # writes priced as reads

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        n, me = window.size, window.rank
        addrs = exchange(window, stamp, word, trouble, (src, dst), 2)
        o, c = chunk(dst.size, n, me)
        if c:
            reduce_part(window, reducer, [a[0] for a in addrs], src[o:o + c], dst[o:o + c], o, src is dst,
                        outputs=[a[1] for a in addrs])
        sync(window, stamp, word, trouble, 1, 2)
