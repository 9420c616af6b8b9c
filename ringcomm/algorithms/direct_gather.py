"""Direct gather: the root copies every rank's x straight out of that rank's memory.

Round 1 trades the addresses of every rank's x; the root reads each peer's block in place
(window.reader) into its output and copies its own; round 2 says the root's reads are done, so
the others may return. One copy per byte, no staging, no confirmation barrier (every round
checks every rank's stamp and root). Cost: 2 alpha_w + (n-1) alpha_d + (n-1)/n S beta_d (S the
gathered size, read by the root alone).
"""
from __future__ import annotations

from ..selection.cost import Network
from ._direct import exchange, reads
from ._rounds import sync
from .base import WindowAlgorithm


class DirectGather(WindowAlgorithm):
    name = "direct"
    collective = "gather"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        count, root = shape.count, shape.root
        addrs = exchange(window, stamp, word, trouble, (src,), 2)
        if window.rank == root and count:
            for r in range(window.size):
                block = dst[r * count:(r + 1) * count]
                if r == root:
                    block[...] = src
                else:
                    window.reader(r, addrs[r][0], block)
        sync(window, stamp, word, trouble, 1, 2)
