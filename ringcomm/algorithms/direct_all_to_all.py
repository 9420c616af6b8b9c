"""Direct all-to-all: every rank copies the block each peer holds for it straight out of that
peer's input.

Round 1: each rank posts the address of its x and, per destination, where that destination's
block starts and how long it is (uneven splits included), and copies its own block while its
peers post theirs. Rank r then reads from every peer j the block j holds for r (window.reader)
into its place in r's output, after checking that j's length is the one r expects (a
disagreement is a MismatchError, never a short read). Round 2 says every read is done. One copy
per byte, no staging, every pair at once. Cost: 2 alpha_w + (n-1) alpha_d + (n-1)/n S beta_d
(S a rank's input).

Where the window's core may read peers by CMA itself (Window.direct_core), both rounds run in one
compiled call from a plan built once per shape (core/_round.c, ``direct``): the same table posted,
the same checks, the same reads. A 1 MiB call on 2 ranks spent ~15 us of its ~75 in the Python
rounds (table, post, views, the read's wrappers, the second round), with caches cold from the
copies. A late peer, a mismatch or a read the kernel refuses goes back to the Python road below,
from where the compiled call stopped, which explains it.
"""
from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from ..selection.cost import Network
from . import _planned
from ._direct import after_compiled, exchange_words, reads
from ._rounds import sync
from .base import PlannedAlgorithm
from .pairwise_all_to_all import offsets


class DirectAllToAll(PlannedAlgorithm):
    name = "direct"
    collective = "all_to_all"
    reads_directly = True

    def seconds(self, nbytes, net: Network) -> float:
        n = net.size
        if net.direct_round is not None:   # compiled: both rounds and the reads in one call
            return (n - 1) * net.direct_round.alpha + (n - 1) / n * nbytes * net.direct_round.beta
        return 2 * net.window.alpha + reads((n - 1) / n * nbytes, net, n - 1)

    def has_work(self, shape) -> bool:
        return True   # counts differ per rank: a rank with nothing to move still takes part

    def rounds(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        me = window.rank
        if shape.counts[me] != shape.recv_counts[me]:   # the compiled road refuses these (``road``)
            trouble().differs(f"this rank's block to itself has {shape.counts[me]} elements in x and "
                              f"{shape.recv_counts[me]} in out")
        sends, recvs = shape.counts, shape.recv_counts
        soff, roff = offsets(sends), offsets(recvs)
        table = window.address_words((src,)) + [v for pair in zip(soff, sends) for v in pair]

        def own_block():   # needs no peer: copied while they post their addresses, not after
            # (a 1 MiB call on 2 ranks spent 9 us waiting there, and 21 copying)
            dst[roff[me]:roff[me] + recvs[me]] = src[soff[me]:soff[me] + sends[me]]
        _read_peers(window, dst, shape, exchange_words(window, stamp, word, trouble, table, 2, meanwhile=own_block),
                    stamp, word, trouble)

    def road(self, window, src, dst, shape, reducer, word):
        # A persistent call builds this once (persistent.WindowCall): the plan's lookup and the
        # checks above were ~1 us of the ~5 us of Python before a remembered 1 MiB call's core
        # call, with the caches cold.
        core, me = window.direct_core, window.rank
        if core is None or shape.counts[me] != shape.recv_counts[me] or not _planned.usable(window, src, dst):
            return None
        words = window.address_words((src,))   # its address, and the ringcomm.empty block it lies in
        return partial(_compiled, window, core, src, dst, shape, _plan(shape, me, dst.itemsize, tuple(words[1:]),
                                                                   window.block_word))


def _compiled(window, core, src, dst, shape, plan: bytes, stamp: int, word: int, trouble) -> None:
    """Both rounds in one compiled call; from where it stopped (a late peer, a mismatch, a read
    the kernel refused, a slow distance), the Python road's waits and reads, which explain it."""
    k = window.round + 1
    slots = after_compiled(window, k, core.direct(k, src, dst, plan, stamp, word, window.spin),
                           stamp, word, trouble, window.array_words + 2 * window.size)
    if slots is not None:
        _read_peers(window, dst, shape, slots, stamp, word, trouble)


def _read_peers(window, dst, shape, slots: list, stamp: int, word: int, trouble) -> None:
    """Read from each peer the block it holds for this rank (after checking its length, posted in
    ``slots``), then the second round. A peer's input in a ringcomm.empty block is mapped here
    and copied with plain loads (Window.learn, Window.reader)."""
    me, recvs, head = window.rank, shape.recv_counts, window.array_words   # the words before the table
    roff = offsets(recvs)
    if head > 1:
        window.learn([row[:head] for row in slots])
    for j in range(window.size):
        theirs = slots[j][head + 1 + 2 * me]
        if theirs != recvs[j]:
            trouble().differs(f"rank {j} sends {theirs} elements to this rank, which expects {recvs[j]} from it "
                              f"(out_splits)")
        if theirs and j != me:
            window.reader(j, slots[j][0] + slots[j][head + 2 * me] * dst.itemsize, dst[roff[j]:roff[j] + theirs])
    sync(window, stamp, word, trouble, 1, 2)


@lru_cache(maxsize=256)
def _plan(shape, me: int, item: int, block: tuple, inode: int) -> bytes:
    """The compiled call's plan (core/_round.c): the table posted after the input's address (the
    ``block`` words, then each destination's offset and count), this rank's own block, and the
    block each peer holds for it. Each peer's block word (its inode, word ``inode`` of its row:
    Window.block_word) is checked like a count,
    against 0: where a peer's input is a ringcomm.empty block the core hands the reads back to the
    Python road, which maps the block and copies (CMA pins its 4 KiB pages: a 64 MiB all_to_all
    on blocks took 1.45-1.49x MPI's time read by CMA, 1.04-1.14x mapped)."""
    n, sends, recvs = shape.size, shape.counts, shape.recv_counts
    soff, roff = offsets(sends), offsets(recvs)
    head = 1 + len(block)
    table = [*block] + [v for pair in zip(soff, sends) for v in pair]
    copies = [(soff[me] * item, roff[me] * item, sends[me] * item)] if sends[me] else []
    reads = [(j, head + 2 * me, head + 1 + 2 * me, roff[j] * item, recvs[j]) for j in range(n) if j != me]
    if block:   # (peer, -, its inode word, -, 0): a count check that its input is no block
        reads = [(j, 0, inode, 0, 0) for j in range(n) if j != me] + reads
    words = [len(table), len(copies), len(reads), item, *table]
    for entry in copies + reads:
        words.extend(entry)
    return np.array(words, np.int64).tobytes()
