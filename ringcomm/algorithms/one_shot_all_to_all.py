"""One-shot all-to-all through a shared window: each rank lays the blocks for its peers side by
side in its slot, and every rank copies its own block out of every slot.

Round i: every rank copies the i-th piece (q = C/(n-1) elements) of each block it sends to a
peer into that peer's place in its window slot (rank order, its own left out, as in the one-shot
reduce-scatter) and posts the round; once all have posted, rank r copies piece i of its block
out of every peer's slot into its output. Its own block goes from input to output in one copy.

Why it is here beside the direct all-to-all (one CMA read per block): on a cache-sized call two
memcpys beat one process_vm_readv, which pins every page it reads and copies at about a quarter
of memcpy's speed on the machines measured (docs/performance.md, round nine).

An uneven call first trades every rank's row of the split matrix (one round of n words), so that
a block of another length than its receiver expects is a MismatchError on the receiver, never a
short or overlong copy; an even call needs no such round (the stamp carries the block length).

Bytes per rank: (n-1)/n S written, (n-1)/n S read, S/n copied (S = a rank's input). Cost:
ceil(S (n-1)/n / C) alpha_w + 2 (n-1)/n S beta_w on the window link, beta_w from cache while
every rank's input fits in half of it (Network.window_beta: since its rounds run compiled,
one_shot measured 0.6-0.9x direct's time at 1-8 MiB on 2 ranks; the own block's copy, which
the direct all-to-all makes too, is left out of both, as it decides nothing between them).
Not on a host whose reads are fast (Network.fast_reads): there the two ranks' copies through
the window, both ways at once, ran no faster than all_gather's one_shot, which moves the same
bytes and is priced plainly, and lost to direct from 1 MiB (2 ranks, Intel Xeon: 1 MiB 134 us
against 92, 4 MiB 526 against 419, 16 MiB 1931 against 1363; docs/selection.md).
"""
from __future__ import annotations

from functools import lru_cache

from ..core.envelope import word_detail
from ..selection.cost import Network
from . import _planned
from ._direct import exchange_words
from ._rounds import piece, pieces_of, places, sync
from .base import PlannedAlgorithm
from .pairwise_all_to_all import offsets


class OneShotAllToAll(PlannedAlgorithm):
    name = "one_shot"
    collective = "all_to_all"

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        sent = nbytes * (n - 1) / n
        beta = net.window.beta if net.fast_reads else net.window_beta(nbytes)
        return net.window_rounds(sent) * net.window.alpha + 2 * sent * beta

    def has_work(self, shape) -> bool:
        return True   # counts differ per rank: a rank with nothing to move still takes part

    def planned(self, window, src, dst, shape, reducer, word):
        # Even calls only (word 0, or only a large count's top (envelope.count_word): no splits
        # passed; an uneven call trades its splits in a round of its own first), whose blocks fit
        # one round: q elements per peer.
        q = places(window, src.itemsize)
        if word_detail(word) == 0 and shape.counts[0] <= q and _planned.usable(window, src, dst):
            return _plan(shape, window.rank, src.itemsize, q), _planned.COPY
        return None

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        n, me = window.size, window.rank
        sends, recvs = shape.counts, shape.recv_counts
        q = places(window, src.itemsize)
        uneven = word_detail(word) != 0   # all_to_all's window word: whether splits were passed
        soff, roff = offsets(sends), offsets(recvs)
        if uneven:
            # The rounds to come depend on every rank's row: a stall here names this rank's own guess.
            guess = 1 + pieces_of(max(max(sends), max(recvs)), q)
            rows = exchange_words(window, stamp, word, trouble, list(sends), guess)
            for j in range(n):
                if j != me and rows[j][me] != recvs[j]:
                    trouble().differs(f"rank {j} sends {rows[j][me]} elements to this rank, which expects "
                                      f"{recvs[j]} from it (out_splits)")
            longest = max(max(row) for row in rows)   # every rank runs as many rounds
        else:
            longest = sends[0]
        pieces = pieces_of(longest, q)
        if sends[me] != recvs[me]:
            trouble().differs(f"this rank's block to itself has {sends[me]} elements in x and {recvs[me]} in out")
        dst[roff[me]:roff[me] + recvs[me]] = src[soff[me]:soff[me] + sends[me]]
        for i in range(pieces):
            lo = i * q
            slot = window.next_slot(src.dtype, (n - 1) * q)
            for j in range(n):
                m = min(q, sends[j] - lo)
                if j != me and m > 0:
                    slot[piece(j, me, q, m)] = src[soff[j] + lo:soff[j] + lo + m]
            k = sync(window, stamp, word, trouble, i + uneven, pieces + uneven)
            views = window.views(k, src.dtype, (n - 1) * q)
            for j in range(n):
                m = min(q, recvs[j] - lo)
                if j != me and m > 0:
                    dst[roff[j] + lo:roff[j] + lo + m] = views[j][piece(me, j, q, m)]


@lru_cache(maxsize=256)
def _plan(shape, me: int, item: int, q: int) -> bytes:
    """One round of an even call, compiled: the block for each peer into its place in this rank's
    slot, this rank's own block straight into its output, and from each peer's slot the block it
    holds for this rank."""
    n, blocks = shape.size, shape.counts
    at = offsets(blocks)
    mine = blocks[me] * item
    writes = [(at[j] * item, (j - (j > me)) * q * item, blocks[j] * item) for j in range(n) if j != me and blocks[j]]
    reads = [(-1, at[me] * item, at[me] * item, mine)] if mine else []
    reads += [(j, (me - (me > j)) * q * item, at[j] * item, blocks[j] * item) for j in range(n) if j != me and blocks[j]]
    return _planned.pack(writes, reads)
