"""One window round run by the compiled core (core/_round.c) from a plan of byte ranges.

The one-shot broadcast, all-gather, all-to-all, reduce-scatter, gather and scatter spend a 1 KiB call mostly in
Python: slot views, the publish, the wait, a copy or a ufunc per peer (1.6-5.2 us of a 3.4-7.5 us
call on 2 ranks here). When the call fits one round, each builds a plan once per shape (which
bytes of its input go where in its slot; which bytes of which slot, or of its own input, go where
in its output, or are reduced there in rank order) and the core runs the whole round in one call:
the same copies and the same reduction in the same order as the Python round, so the bits are
the same. A late peer, a mismatch or a timeout goes back to the Python wait that explains it
(``settle``), as the compiled all-reduce round does.
"""
from __future__ import annotations

import numpy as np

from ._rounds import settle

COPY = -1   # the plan's reads are copies, not a reduction
NOWHERE = np.empty(0, np.uint8)   # the buffer of a rank that has none (gather's out, scatter's x off the root)


def usable(window, *arrays) -> bool:
    """Whether the compiled round can run this call: built, enabled, and host numpy arrays (or
    None where this rank has no such buffer)."""
    if window.core is None:
        return False
    for a in arrays:   # a loop, not all() over a generator: this runs on every fast call
        if a is not None and type(a) is not np.ndarray:
            return False
    return True


def pack(writes: list, reads: list) -> bytes:
    """The plan: ``writes`` (from, to, length) from the input into this rank's slot; ``reads``
    (peer, from, to, length) from peer's slot (peer -1: from the input) into the output. Bytes."""
    words = [len(writes), len(reads)]
    for w in writes:
        words.extend(w)
    for r in reads:
        words.extend(r)
    return np.array(words, np.int64).tobytes()


def run(window, src, dst, plan: bytes, code: int, stamp: int, word: int, trouble) -> None:
    """Post this rank's round of ``plan`` and make its reads once every rank has posted it."""
    core, k = window.core, window.round + 1
    src = NOWHERE if src is None else src
    dst = NOWHERE if dst is None else dst
    late = core.round(k, src, dst, plan, code, stamp, word, window.spin)
    window.round = k
    if late:
        settle(window, k, stamp, word, trouble, 0, 1)
        core.finish(k, src, dst, plan, code)
