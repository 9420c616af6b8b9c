"""How a communicator's calls run: one at a time, in the order they were issued, on one thread.

Collectives match across ranks by the order each rank issues them, so they must also *run* in
that order. A synchronous call with nothing outstanding runs inline in the caller's thread (no
hand-off); anything else is queued for the communicator's progress thread, and an async call
returns a ``Work`` at once. Point-to-point calls are posted in issue order too (so messages
between a pair under one tag stay in order, as MPI promises) but then complete on their own:
the progress thread keeps testing them between jobs, so a receive posted early never blocks the
collectives issued after it.

One thread at a time: calls on one communicator from a second thread while a call from another
thread is still in flight raise UsageError naming both threads. Two threads whose calls
interleave differently on different ranks would otherwise pair one thread's data with another's
on the peers, silently; a thread that needs collectives of its own uses ``comm.dup()``.
"""
from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Callable, Optional

from ..errors import CommError, UsageError
from ..transport.polling import MAX_SLEEP
from ..work import Work


DRIVE_BLOCK = 1e-3   # seconds a waiting thread blocks for exec before it looks again
# How long the progress thread leaves a send or receive just posted to the thread that posted it
# before it polls it too: that thread usually waits on it at once (a blocking receive after an
# async send), and two threads polling one operation fight over the GIL and exec.
GRACE = 200e-6


class Pending:
    """A posted point-to-point operation: ``test()`` -> True once done (may raise); ``cancel()``
    withdraws it from the transport (a closed communicator must not write into a buffer later);
    ``entry``: its flight-recorder entry, settled here when it completes, fails or is withdrawn."""
    __slots__ = ("test", "cancel", "work", "entry")

    def __init__(self, test: Callable[[], bool], cancel: Callable[[], None], work: Work, entry):
        self.test, self.cancel, self.work, self.entry = test, cancel, work, entry

    @property
    def what(self) -> str:
        return self.work.description


def settle(entry, work: Work, state: str) -> None:
    """The final state of a send's or receive's flight-recorder entry (diagnostics/flight_recorder.py),
    with the sender of a receive from any rank once known."""
    entry.state, entry.ended = state, time.monotonic()
    work._drive = None   # it referenced the operation and its buffer: the Work may outlive both
    if entry.peer is None:
        entry.source = work.source


