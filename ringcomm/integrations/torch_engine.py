"""When the "ringcomm" process groups issue their calls, and the threads that complete them.

**One issue order on every rank.** ringcomm pairs collectives across ranks by the order they are
issued. A program's own calls come in program order, the same on every rank. A call made from
a future's callback (torch's PowerSGD hook all-reduces inside ``then``) comes whenever that
callback runs, which is a matter of timing: passed straight to the communicator, rank 0 might
issue bucket 1's all-reduce before bucket 0's callback issues its own and rank 1 after, and the
two would be reduced together (an error when their sizes differ, wrong numbers when they
agree). Only a call whose future was handed to Python (``get_future()``: *watched*) can have
such callbacks; torch's C++ callers get a typed future whose callbacks (casts) issue nothing.
So the Engine issues

- a call made by a callback of call *j* once every watched call before *j* has finished its
  callbacks;
- any other call at once, unless a watched call has not finished its callbacks: then it waits
  in a queue (the caller does not) until none has.

Every rank thus issues the same sequence: the decision to queue depends only on program order
(was the future asked for before this call?), and a queued call goes after the callbacks that
were already attached when it was made, whether they ran before or after it. A call behind a
watched one is handed to the communicator only once the earlier one's callbacks have returned,
which costs a thread hand-off per collective; calls nobody asked the future of (plain
``dist.all_reduce``, torch's DDP without a Python hook) go straight through. A callback that
waits for a call made later *outside* callbacks would wait forever; the queue's stall check
turns that into an error and aborts the communicator.

**Completion.** One thread at a time *leads*: it waits for the oldest issued call's ringcomm
Works. Before it completes a watched call's futures (running their callbacks, which may block,
as PowerSGD's do until their own all-reduce is back), it passes the lead to an idle thread,
starting one when none is idle and calls are queued. An unwatched call has only the Engine's
own callbacks, so the leader completes it itself and leads on, without a thread hand-off;
should Python ask for that future meanwhile, ``watch`` passes the lead on for it. ``submit``
starts a thread when nobody leads or idles. Up to two idle threads are kept; the rest end.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Optional

from ..errors import CommError, CommTimeoutError
from ..transport.polling import join_threads
from .torch_work import ABORT_GRACE, Pending


class Engine:
    KEEP_IDLE = 2

    def __init__(self, name: str, comm=None):
        self._name = name
        self._comm = comm                         # its threads may call on the caller's behalf
        self._cv = threading.Condition()
        self._next = 0                            # index of the next call issued
        self._live: dict = {}                     # index -> Pending, until its callbacks returned
        self._watched: set = set()                # live indexes whose future Python was given
        self._deferred: collections.deque = collections.deque()   # calls waiting for their turn
        self._queue: collections.deque = collections.deque()      # issued calls, to settle in order
        self._last: Optional[Pending] = None      # the latest call submitted
        self._progress = time.monotonic()         # last time a call settled or finished callbacks
        self._leading = False
        self._inline: Optional[Pending] = None     # completed by the leading thread, still leading
        self._idle = 0
        self._started = 0
        self._threads: list = []                  # those started and not yet seen to end
        self._closed = False
        self._local = threading.local()           # .publishing: index whose callbacks run here
        self.busy_seconds = 0.0                   # time some collective was in flight
        self._last_done = 0.0

    # ---- issuing ------------------------------------------------------------------------------
    def submit(self, pending: Pending, blocking: bool = False) -> None:
        """Issue ``pending`` now or queue it; raises the communicator's error if issued now.

        ``blocking``: the caller waits at once. With nothing else in flight the collective then
        runs right here, in the caller's thread, as a plain synchronous ringcomm call (no thread
        hand-offs), unless the group's timeout is shorter than the communicator's, which only
        the completer enforces.
        """
        parent = getattr(self._local, "publishing", None)
        group = pending.group
        with self._cv:
            self._last = pending
            if parent is None and (self._watched or self._deferred):
                self._deferred.append(pending)
                return
            if parent is not None:
                self._await_turn(parent, pending)
            if not (blocking and parent is None and not self._live
                    and (group.comm.timeout is None or pending.timeout >= group.comm.timeout)):
                self._issue(pending)
                return
            index = self._next
            self._next += 1
            self._live[index] = pending     # later calls see it in flight meanwhile
        pending.run_inline(index)
        with self._cv:
            self._account(pending)
            self._progress = time.monotonic()
        pending.publish()    # nobody holds its future yet: no callbacks run here
        self._callbacks_returned(pending)

    def watch(self, pending: Pending) -> None:
        """Python was given ``pending``'s future: callbacks on it may issue collectives, or block."""
        with self._cv:
            pending.watched = True
            if pending.index in self._live:
                self._watched.add(pending.index)
            if self._inline is pending:   # being completed by the leading thread: take its lead
                self._inline = None
                self._hand_on_lead()

    def _await_turn(self, parent: int, pending: Pending) -> None:
        limit = time.monotonic() + pending.group.timeout
        while any(i < parent for i in self._watched):
            left = limit - time.monotonic()
            if left <= 0:
                earlier = ", ".join(self._live[i].what for i in sorted(self._watched) if i < parent)
                raise CommTimeoutError(
                    f"{pending.what}, called from a callback of {self._live[parent].what}: the callbacks "
                    f"of {earlier} did not return within the group's timeout of {pending.group.timeout:g} s "
                    f"(calls made in callbacks are issued in the order of the calls they follow)")
            self._cv.wait(left)

    def _issue(self, pending: Pending) -> None:
        """Under the lock: give ``pending`` the next index and launch it; it settles either way."""
        index = self._next
        self._next += 1
        self._live[index] = pending
        if pending.watched:
            self._watched.add(index)
        try:
            pending.launch(index)
        finally:
            self._queue.append(pending)
            if not self._leading and self._idle == 0:
                self._start_thread()
            self._cv.notify_all()

    def _callbacks_returned(self, pending: Pending) -> None:
        with self._cv:
            self._live.pop(pending.index, None)
            self._watched.discard(pending.index)
            self._progress = time.monotonic()
            while not self._watched and self._deferred:
                try:
                    self._issue(self._deferred.popleft())
                except BaseException:   # noqa: BLE001 - kept as that call's outcome
                    pass
            self._cv.notify_all()

    # ---- stalls, aborts, shutdown -----------------------------------------------------------------
    def check_stall(self, pending: Pending) -> None:
        """Called by a waiter on a queued call: fail the queue once nothing moved for too long."""
        with self._cv:
            idle = time.monotonic() - self._progress
            if pending.index is not None or pending.done.is_set() or idle <= pending.group.timeout + ABORT_GRACE:
                return
            blocking = ", ".join(self._live[i].what for i in sorted(self._watched))
        reason = (f"{pending.what}: not issued after {idle:.0f} s, because the callbacks of {blocking} have "
                  f"not returned (calls are issued only after earlier calls' callbacks, so that every "
                  f"rank issues the same sequence); the communicator was aborted")
        self.fail_queued(CommTimeoutError(reason))
        pending.group.abort_communicator(reason)

    def fail_queued(self, err: BaseException) -> None:
        """Calls not issued yet never will be: each completes with ``err``."""
        with self._cv:
            while self._deferred:
                pending = self._deferred.popleft()
                pending.error = err
                self._queue.append(pending)
            if self._queue and not self._leading and self._idle == 0:
                self._start_thread()
            self._cv.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every call submitted so far has an outcome; False if ``timeout`` ran out."""
        with self._cv:
            last = self._last
        end = time.monotonic() + timeout
        while last is not None and not last.done.wait(min(0.5, max(0.0, end - time.monotonic()))):
            if time.monotonic() >= end:
                return False
            self.check_stall(last)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Let the threads go and wait (at most ``timeout`` seconds) until they have ended: a
        thread that ends drops the last references to its calls' tensors and futures, whose
        destructors take the GIL back, and a thread doing that while the interpreter exits is
        ended inside torch's C++, which aborts the process ("terminate called without an
        active exception"; seen once in CI after tests/mpi_jobs/torch_parallelisms.py had passed
        every check, as with gloo's send/recv threads: backends/c10d.py, join_waiters)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            threads = self._threads
        join_threads(threads, timeout)   # not the calling thread: a callback of ours may close the group

    # ---- completion -------------------------------------------------------------------------------
    def _start_thread(self) -> None:
        self._started += 1
        thread = threading.Thread(target=self._serve, daemon=True, name=f"{self._name}-{self._started}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        if self._comm is not None:
            # Its calls (queued ones, those of callbacks) come in the one issue order (module
            # doc), so the communicator's one-thread rule must not refuse them.
            self._comm._allow_thread(thread)
        thread.start()

    def _serve(self) -> None:
        try:
            self._lead()
        finally:
            if self._comm is not None:
                self._comm._allow_thread(threading.current_thread(), allow=False)

    def _lead(self) -> None:
        while True:
            with self._cv:
                self._idle += 1
                while (self._leading or not self._queue) and not self._closed:
                    self._cv.wait()
                self._idle -= 1
                if not self._queue:          # closed and nothing left
                    return
                self._leading = True
                pending = self._queue.popleft()
            if pending.index is not None:
                pending.settle()
            else:
                pending.fail(pending.error or CommError(f"{pending.what}: never issued"))
            with self._cv:
                self._account(pending)
                self._progress = time.monotonic()
                if pending.watched:
                    self._hand_on_lead()
                else:
                    self._inline = pending   # only our own callbacks: publish it still leading
            self._local.publishing = pending.index
            try:
                pending.publish()
            finally:
                self._local.publishing = None
            with self._cv:
                if self._inline is pending:  # nobody asked for its future meanwhile: lead on
                    self._inline = None
                    self._leading = False    # and take it again at once, without a hand-off
            self._callbacks_returned(pending)
            with self._cv:
                if self._idle >= self.KEEP_IDLE:
                    return

    def _hand_on_lead(self) -> None:
        """Under the lock: another thread settles the next calls while this one runs callbacks."""
        self._leading = False
        if self._queue and self._idle == 0:
            self._start_thread()
        self._cv.notify_all()

    def _account(self, pending: Pending) -> None:
        # Collectives run one at a time, so each one's share starts at its issue or at the
        # previous one's completion, whichever is later (queued time is not counted twice).
        done = time.perf_counter()
        self.busy_seconds += done - max(pending.issued, self._last_done)
        self._last_done = done
