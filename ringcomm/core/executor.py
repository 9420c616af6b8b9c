"""Runs one rank's program over a transport, with deadlines and errors that say where it stuck.

A compiled program is a tuple of lanes; a lane is a list of steps. One lane runs with plain
blocking waits. Several lanes (independent pipelines on their own channels) are advanced
together: whichever lane's next request has completed moves on, so no lane waits on another.
Programs address named buffers (schedule.IN, OUT, TMP); ``run`` receives the arrays.

A wait that does not finish at once is watched: every so often the executor probes for the
first unmatched message of the peer it waits on, and of every other peer. A message whose
envelope (see envelope.py) names another collective, dtype or count (the waited-on peer's, or
another's of this call's number) proves the ranks disagree, and an abort notice proves a peer
gave up; either raises at once instead of waiting out the deadline.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from ..errors import CommTimeoutError, MismatchError, PeerAbortedError
from ..transport.base import Reducer, Transport
from ..transport.window import POISON
from .envelope import (ABORT_TAG, ALGORITHM_MASK, P2P, Envelope, count_differs, stamp_parts, window_kind_of,
                       word_detail)
from .schedule import TMP, Copy, Recv, RecvReduce, Send, lanes_of, prologue_of, scratch_elements, sends_first

_NOTHING = np.empty(0, np.uint8)   # the buffers of a call without any (barrier)
POLL_SLICE = 200e-6    # with several lanes, how long to block on one before checking the others
DIAGNOSE_EVERY = 0.05  # seconds between probes while a wait is stalled


class _Lane(list):
    """A compiled lane: its steps, plus the receive scratch its largest step needs (computed once)."""
    __slots__ = ("scratch",)


class Compiled:
    """A compiled program: local copies to make first, its lanes, and the TMP elements it needs.
    False when there is nothing to do (one rank, or nothing to move)."""
    __slots__ = ("prologue", "lanes", "tmp")

    def __init__(self, prologue: tuple, lanes: tuple, tmp: int):
        self.prologue, self.lanes, self.tmp = prologue, lanes, tmp

    def __bool__(self) -> bool:
        return bool(self.lanes or self.prologue)


def _compile_lane(lane, separate: bool) -> _Lane:
    out = _Lane((tuple(op for op in step if isinstance(op, Copy)),
                 tuple(op for op in step if not isinstance(op, Copy)),
                 sends_first(step, separate),
                 sum(op.count for op in step if isinstance(op, RecvReduce)))
                for step in lane)
    out.scratch = max((n for *_, n in out), default=0)
    return out


def compile_program(program, in_place: bool = True) -> Compiled:
    """Precompute, once per cached program, what the executor needs to know about each step."""
    lanes = tuple(_compile_lane(lane, not in_place) for lane in lanes_of(program) if lane)
    return Compiled(prologue_of(program), lanes, scratch_elements(program))


class _Step:
    """One posted step: its requests in completion order, and reductions deferred to its end."""
    __slots__ = ("requests", "reductions", "cursor")

    def __init__(self, copies, step, late_reduce, transport, bufs, scratch, reduce, base):
        for op in copies:   # local moves first: the step's sends may read what they wrote
            bufs[op.buf][op.off:op.off + op.count] = bufs[op.src][op.src_off:op.src_off + op.count]
        recvs, sends, self.reductions, used = [], [], [], 0
        for op in step:   # receives first, so a peer's send never waits on our posting order
            if isinstance(op, Send):
                continue
            region = bufs[op.buf][op.off:op.off + op.count]
            if not op.count and type(region) is np.ndarray:
                # An empty host receive (a rooted call's confirmation barrier) into scratch: its
                # buffer may be a read-only input, which mpi4py refuses even for no bytes. (A
                # device one stays device memory: its road is the device transport's.)
                region = _NOTHING
            tag = base + op.channel
            if isinstance(op, Recv):
                recvs.append((op, transport.irecv(region, op.peer, tag)))
                continue
            tmp = scratch[used:used + op.count]
            used += op.count
            own = None if op.own is None else bufs[op.own][op.own_off:op.own_off + op.count]
            kernel = reduce.message_first if op.first else reduce
            if late_reduce:   # the region must not change under the in-flight sends of this step
                recvs.append((op, transport.irecv(tmp, op.peer, tag)))
                self.reductions.append((region, tmp, own, kernel))
            else:
                recvs.append((op, transport.irecv_reduce(region, op.peer, tag, kernel, tmp, own)))
        for op in step:
            if isinstance(op, Send):
                sends.append((op, transport.isend(bufs[op.buf][op.off:op.off + op.count], op.peer,
                                                  base + op.channel)))
        # Waited in op order, so the order of reduction never depends on arrival order.
        self.requests = sends + recvs if late_reduce else recvs + sends
        self.cursor = 0

    def advance(self, timeout: Optional[float]) -> bool:
        """Complete requests in order for up to ``timeout`` seconds; True once all are done."""
        while self.cursor < len(self.requests):
            if not self.requests[self.cursor][1].wait(timeout):
                return False
            self.cursor += 1
        return True

    def finish(self) -> None:
        for region, tmp, own, kernel in self.reductions:
            if own is None:
                kernel(region, tmp)
            else:
                kernel(region, tmp, own)

    def blocking_op(self):
        return self.requests[self.cursor][0]

    def blocking_done(self) -> bool:
        """Whether the request the step waits on has completed since the wait gave up."""
        return self.requests[self.cursor][1].test()


class _Watch:
    """Deadline and diagnosis for one collective's waits."""

    def __init__(self, transport: Transport, envelope: Envelope, timeout: Optional[float], what: str,
                 started: Optional[float] = None, lanes: tuple = (), itemsize: int = 0, kind: int = 0,
                 kinds: tuple = ()):
        self.transport, self.envelope, self.timeout, self.what = transport, envelope, timeout, what
        # The program's lanes and the size of its elements: to tell a message it never receives
        # (``unexpected``).
        self.lanes, self.itemsize = lanes, itemsize
        # the window algorithm this call runs (envelope.window_kind_of; 0: a program) and the names
        # of its collective's window algorithms by kind, to name both sides of a disagreement
        self.kind, self.kinds = kind, kinds
        now = time.monotonic()
        self.deadline = None if timeout is None else (started or now) + timeout
        self.next_probe = now + DIAGNOSE_EVERY

    def left(self) -> Optional[float]:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def stalled(self, op, k: int, steps: int, done=None) -> None:
        """Called while ``op`` is not done: raise if it never will be, else return. ``done()``
        re-tests the wait before a mismatch is declared (see ``diagnose``)."""
        now = time.monotonic()
        # The deadline first: a rank whose own wait ran out names the peer it waited for, even if
        # another rank that waited for the same peer timed out a moment earlier and said so.
        if self.deadline is not None and now >= self.deadline:
            verb = "send to" if isinstance(op, Send) else "receive from"
            raise CommTimeoutError(
                f"{self.what} on rank {self.transport.rank}: timed out after {self.timeout:g} s waiting to "
                f"{verb} rank {op.peer} ({op.count} elements, step {k + 1} of {steps})")
        if now >= self.next_probe:
            self.next_probe = now + DIAGNOSE_EVERY
            self.diagnose(op.peer, done)

    def in_their_words(self, err: PeerAbortedError) -> PeerAbortedError:
        """A transport saw a peer's abort flag (comm.abort() sets one after sending its notices):
        the peer's own reason, from its notice, rather than the flag's bare fact. The notice
        travels on the host route even when this collective's data is on the device route."""
        notice = self.transport.probe(None, ABORT_TAG)
        if notice is None:
            return err
        return PeerAbortedError(f"{self.what} on rank {self.transport.rank}: {self.transport.read_notice(notice)}")

    def diagnose(self, peer: int, done=None) -> None:
        transport = self.transport
        notice = transport.probe(None, ABORT_TAG)
        if notice is not None:
            raise PeerAbortedError(f"{self.what} on rank {transport.rank}: {transport.read_notice(notice)}")
        # A point-to-point send still waiting for its receive is no sign of disagreement: MPI lets
        # a rank send, run collectives, and receive afterwards. Such sends are passed over, so a
        # collective message behind one still explains a stall.
        first = transport.probe(peer, skip=P2P)
        if first is not None:
            reason = self.envelope.describe_mismatch(first[1], peer)
            # A peer already in the next collective has finished this one: what this rank waited
            # for became visible before that message did, so a re-test completes it.
            if reason and not (done is not None and done()):
                raise MismatchError(f"{self.what} on rank {transport.rank}: {reason}")
        if self.lanes:   # any peer's message this schedule never takes (``unexpected``)
            for other in range(transport.size):
                if other == transport.rank:
                    continue
                found = first if other == peer else transport.probe(other, skip=P2P)
                if found is not None and self.other_algorithm(found[1]):   # this very call, not its program
                    raise MismatchError(f"{self.what} on rank {transport.rank}: "
                                        f"{self.envelope.describe_mismatch(found[1], other)}")
                # A message of this call's number that is not this call (a rank that broadcasts
                # where the others all-reduce): the peer this rank waits on may never send.
                if found is not None and other != peer and self.envelope.numbered_alike(found[1]):
                    reason = self.envelope.describe_mismatch(found[1], other)
                    if reason and not (done is not None and done()):
                        raise MismatchError(f"{self.what} on rank {transport.rank}: {reason}")
                if found is not None and self.unexpected(found[1], found[2], other):
                    raise MismatchError(
                        f"{self.what} on rank {transport.rank}: rank {other} sent this rank {found[2]} bytes of "
                        f"this collective, and this rank's schedule receives no message of that size from rank "
                        f"{other}: the ranks disagree on the root (or on the count or the algorithm)")
        # A peer in a one-shot collective sends nothing to probe, but its window slot says
        # which collective it is in.
        window = transport.window
        stamp = None if window is None else window.ahead(peer)
        if stamp == POISON and not (done is not None and done()):
            raise gave_up(transport, peer, self.what)
        if stamp is not None:   # the stamp has the count (stamp_count): counts equal mod 32 differ there
            tag, count = stamp_parts(stamp)
            reason = self.envelope.describe_mismatch(tag, peer) or count_differs(peer, self.envelope.count, count)
            if not reason:
                reason = self.other_kind(peer, window_kind_of(stamp))
            if reason and not (done is not None and done()):
                raise MismatchError(f"{self.what} on rank {transport.rank}: {reason}")
        # A peer that closed this communicator (a split's window region says so) sends it nothing
        # more; what it sent before closing is in already, so a wait that a re-test does not
        # complete never will. Without the re-test, a last message published just before the
        # close would be taken for one never sent. Last: a message of another collective the
        # peer sent before closing names the disagreement, which is the caller's bug.
        gone = None if window is None else window.gone(peer)
        if gone is not None and done is not None and not done():
            raise PeerAbortedError(f"{self.what} on rank {transport.rank}: {gone}")

    def other_kind(self, peer: int, theirs: int) -> Optional[str]:
        """Why a round of this very call that ``peer`` posted as window algorithm ``theirs`` is
        not this rank's, or None when it runs the same one."""
        if theirs == self.kind:
            return None
        if not self.kind:
            return (f"rank {peer} runs this call's rounds on the shared window (a one_shot or direct "
                    f"algorithm), where this rank does not: the ranks disagree on the algorithm "
                    f"(algorithm= or RINGCOMM_ALGO)")
        return (f"rank {peer} runs {self._kind_name(theirs)} where this rank runs {self._kind_name(self.kind)}: "
                f"the ranks disagree on the algorithm (algorithm= or RINGCOMM_ALGO)")

    def _kind_name(self, kind: int) -> str:
        return self.kinds[kind - 1] if 0 < kind <= len(self.kinds) else f"window algorithm {kind}"

    def other_algorithm(self, tag: int) -> bool:
        """Whether ``tag`` is a message of this very call sent by another schedule algorithm than
        this rank's (a peer that was passed another ``algorithm=``): it can never be received here."""
        same = (1 << 29) - 4 - ALGORITHM_MASK   # every field but the channel and the algorithm
        base = self.envelope.base_tag()
        return tag & same == base & same and tag & ALGORITHM_MASK != base & ALGORITHM_MASK

    def unexpected(self, tag: int, nbytes: int, peer: int) -> bool:
        """Whether a message of this very collective (``tag`` less its channel) came from a peer
        this rank's program never receives a message of that size on that channel from. Ranks
        that disagree on a reduce's root can all wait to send, each to the root it believes in,
        and none would ever look at a receive; ranks that run two algorithms of one call (tree
        and ring) each wait for what the other never sends. The peer's message then is the only
        sign, and proof enough: a message is received only by a receive of its exact tag."""
        if tag & ((1 << 29) - 4) != self.envelope.base_tag():
            return False
        itemsize, channel = self.itemsize, tag & 3
        return not any(op.peer == peer and op.count * itemsize == nbytes and op.channel == channel
                       for lane in self.lanes for _, ops, _, _ in lane for op in ops if not isinstance(op, Send))


