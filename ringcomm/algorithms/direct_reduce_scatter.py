"""Direct reduce-scatter: each rank reduces its part straight out of every rank's input.

Round 1 trades input addresses; rank r computes part r as x0 OP x1 OP ... in rank order,
reading its peers' part r in place (window.reader); round 2 says every read is done. Nothing is
staged. Cost: 2 alpha_w + (n-1)/n S (beta_d + gamma) + the reads' alpha_d (S the input).
"""
from __future__ import annotations

from ..core.buffers import address
from ..core.schedule import layout
from ..selection.cost import Network
from ._direct import exchange, reads, reduce_part
from ._rounds import sync
from .base import WindowAlgorithm


class DirectReduceScatter(WindowAlgorithm):
    name = "direct"
    collective = "reduce_scatter"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        part = (n - 1) / n * nbytes
        return 2 * net.window.alpha + reads(part, net, n - 1) + part * net.gamma

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        parts, me = layout(shape), window.rank
        addrs = exchange(window, stamp, word, trouble, (src,), 2)
        o, c = parts[me]
        if c:
            own = src[o:o + c]
            reduce_part(window, reducer, [a[0] for a in addrs], own, dst, o, address(own) == address(dst))
        sync(window, stamp, word, trouble, 1, 2)
