"""A communicator's point-to-point calls: posted in issue order, completed on their own.

``comm.send`` and ``comm.recv`` (communicator.py) prepare a ``Call`` (collectives/send_recv.py
checks the arguments); here it takes its number, its flight-recorder entry and its ``Work``, and
is posted: in the caller's thread when nothing issued earlier is still to be posted, else by the
progress thread when its turn comes (core/progress.py). A posted operation is then tested until
it is done, by the progress thread, by a thread waiting on its Work, or (a blocking call) by the
caller; every test also watches the deadline and, every ``executor.DIAGNOSE_EVERY`` seconds,
looks for a peer's abort notice and for a message that can never match (MismatchError).

``PointToPoint`` is a mixin of Communicator, apart so that each file holds one role. The
reference backends (backends/) override ``_post``, their library's own send and receive, and
nothing else.
"""
from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Callable, Optional

from .collectives import Call
from .core import executor
from .core.envelope import ABORT_TAG, describe_p2p_mismatch, p2p_tag
from .core.progress import Pending, deadline_of, settle
from .core.streams import scope_for
from .errors import CommError, CommTimeoutError, MismatchError, PeerAbortedError
from .transport.polling import wait_polling
from .work import Work

if TYPE_CHECKING:
    from .communicator import Communicator


class PointToPoint:
    """Communicator's send and receive machinery (the module docstring)."""

    def _point_to_point(self, call: Call, async_op: bool):
        """Post in issue order, complete on its own (core/progress.py)."""
        engine, name = self.engine, call.collective.name
        scope = scope_for(call)   # device memory: posted and tested under its device and stream
        with engine.state:
            self._check_usable(name)
            engine.admit(name)
            self._seq_p2p += 1
            seq = self._seq_p2p
            entry = self.recorder.record_p2p(seq, name, call.peer, call.tag, call.count, call.dtype.name)
            # With nothing issued earlier still to post, the call is posted right here (two thread
            # hand-offs cost more than a message); a blocking one also completes here, an async
            # one is left to the progress thread.
            inline = scope is None and engine.idle()
            if inline:
                engine.outstanding += 1
            # spelled only if read; of the call it keeps no buffer (a finished Work lets go of them)
            work = Work(functools.partial(_p2p_description, name, seq, call.peer, call.tag, self.rank))
            work._result = call.result

            if not inline:   # posted by the progress thread when its turn comes
                engine.enqueue(lambda: self._post_async(call, work, entry, scope))
        if inline and async_op:
            self._post_async(call, work, entry)
            return work
        if async_op:
            return work
        if inline:
            try:
                result = self._point_to_point_inline(call, work, entry)
            finally:
                engine.done()
        else:
            try:
                result = work.wait()
            except BaseException as err:   # the operation stays posted: Communicator._interrupted
                self._interrupted(err, work.description)
                raise
        return (result, work.source) if name == "recv" and call.peer is None else result

    def _post_async(self, call: Call, work: Work, entry, scope=None) -> None:
        """Post a send or receive whose Work the progress thread (or a thread waiting on it)
        completes: from the caller's thread, or from the progress thread when its turn comes.
        ``scope``: device memory's DeviceScope, around the post and every test."""
        engine = self.engine
        try:
            self._refuse_if_broken(work)
            entry.started = time.monotonic()
            with engine.exec:
                if scope is None:
                    test, cancel, passive = self._post(call, work)
                else:
                    with scope:
                        test, cancel, passive = self._post(call, work)
                    test = scope.wrap(test)
                # A send copied out of the caller's array as it was posted (the threads
                # transport, shm's pool: Request.buffered) is done already: finished here, it
                # costs the progress thread no wake-up and its waiter no hand-off.
                sent = call.inp is not None and test()
        except BaseException as err:
            settle(entry, work, f"failed: {type(err).__name__}")
            engine.done()
            work._finish(None, err)
            return
        if sent:
            settle(entry, work, "done")
            engine.done()
            work._finish(work._result, None)
            return
        entry.state = "posted"
        with engine.state:
            engine.watch(Pending(test, cancel, work, entry), wake=not passive())

    def _refuse_if_broken(self, work: Work) -> None:
        if self._broken is not None:
            raise CommError(f"{work.description}: not posted: the communicator failed earlier: {self._broken}")

    def _point_to_point_inline(self, call: Call, work: Work, entry):
        """Post and complete one blocking send or receive in the caller's thread."""
        try:
            self._refuse_if_broken(work)
            entry.started = time.monotonic()
            with self.engine.exec:
                test, _, _ = self._post(call, work)
                entry.state = "posted"
                wait_polling(test, None)   # the test raises at the deadline
        except BaseException as err:
            settle(entry, work, f"failed: {type(err).__name__}")
            if isinstance(err, CommError):
                self._fail(err)
            else:   # left posted with nobody to finish it: Communicator._interrupted
                self._interrupted(err, work.description)
            raise
        settle(entry, work, "done")
        return call.result

    def _post(self, call: Call, work: Work) -> tuple:
        """Post one send or receive; return (the test polled until it is done, which raises at
        the deadline; what withdraws it; whether its peer finishes it alone: Request.passive).
        The reference backends replace this with their library's send and receive."""
        transport = self.transport
        tag = p2p_tag(call.dtype.name, call.tag)
        if call.inp is not None:   # a send
            # The caller's array stays untouched until the send completes (``send``'s rule), so
            # from cma_p2p_min_bytes on (256 KiB or 4 MiB by the host: cma.py) the receiver
            # reads it straight out of this process (CMA), or where CMA is off through a pipe
            # (shm/pipe.py), instead of through the staging pool or MPI (Transport.isend_p2p).
            request = transport.isend_p2p(call.inp.flat, call.peer, tag)
            return _Posted(self, call, work, request, sending=True).test, request.cancel, request.passive
        if call.peer is not None:
            work.source = call.peer
            if not any(op.tag == tag for op in self._unmatched):
                request = transport.irecv(call.out.flat, call.peer, tag)
                return _Posted(self, call, work, request).test, request.cancel, not_passive
        posted = _InTurn(self, call, work, tag)
        return posted.test, posted.cancel, not_passive


