"""What the direct algorithms share: trading buffer addresses through the window, and reducing
one part of the vector out of every rank's buffer in rank order.

A direct algorithm moves no payload through the window: each rank posts where its buffers are,
and every rank reads what it needs straight out of its peers' buffers (window.reader: CMA between
processes, a copy between threads). One copy per byte instead of two (into a slot, out of it).
The rounds that follow are what make this safe: a rank leaves the call, and its buffers may
change, only after every rank has posted the round that says its reads are done.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..core import copying
from ..selection.cost import Network
from ._rounds import settle

ADDRESS = np.dtype(np.int64)
CHUNK_BYTES = 512 << 10   # read and reduced a chunk at a time, so the chunk is still in cache


def exchange(window, stamp: int, word: int, trouble, arrays: tuple, rounds: int) -> list:
    """Round 1 of ``rounds``: post the addresses of ``arrays`` and return every rank's, in rank
    order (a tuple of ints per rank), once every rank has posted them. Peers' buffers from
    ``ringcomm.empty`` are mapped on the way (Window.learn), so reads and writes of them are
    plain copies (window.reader, window.writer, window.mapped)."""
    return window.learn(exchange_words(window, stamp, word, trouble, window.address_words(arrays), rounds))


def exchange_words(window, stamp: int, word: int, trouble, words, rounds: int,
                   meanwhile: Optional[Callable[[], None]] = None) -> list:
    """Round 1 of ``rounds``: post ``words`` (int64s: addresses, offsets, lengths) and return
    every rank's, in rank order (a tuple of ints per rank), once every rank has posted them.
    ``meanwhile``: work that needs no peer, done between posting and waiting for the peers."""
    window.next_slot(ADDRESS, len(words))[...] = words
    k = window.publish(stamp, word)
    if meanwhile is not None:
        meanwhile()
    settle(window, k, stamp, word, trouble, 0, rounds)
    return [tuple(v.tolist()) for v in window.views(k, ADDRESS, len(words))]


def reduce_part(window, reducer, bases: list, own, out, first: int, own_is_out: bool,
                outputs: Optional[list] = None) -> None:
    """out = x0 OP x1 OP ... OP x(n-1) over elements [first, first + out.size) of every rank's
    vector, in rank order: this rank's x is ``own`` (the same memory as ``out`` when
    ``own_is_out``), every other rank's lies at ``bases[r]`` in its memory. ``outputs``: every
    rank's output vector (addresses); each reduced chunk is also written there at once, while it
    is still in this rank's cache (window.writer)."""
    n, me, dtype, item = len(bases), window.rank, out.dtype, out.itemsize
    per = max(1, CHUNK_BYTES // item)
    # Each read lands at its source's page offset (copying.like): the kernel's copy runs 2-5x
    # slower where the two lie a few bytes apart modulo a page (core/copying.py).
    span = per * item + copying.PAGE
    scratch = window.scratch(3 * span)
    bufs = [scratch[i * span:(i + 1) * span] for i in range(3)]
    reduce, combine, read = reducer.reduce, reducer.combine, window.reader
    for lo in range(0, out.size, per):
        m = min(per, out.size - lo)
        o, mine = out[lo:lo + m], own[lo:lo + m]
        if own_is_out and me >= 2:   # o is overwritten by x0 OP x1 before this rank's turn
            mine = bufs[2][:m * item].view(dtype)
            mine[...] = o

        def part(r, buf):
            if r == me:
                return mine
            addr = bases[r] + (first + lo) * item
            there = window.mapped(r, addr, m * item)
            if there is not None:   # a block of r's mapped here (ringcomm.empty): reduced in place
                return there.view(dtype)
            got = copying.like(buf, addr, m * item).view(dtype)
            read(r, addr, got)
            return got
        combine(o, part(0, bufs[0]), part(1, bufs[1]))
        for r in range(2, n):
            reduce(o, part(r, bufs[0]))
        if outputs is not None:
            for r in range(n):
                if r != me:
                    window.writer(r, outputs[r] + (first + lo) * item, o)


def reads(nbytes: float, net: Network, parts: int = 1) -> float:
    """Seconds to read ``nbytes`` from ``parts`` peers (alpha_d per peer: the chunks of a
    reduction cost a system call each, which the bandwidth term absorbs)."""
    return parts * net.direct.alpha + nbytes * net.direct.beta

