"""The synchronisation every window algorithm repeats: post a round, wait for every rank's,
check that they are all in the same call.

A round doubles as the confirmation a rooted schedule needs a barrier for: no rank reads a slot
before every rank has posted that round, and every posted round carries the call's stamp and
shape word, so a rank that disagrees (another collective, count, dtype, root or counts) makes
every rank raise before any byte is read."""
from __future__ import annotations

from typing import Callable

STALL_CHECK = 0.05   # seconds a round may wait before the stall is diagnosed (and every so often after)


def sync(window, stamp: int, word: int, trouble: Callable, piece: int, pieces: int) -> int:
    """Publish this rank's next round (its slot filled already, or not used) and return its
    number once every rank has posted it with the same stamp and word. ``trouble()`` builds the
    guard (executor.WindowGuard) that explains a stall, raising at the deadline, or a mismatch;
    ``piece`` of ``pieces`` says where in the call a stall happened."""
    k = window.publish(stamp, word)
    settle(window, k, stamp, word, trouble, piece, pieces)
    return k


def settle(window, k: int, stamp: int, word: int, trouble: Callable, piece: int, pieces: int) -> None:
    """Return once every rank has posted round ``k`` (already published by this one) with this
    stamp and word; explain a stall, raise at the deadline or on a mismatch (``sync``)."""
    if window.lagging(k) is not None and window.wait(k, STALL_CHECK) is not None:
        guard = trouble()   # slow path: from here on, explain the stall or time out
        peer = window.lagging(k)
        # A peer seen lagging may post round k, finish it and post its next call's first round
        # before the diagnosis looks at its slot: the round is re-tested before a stamp from
        # that next call is taken for a mismatch.
        done = lambda: window.lagging(k) is None   # noqa: E731
        window.waiting = k   # a timeout here poisons with k: a stopped peer that resumes learns it
        while peer is not None:
            guard.stalled(peer, piece, pieces, done)
            peer = window.wait(k, STALL_CHECK)
        window.waiting = None
    odd = window.odd_stamp(k, stamp, word)
    if odd is not None:
        trouble().mismatch(odd, window.stamp(odd, k), window.word(odd, k))
    # Every rank posted round k, but one may have given up on it since: this rank was stopped
    # (SIGSTOP, a debugger) past its deadline. Its peers' calls raised and their buffers are
    # theirs again; the reads of this call may have seen them reused. Raise, never return them.
    deserter = window.deserted(k)
    if deserter is not None:
        trouble().mismatch(deserter, window.stamp(deserter, k + 1), window.word(deserter, k + 1))


def places(window, itemsize: int) -> int:
    """q: the elements of each place when a round's slot holds one place per other rank (see
    ``piece``)."""
    return max(1, window.capacity // itemsize // max(1, window.size - 1))


def piece(part: int, writer: int, q: int, m: int) -> slice:
    """Where the m-element piece meant for rank ``part`` lies in rank ``writer``'s slot, when a
    slot holds one q-element place per other rank in rank order, the writer's own left out (the
    one-shot reduce-scatter's parts, the one-shot all-to-all's blocks)."""
    at = (part - (part > writer)) * q
    return slice(at, at + m)


def pieces_of(count: int, per: int) -> int:
    """Rounds to move ``count`` elements ``per`` at a time (one, even for nothing)."""
    return max(1, -(-count // per))
