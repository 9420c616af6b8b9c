"""Direct broadcast: every rank copies the root's x straight out of the root's memory.

Round 1 trades addresses (only the root's is used); the others read the root's x in place
(window.reader); round 2 says every read is done, so the root may return. One copy per rank, no
staging. Cost: 2 alpha_w + alpha_d + S beta_d (the non-roots read at once, each on its own core).
"""
from __future__ import annotations

from ..selection.cost import Network
from ._direct import exchange, reads
from ._rounds import sync
from .base import WindowAlgorithm


class DirectBroadcast(WindowAlgorithm):
    name = "direct"
    collective = "broadcast"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        return 2 * net.window.alpha + reads(nbytes, net)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        root = shape.root
        addrs = exchange(window, stamp, word, trouble, (dst,), 2)
        if window.rank != root:
            window.reader(root, addrs[root][0], dst)
        sync(window, stamp, word, trouble, 1, 2)