def run(compiled: Compiled, transport: Transport, bufs: tuple, reduce: Optional[Reducer], *,
        envelope: Envelope, timeout: Optional[float], what: str) -> None:
    """Execute a compiled program over ``bufs`` (IN, OUT, TMP arrays; TMP may be None when the
    program needs none).

    ``what`` names the call in errors, e.g. "all_reduce #12 (ring, 4096 x float32)".
    """
    like = bufs[1] if bufs[1] is not None else bufs[0] if bufs[0] is not None else _NOTHING   # scratch is made like it
    # A rank without some buffer (gather's OUT off the root) still names it in zero-byte ops
    # (the confirmation barrier): an empty view stands in.
    if compiled.tmp and (bufs[TMP] is None or bufs[TMP].size < compiled.tmp):
        # empty_like: scratch lives where the data does (numpy, or cupy for device arrays)
        bufs = (bufs[0], bufs[1], np.empty_like(like, shape=compiled.tmp))
    if bufs[0] is None or bufs[1] is None or bufs[2] is None:
        bufs = tuple(like[:0] if b is None else b for b in bufs)
    for op in compiled.prologue:
        bufs[op.buf][op.off:op.off + op.count] = bufs[op.src][op.src_off:op.src_off + op.count]
    lanes = compiled.lanes
    if not lanes:
        return
    base = envelope.base_tag()
    watch = _Watch(transport, envelope, timeout, what, lanes=lanes, itemsize=like.itemsize)
    try:
        if len(lanes) == 1:
            _run_lane(lanes[0], transport, bufs, like, reduce, base, watch)
        else:
            _run_lanes(lanes, transport, bufs, like, reduce, base, watch)
    except PeerAbortedError as err:
        raise watch.in_their_words(err) from None


