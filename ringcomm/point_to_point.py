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
from .core.schedule import Recv, Send
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
        engine = self.engine
        scope = scope_for(call)   # device memory: posted and tested under its device and stream
        with engine.state:
            self._check_usable(call.name)
            engine.admit(f"{call.name} on rank {self.rank}")
            self._seq_p2p += 1
            seq = self._seq_p2p
            entry = self.recorder.record_p2p(seq, call.name, call.peer, call.tag, call.count, call.dtype.name)
            # With nothing issued earlier still to post, the call is posted right here (two thread
            # hand-offs cost more than a message); a blocking one also completes here, an async
            # one is left to the progress thread.
            inline = scope is None and engine.idle()
            if inline:
                engine.outstanding += 1
            # spelled only if read; of the call it keeps no buffer (a finished Work lets go of them)
            what = functools.partial(_p2p_description, call.name, seq, call.peer, call.tag, self.rank)
            work = Work(what)
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
            result = work.wait()
        return (result, work.source) if call.name == "recv" and call.peer is None else result

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
                sent = call.name == "send" and test()
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
            engine.watch(Pending(_with_deadline(test, self.timeout, work), cancel, work, entry), wake=not passive())

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
                wait_polling(_with_deadline(test, self.timeout, work), None)   # raises at the deadline
        except BaseException as err:
            settle(entry, work, f"failed: {type(err).__name__}")
            if isinstance(err, CommError):
                self._fail(err)
            raise
        settle(entry, work, "done")
        return call.result

    def _post(self, call: Call, work: Work) -> tuple:
        """Post one send or receive; return (the test the progress thread polls until it is done,
        what withdraws it, whether its peer finishes it alone: Request.passive)."""
        transport, flat = self.transport, (call.inp if call.name == "send" else call.out).flat
        tag = p2p_tag(call.dtype.name, call.tag)
        deadline = deadline_of(self.timeout)
        watch = _P2PWatch(self, call, work, deadline)
        if call.name == "send":
            # The caller's array stays untouched until the send completes (``send``'s rule), so
            # from 4 MiB on (cma.P2P_MIN_BYTES) the receiver reads it straight out of this
            # process (CMA), or where CMA is off through a pipe (shm/pipe.py), instead of
            # through the staging pool or MPI (Transport.isend_p2p).
            request = transport.isend_p2p(flat, call.peer, tag)

            def sent() -> bool:
                return request.buffered() or watch.stalled(call.peer, Send(call.peer, 0, call.count))
            return sent, request.cancel, request.passive
        if call.peer is not None:
            work.source = call.peer
            request = transport.irecv(flat, call.peer, tag)
            return (lambda: request.test() or watch.stalled(call.peer, Recv(call.peer, 0, call.count)),
                    request.cancel, not_passive)
        found: list = []

        def any_source() -> bool:   # find the first message under this tag, then receive it
            if not found:
                hit = transport.probe(None, tag)
                if hit is None:
                    return watch.stalled(None, Recv(-1, 0, call.count))
                work.source = hit[0]
                found.append(transport.irecv(flat, hit[0], tag))
            return found[0].test() or watch.stalled(work.source, Recv(work.source, 0, call.count))
        return any_source, lambda: found and found[0].cancel(), not_passive


def not_passive() -> bool:
    """A receive (or a reference library's send) is never passive: it moves only while this rank
    tests it."""
    return False


class _P2PWatch:
    """Deadline and diagnosis of one point-to-point operation (False while it may still finish)."""

    def __init__(self, comm: Communicator, call: Call, work: Work, deadline: Optional[float]):
        self.comm, self.call, self.work, self.deadline = comm, call, work, deadline
        self.next_probe = time.monotonic() + executor.DIAGNOSE_EVERY

    @property
    def what(self) -> str:
        return self.work.description

    def stalled(self, peer: Optional[int], op) -> bool:
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise CommTimeoutError(f"{self.what}: timed out after {self.comm.timeout:g} s "
                                   f"({self.call.count} x {self.call.dtype.name})")
        if now < self.next_probe:
            return False
        self.next_probe = now + executor.DIAGNOSE_EVERY
        transport = self.comm.transport
        notice = transport.probe(peer, ABORT_TAG) if peer is not None else transport.probe(None, ABORT_TAG)
        if notice is not None:
            raise PeerAbortedError(f"{self.what}: {executor.read_notice(transport, notice)}")
        if self.call.name == "recv" and peer is not None:
            first = transport.probe(peer)
            reason = None if first is None else describe_p2p_mismatch(first[1], self.call.dtype.name, self.call.tag,
                                                                      peer)
            if reason:
                raise MismatchError(f"{self.what}: {reason}")
        return False


def _with_deadline(test: Callable[[], bool], timeout: Optional[float], work: Work) -> Callable[[], bool]:
    """``test`` that raises CommTimeoutError once ``timeout`` seconds have passed unfinished (the
    reference backends' tests have no deadline of their own)."""
    deadline = deadline_of(timeout)

    def guarded() -> bool:
        if test():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            raise CommTimeoutError(f"{work.description}: timed out after {timeout:g} s")
        return False
    return guarded


def _p2p_description(name: str, seq: int, peer: Optional[int], tag: int, rank: int) -> str:
    return (f"{name} p2p#{seq} {'to' if name == 'send' else 'from'} "
            f"{'any rank' if peer is None else f'rank {peer}'} (tag {tag}) on rank {rank}")