def not_passive() -> bool:
    """A receive (or a reference library's send) is never passive: it moves only while this rank
    tests it."""
    return False


class _Posted:
    """One posted send or receive of ringcomm's own road. ``test`` is what every waiter polls:
    True once the transport is done with it; meanwhile it watches the deadline and, every
    DIAGNOSE_EVERY seconds, looks for a peer's abort notice and for a message that can never
    match. One object per call instead of a closure per concern: after a large message the
    caches are cold, and every object and call on this road then costs microseconds
    (benchmarks/p2p_cold.py)."""
    __slots__ = ("comm", "call", "work", "request", "sending", "deadline", "next_probe")

    def __init__(self, comm: Communicator, call: Call, work: Work, request, sending: bool = False):
        self.comm, self.call, self.work, self.request, self.sending = comm, call, work, request, sending
        now = time.monotonic()
        self.deadline = None if comm.timeout is None else now + comm.timeout
        self.next_probe = now + executor.DIAGNOSE_EVERY

    def test(self) -> bool:
        return self.moved() or self.stalled(self.call.peer)

    def moved(self) -> bool:
        """Whether the transport is done with it: a send once its receiver has it (buffered: the
        caller's array may change), a receive once its bytes are in."""
        try:
            return self.request.buffered() if self.sending else self.request.test()
        except CommError as err:   # the transport's words, after the call's own
            raise type(err)(f"{self.work.description}: {err}") from None

    def _unmatched(self) -> str:
        """Why a send may wait forever on a correct-looking program: its receiver reads it out of
        the caller's array, so it needs the matching recv posted (MPI's rendezvous)."""
        if not (self.sending and self.request.rendezvous()):
            return ""
        return (f"; rank {self.call.peer} did not receive it: a send this large is read by its receiver out of "
                f"the array, so it completes only once the matching recv is posted (post the recv first, or "
                f"send with async_op=True and wait after receiving)")

    def stalled(self, peer: Optional[int]) -> bool:
        """Raise if the operation can no longer finish (False while it may)."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise CommTimeoutError(f"{self.work.description}: timed out after {self.comm.timeout:g} s "
                                   f"({self.call.count} x {self.call.dtype.name}){self._unmatched()}")
        if now < self.next_probe:
            return False
        self.next_probe = now + executor.DIAGNOSE_EVERY
        transport = self.comm.transport
        notice = transport.probe(peer, ABORT_TAG)
        if notice is not None:
            raise PeerAbortedError(f"{self.work.description}: {transport.read_notice(notice)}")
        # A peer that closed this communicator (executor._Watch.diagnose), or one whose process
        # ended: where no window spans the communicator (it reaches other nodes), the transport
        # of the peer's route tells, if it can see the peer (shm: a rank of this node).
        window = transport.window
        gone = None if peer is None else window.gone(peer) if window is not None else transport.peer_gone(peer)
        if gone is not None and not self.moved():
            raise PeerAbortedError(f"{self.work.description}: {gone}")
        if not self.sending and peer is not None:
            first = transport.probe(peer)
            reason = None if first is None else describe_p2p_mismatch(first[1], self.call.dtype.name, self.call.tag,
                                                                      peer)
            if reason:
                raise MismatchError(f"{self.work.description}: {reason}")
        return False


class _InTurn(_Posted):
    """A receive from any rank, or one from a given rank posted while one from any rank under
    its tag is unmatched: it takes its message in posting order, as MPI matches them.

    A receive from any rank takes the first message under its tag nobody has claimed. Tested
    when its Work was waited, one waited before earlier ones took their messages (waits in
    reverse order got the messages in reverse), and a receive from rank r posted behind one from
    any rank claimed r's next message at once, before the earlier receive could. So these wait
    in ``comm._unmatched``, in posting order, and a test lets every earlier one under the tag
    match first (tests run under the engine's exec lock, one at a time)."""
    __slots__ = ("tag",)

    def __init__(self, comm: Communicator, call: Call, work: Work, tag: int):
        super().__init__(comm, call, work, None)
        self.tag = tag
        comm._unmatched.append(self)

    def test(self) -> bool:
        if self.request is None:
            try:
                for earlier in [op for op in self.comm._unmatched if op.tag == self.tag]:
                    if not earlier._match() or earlier is self:
                        break
                if self.request is None:
                    return self.stalled(None)
            except BaseException:
                self._unlist()   # failed: it must not take a message from a later receive
                raise
        return self.moved() or self.stalled(self.work.source)

    def _match(self) -> bool:
        """Claim this receive's message: from its rank, the next one; from any rank, the first
        under the tag nobody has claimed (False if there is none yet)."""
        transport = self.comm.transport
        if self.call.peer is None:
            hit = transport.probe(None, self.tag)
            if hit is None:
                return False
            self.work.source = hit[0]
        self.request = transport.irecv(self.call.out.flat, self.work.source, self.tag)
        self._unlist()
        return True

    def _unlist(self) -> None:
        try:
            self.comm._unmatched.remove(self)
        except ValueError:
            pass

    def cancel(self) -> None:
        self._unlist()
        if self.request is not None:
            self.request.cancel()


def with_deadline(test: Callable[[], bool], timeout: Optional[float], work: Work,
                  aborted: Callable[[], Optional[str]] = lambda: None) -> Callable[[], bool]:
    """``test`` that raises CommTimeoutError once ``timeout`` seconds have passed unfinished, and
    PeerAbortedError once ``aborted()`` (asked every DIAGNOSE_EVERY seconds) names a peer that
    gave up: for the reference backends' ``_post``, whose library's tests have neither. A recv
    on backend mpi or gloo whose peer was interrupted waited out the whole timeout."""
    deadline = deadline_of(timeout)
    next_probe = time.monotonic() + executor.DIAGNOSE_EVERY

    def guarded() -> bool:
        nonlocal next_probe
        if test():
            return True
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise CommTimeoutError(f"{work.description}: timed out after {timeout:g} s")
        if now >= next_probe:
            next_probe = now + executor.DIAGNOSE_EVERY
            why = aborted()
            if why is not None and not test():
                raise PeerAbortedError(f"{work.description}: {why}")
        return False
    return guarded


def _p2p_description(name: str, seq: int, peer: Optional[int], tag: int, rank: int) -> str:
    return (f"{name} p2p#{seq} {'to' if name == 'send' else 'from'} "
            f"{'any rank' if peer is None else f'rank {peer}'} (tag {tag}) on rank {rank}")
