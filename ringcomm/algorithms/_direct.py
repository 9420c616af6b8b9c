"""What the direct algorithms share: trading buffer addresses through the window, and reducing
one part of the vector out of every rank's buffer in rank order.

A direct algorithm moves no payload through the window: each rank posts where its buffers are,
and every rank reads what it needs straight out of its peers' buffers (window.reader: CMA between
processes, a copy between threads). One copy per byte instead of two (into a slot, out of it).
The rounds that follow are what make this safe: a rank leaves the call, and its buffers may
change, only after every rank has posted the round that says its reads are done.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import numpy as np

from ..core import copying
from ..selection.cost import Network
from . import _planned
from ._rounds import settle, sync

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


# What a compiled direct call did (core/_round.c: direct_rounds, moves_rounds): both rounds done;
# round 1 posted, a peer late or in another call; round 1 complete, the checks and moves left to
# Python; the moves made and round 2 posted, a peer late or in another call.
DONE, POSTED, CHECK, READ = range(4)


def moves_road(window, src, dst, posted, plan: bytes, moves: Callable[[list], None]) -> Optional[Callable]:
    """The whole call as ``road(stamp, word, trouble)`` on the compiled core (core/_round.c,
    ``moves``) where it reaches peers by CMA itself (Window.direct_core) and the buffers are host
    arrays, else None. ``posted``: the array whose address words this rank posts in round 1 (as
    ``exchange`` posts them); ``plan``: ``moves_plan``'s; ``moves(rows)``: the Python road's
    moves but the plan's copies (the core made those first), given every rank's addresses, for a
    call the core leaves to it (a peer's buffer is a ringcomm.empty block, a slow distance, a
    peer that gave up, a late peer). Gather, scatter and
    all-gather of 1 MiB on 2 ranks spent 20-35 us of their 80-115 in the Python rounds here."""
    core = window.direct_core
    if core is None or not _planned.usable(window, src, dst):
        return None
    words = np.array(window.address_words((posted,)), np.int64).tobytes()
    src = _planned.NOWHERE if src is None else src
    dst = _planned.NOWHERE if dst is None else dst
    return partial(_moves, window, core, src, dst, words, plan, moves)


def moves_plan(window, copies=(), reads=(), writes=()) -> bytes:
    """The compiled call's plan (core/_round.c, ``moves``), in bytes: ``copies`` (from, to, len)
    from the input to the output; ``reads`` (peer, at, to, len): len bytes at ``at`` past the
    peer's posted address into the output at ``to``; ``writes`` (peer, from, at, len) the other
    way. Entries of no bytes are left out."""
    copies = [c for c in copies if c[-1]]
    reads, writes = [r for r in reads if r[-1]], [w for w in writes if w[-1]]
    block = window.block_word   # a row's inode word (Window.address_words)
    words = [len(copies), len(reads), len(writes), block]
    for entry in (*copies, *reads, *writes):
        words.extend(entry)
    return np.array(words, np.int64).tobytes()


def _moves(window, core, src, dst, words: bytes, plan: bytes, moves, stamp: int, word: int, trouble) -> None:
    k = window.round + 1
    rows = after_compiled(window, k, core.moves(k, src, dst, words, plan, stamp, word, window.spin),
                          stamp, word, trouble, len(words) // 8)
    if rows is not None:
        moves(window.learn(rows))
        sync(window, stamp, word, trouble, 1, 2)


def after_compiled(window, k: int, status: int, stamp: int, word: int, trouble, row: int) -> Optional[list]:
    """Take over from a compiled direct call of rounds k and k + 1 that returned ``status``: wait
    where it stopped waiting (the Python waits explain a late peer or a mismatch). None if
    nothing is left; else every rank's row of round k (``row`` words each), for the checks and
    moves left to Python, which then posts round k + 1."""
    window.round = k if status in (POSTED, CHECK) else k + 1
    if status == DONE:
        return None
    if status == READ:
        settle(window, k + 1, stamp, word, trouble, 1, 2)
        return None
    if status == POSTED:
        settle(window, k, stamp, word, trouble, 0, 2)
    return [tuple(v.tolist()) for v in window.views(k, ADDRESS, row)]


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