def _run_lane(lane, transport, bufs, like, reduce, base, watch: _Watch) -> None:
    scratch = np.empty_like(like, shape=lane.scratch)
    for k, (copies, step, late_reduce, _) in enumerate(lane):
        posted = _Step(copies, step, late_reduce, transport, bufs, scratch, reduce, base)
        if not posted.advance(0.0):
            while not posted.advance(min(DIAGNOSE_EVERY, watch.left() if watch.deadline else DIAGNOSE_EVERY)):
                watch.stalled(posted.blocking_op(), k, len(lane), posted.blocking_done)
        posted.finish()


def _run_lanes(lanes, transport, bufs, like, reduce, base, watch: _Watch) -> None:
    scratch = [np.empty_like(like, shape=lane.scratch) for lane in lanes]
    position = [0] * len(lanes)
    posted: list = [None] * len(lanes)
    slice_ = 0.0
    while True:
        moved = False
        for i, lane in enumerate(lanes):
            if posted[i] is None:
                if position[i] == len(lane):
                    continue
                copies, step, late_reduce, _ = lane[position[i]]
                posted[i] = _Step(copies, step, late_reduce, transport, bufs, scratch[i], reduce, base)
            if posted[i].advance(slice_):
                posted[i].finish()
                posted[i] = None
                position[i] += 1
                moved = True
            else:
                watch.stalled(posted[i].blocking_op(), position[i], len(lane), posted[i].blocking_done)
        if all(position[i] == len(lane) for i, lane in enumerate(lanes)):
            return
        slice_ = 0.0 if moved else min(POLL_SLICE, 2 * slice_ or 10e-6)   # back off while nothing moves


NOTICE_GRACE = 1.0   # seconds a rank that sees a peer's poison waits for that peer's reason


def gave_up(transport: Transport, peer: int, what: str) -> PeerAbortedError:
    """The error for ``peer``'s poison in the window: its abort notice, sent before the poison,
    says why. A peer whose own call failed because another rank gave up or closed the
    communicator sends none (its peers learn that themselves): it is named with what the window
    says of the others, so a rank that waited for it names the close too, not a bare give-up."""
    notice, until = None, time.monotonic() + NOTICE_GRACE
    while notice is None and time.monotonic() < until:
        notice = transport.probe(None, ABORT_TAG)
        if notice is None:
            time.sleep(1e-4)
    if notice is not None:
        return PeerAbortedError(f"{what} on rank {transport.rank}: {transport.read_notice(notice)}")
    window = transport.window
    others = () if window is None else (window.gone(r) for r in range(window.size) if r not in (peer, window.rank))
    why = next((reason for reason in others if reason is not None), None)
    return PeerAbortedError(f"{what} on rank {transport.rank}: rank {peer} gave up" + (f"; {why}" if why else ""))


class WindowGuard:
    """What a one-shot round needs when it goes wrong, built only then (the fast path never pays
    for it), under the same deadline and diagnosis as a program: a stalled round probes the
    transport for abort notices and for messages of the peer it waits on; a peer whose slot
    carries another collective's stamp is a mismatch. The deadline counts from ``started``."""

    def __init__(self, transport: Transport, envelope: Envelope, timeout: Optional[float], what: str,
                 started: float, count: int, word: int = 0, describe_word=None, static: int = 0,
                 kinds: tuple = ()):
        self.watch = _Watch(transport, envelope, timeout, what, started, kind=window_kind_of(static), kinds=kinds)
        self.envelope, self.what, self.rank, self.count = envelope, what, transport.rank, count
        self.word, self.describe_word = word, describe_word   # the round's shape word and how to explain a difference

    def stalled(self, peer: int, piece: int, pieces: int, done=None) -> None:
        """``done()`` re-tests the round before a mismatch is declared (_Watch.diagnose)."""
        self.watch.stalled(Recv(peer, 0, self.count), piece, pieces, done)

    def differs(self, reason: str) -> None:
        """Raise MismatchError for what a round found in the peers' posted words (an uneven
        all_to_all's lengths), in the words of every other error of this call."""
        raise MismatchError(f"{self.what} on rank {self.rank}: {reason}")

    def mismatch(self, peer: int, stamp: int, word: int = 0) -> None:
        """``stamp`` and ``word`` are the peer's window stamp (envelope.window_stamp) and shape word."""
        if stamp == POISON:
            raise gave_up(self.watch.transport, peer, self.what)
        tag, count = stamp_parts(stamp)
        reason = self.envelope.describe_mismatch(tag, peer) or self.watch.other_kind(peer, window_kind_of(stamp))
        if reason is None:
            reason = count_differs(peer, self.count, count, (self.word, word)) or None
        if reason is None and word != self.word and self.describe_word is not None:
            reason = f"rank {peer} differs in {self.describe_word(word_detail(self.word), word_detail(word))}"
        raise MismatchError(f"{self.what} on rank {self.rank}: {reason or f'rank {peer} posted stamp {stamp:#x}'}")