class Engine:
    def __init__(self, label: str, fail: Callable[[BaseException], None]):
        self.label = label               # "rank 3" (names the thread)
        self._fail = fail                # marks the communicator broken (and tells peers)
        self.state = threading.Lock()    # guards the queue, the counts and the owner
        self.wake = threading.Condition(self.state)
        self.exec = threading.Lock()     # held while a job moves data
        self.queue: collections.deque = collections.deque()
        self.pending: list = []          # posted point-to-point operations, completed by the progress thread
        self.outstanding = 0             # calls queued or running on the progress thread, p2p posted
        # The thread running a blocking collective inline, or None. Apart from ``outstanding``
        # because only that thread clears it, so it does so with a plain store and no lock (a
        # delegate may queue work meanwhile, which a lock-free decrement of a shared count would lose).
        self.inline: Optional[threading.Thread] = None
        self.owner: Optional[threading.Thread] = None   # the thread whose calls are in flight
        self.delegates: set = set()      # threads that may call on the owner's behalf
        self.thread: Optional[threading.Thread] = None
        self.idle_wait = False           # the progress thread waits for work with no timeout
        self.closed = False

    # ---- submission ----------------------------------------------------------------------------
    def admit(self, what: str) -> threading.Thread:
        """The thread rule (module doc), checked under ``state`` before a call takes a number
        (``what``: its name); returns the calling thread."""
        me = threading.current_thread()
        busy = self.outstanding or self.inline is not None
        if busy and self.owner is not me and me not in self.delegates and self.owner not in self.delegates:
            raise UsageError(f"{what} on {self.label}: called from thread {me.name!r} while a call from thread "
                             f"{self.owner.name!r} is still in flight on this communicator. A "
                             f"communicator is used by one thread at a time (collectives from "
                             f"different threads would pair up differently on different ranks); "
                             f"give each thread its own with comm.dup()")
        if not busy:
            self.owner = me
        return me

    def enqueue(self, item) -> None:
        """Queue ``item`` (under ``state``) for the progress thread."""
        self.queue.append(item)
        self.outstanding += 1
        self._start()

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, daemon=True, name=f"ringcomm-progress-{self.label}")
            self.thread.start()
        self.wake.notify()

    def idle(self) -> bool:
        """Nothing issued earlier waits to be posted or runs (under ``state``): a call may post
        in the caller's thread without overtaking one. Pending point-to-point operations are
        posted already and do not count."""
        return self.outstanding == len(self.pending) and self.inline is None

    def watch(self, op: "Pending", wake: bool = True) -> None:
        """Hand a posted point-to-point operation to the progress thread, which completes it, as
        does a thread waiting on its Work or asking whether it is done (under ``state``; it counts
        as outstanding already). ``wake=False``: an operation the peer finishes alone (a send
        whose receiver reads it, ``Request.passive``) does not wake an idle progress thread: on a
        machine whose cores the ranks already keep busy, that wake-up costs a third of the
        message (a 4 MiB exchange read by CMA, 2 ranks: 468-653 us against 321-428), and
        the next call wakes it."""
        self.pending.append(op)
        op.work._drive = functools.partial(self.drive, op)   # called with no frame of its own
        if self.thread is None or (self.idle_wait and wake):   # else it comes round within its nap
            self._start()

    def claim_inline(self, me: threading.Thread) -> bool:
        """Under ``state``: with nothing queued, posted or running, make ``me`` the inline thread
        and take ``exec`` (without waiting: only a thread finishing its last job can still hold
        it, and then the call takes the ordinary road). ``release_inline`` ends it."""
        if self.outstanding or self.inline is not None or not self.exec.acquire(False):
            return False
        self.owner = self.inline = me
        return True

    def release_inline(self) -> None:
        """The inline call is over (its own thread, no lock: see ``inline``)."""
        self.inline = None
        self.exec.release()

    def done(self) -> None:
        with self.state:
            self.outstanding -= 1

    # ---- the progress thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        nap = 10e-6
        while True:
            with self.state:
                if not self.queue and not self.pending and not self.closed:
                    self.idle_wait = True
                    while not self.queue and not self.pending and not self.closed:
                        self.wake.wait()
                    self.idle_wait = False
                    nap = GRACE
                if not self.queue and self.closed and self.pending:
                    self._cancel_pending()
                if not self.queue and not self.pending:
                    return
                item = self.queue.popleft() if self.queue else None
                if item is None and self.pending:
                    self.wake.wait(nap)   # a new call wakes us at once
            if item is not None:
                item()
                nap = 10e-6
            if self.pending and self._poll():
                nap = 10e-6
            else:
                nap = min(2 * nap, MAX_SLEEP)

    def _poll(self) -> bool:
        """Test every pending point-to-point operation once; True if one finished."""
        finished = False
        for op in list(self.pending):
            with self.exec:
                if op in self.pending:   # not completed by a waiting thread meanwhile (drive)
                    finished = self._test(op) or finished
        return finished

    def drive(self, op: Pending, block: bool = True) -> bool:
        """Test ``op`` once from the thread that waits on its Work (``block``) or asks whether it
        is done; True once the Work is finished. False while the progress thread or a job still
        holds ``exec``."""
        work = op.work
        if work._finished:
            return True
        # Block (without the GIL) rather than spin while another thread holds exec: a spinning
        # waiter keeps the GIL from the thread it waits for for up to the switch interval (5 ms).
        if not (self.exec.acquire(timeout=DRIVE_BLOCK) if block else self.exec.acquire(False)):
            return False
        try:
            if op in self.pending:
                self._test(op)
        finally:
            self.exec.release()
        return work._finished

    def _test(self, op: Pending) -> bool:
        """Test ``op`` (under ``exec``); when it is over, settle it: True."""
        try:
            done = op.test()
        except BaseException as err:   # surfaced through its Work, and the communicator fails
            self.pending.remove(op)
            settle(op.entry, op.work, f"failed: {type(err).__name__}")   # before _fail dumps the recorder
            if isinstance(err, CommError):
                self._fail(err)
            op.work._finish(None, err)
            self.done()
            return True
        if done:
            self.pending.remove(op)
            settle(op.entry, op.work, "done")
            op.work._finish(op.work._result, None)
            self.done()
        return done

    def _cancel_pending(self) -> None:
        """close() with sends or receives nobody matched: withdraw them, their Works raise. One
        last test first: a passive send (``watch``) may have been acknowledged unobserved."""
        for op in self.pending:
            with self.exec:
                try:
                    finished = op.test()
                except Exception:
                    finished = False   # failed, past its deadline, or the transport is gone: withdrawn
                if not finished:
                    try:
                        op.cancel()
                    except Exception:
                        pass   # the transport is gone already
            if finished:
                settle(op.entry, op.work, "done")
                op.work._finish(op.work._result, None)
            else:
                settle(op.entry, op.work, "cancelled")
                op.work._finish(None, CommError(f"{op.what}: cancelled: the communicator was closed before it "
                                                f"completed"))
            self.outstanding -= 1
        self.pending.clear()

    def fail_pending(self, err: BaseException) -> None:
        """After a failure: pending operations will never complete cleanly (progress thread only)."""
        for op in self.pending:
            settle(op.entry, op.work, "failed: CommError")
            op.work._finish(None, CommError(f"{op.what}: abandoned: {err}"))
            self.done()
        self.pending.clear()

    def close(self, timeout: float) -> bool:
        """No new calls; let queued ones finish (each bounded by its own deadline), and a call
        running inline in another thread too: the transport goes away after this, and a call
        still reading its shared memory would fail on a torn-down ring, or fault on unmapped
        pages. False if something still runs after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        me = threading.current_thread()
        with self.state:
            self.closed = True
            self.wake.notify_all()
        thread = self.thread
        if thread is not None and thread is not me:
            thread.join(timeout=timeout)
            if thread.is_alive():
                return False
        if me is self.inline or me is thread:   # closed from inside a call: that call holds exec
            return True
        if not self.exec.acquire(timeout=max(0.0, end - time.monotonic())):
            return False
        self.exec.release()
        return True


def deadline_of(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout
