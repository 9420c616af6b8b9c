"""Direct all-to-all: every rank copies the block each peer holds for it straight out of that
peer's input.

Round 1: each rank posts the address of its x and, per destination, where that destination's
block starts and how long it is (uneven splits included), and copies its own block while its
peers post theirs. Rank r then reads from every peer j the block j holds for r (window.reader)
into its place in r's output, after checking that j's length is the one r expects (a
disagreement is a MismatchError, never a short read). Round 2 says every read is done. One copy
per byte, no staging, every pair at once. Cost: 2 alpha_w + (n-1) alpha_d + (n-1)/n S beta_d
(S a rank's input).
"""
from __future__ import annotations

from ..core.buffers import address
from ..errors import MismatchError
from ..selection.cost import Network
from ._direct import exchange_words, reads
from ._rounds import sync
from .base import WindowAlgorithm
from .pairwise_all_to_all import offsets


class DirectAllToAll(WindowAlgorithm):
    name = "direct"
    collective = "all_to_all"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def has_work(self, shape) -> bool:
        return True   # counts differ per rank: a rank with nothing to move still takes part

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        n, me, item = window.size, window.rank, dst.itemsize
        sends, recvs = shape.counts, shape.recv_counts
        soff, roff = offsets(sends), offsets(recvs)
        if sends[me] != recvs[me]:
            raise MismatchError(f"all_to_all on rank {me}: this rank's block to itself has {sends[me]} "
                                f"elements in x and {recvs[me]} in out")
        table = [address(src)] + [v for pair in zip(soff, sends) for v in pair]

        def own_block():   # needs no peer: copied while they post their addresses, not after
            # (a 1 MiB call on 2 ranks spent 9 us waiting there, and 21 copying)
            dst[roff[me]:roff[me] + recvs[me]] = src[soff[me]:soff[me] + sends[me]]
        slots = exchange_words(window, stamp, word, trouble, table, 2, meanwhile=own_block)
        for j in range(n):
            theirs = slots[j][2 + 2 * me]
            if theirs != recvs[j]:
                raise MismatchError(f"all_to_all on rank {me}: rank {j} sends {theirs} elements to this rank, "
                                    f"which expects {recvs[j]} from it (out_splits)")
            if theirs and j != me:
                window.reader(j, slots[j][0] + slots[j][1 + 2 * me] * item, dst[roff[j]:roff[j] + theirs])
        sync(window, stamp, word, trouble, 1, 2)


