"""Direct scatter: every rank copies its block straight out of the root's x.

Round 1 trades addresses (only the root's is used); rank r reads block r of the root's x in
place (window.reader), the root copies its own; round 2 says every read is done, so the root
may return. One copy per byte. Cost: 2 alpha_w + alpha_d + S/n beta_d (S the root's x; the
ranks read their blocks at once, each on its own core).
"""
from __future__ import annotations

from ..selection.cost import Network
from ._direct import exchange, reads
from ._rounds import sync
from .base import WindowAlgorithm


class DirectScatter(WindowAlgorithm):
    name = "direct"
    collective = "scatter"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        return 2 * net.window.alpha + reads(nbytes / net.size, net)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        count, root, me = shape.count, shape.root, window.rank
        addrs = exchange(window, stamp, word, trouble, (dst if src is None else src,), 2)
        if count:
            if me == root:
                dst[...] = src[me * count:(me + 1) * count]
            else:
                window.reader(root, addrs[root][0] + me * count * dst.itemsize, dst)
        sync(window, stamp, word, trouble, 1, 2)
