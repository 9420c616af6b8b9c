"""Direct all-gather: every rank copies every other rank's part straight out of that rank's
memory into its own output.

Round 1 trades the addresses of each rank's part (its input, or its place in its output when in
place); each rank then reads every other part in place (window.reader); round 2 says every read
is done. One copy per byte. Cost: 2 alpha_w + (n-1) alpha_d + (n-1)/n S beta_d (S gathered).
"""
from __future__ import annotations

from ..core.schedule import layout
from ..selection.cost import Network
from ._direct import exchange, reads
from ._rounds import sync
from .base import WindowAlgorithm


class DirectAllGather(WindowAlgorithm):
    name = "direct"
    collective = "all_gather"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        parts, me = layout(shape), window.rank
        off, mine = parts[me]
        own = src[off:off + mine] if shape.in_place else src
        addrs = exchange(window, stamp, word, trouble, (own,), 2)
        if not shape.in_place and mine:
            dst[off:off + mine] = own
        for r, (o, c) in enumerate(parts):
            if r != me and c:
                window.reader(r, addrs[r][0], dst[o:o + c])
        sync(window, stamp, word, trouble, 1, 2)
