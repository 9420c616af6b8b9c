"""c10d Work handles of the "ringcomm" process group, and the futures they hand out.

Three promises to torch's callers, and how each is kept:

1. **An error reaches the call that failed.** A Work made by ``_create_work_from_future`` returns
   True from ``wait()`` whatever its future holds, and ``Future.set_exception`` stores the error as
   a *value* C++ cannot see, so a failed collective looked like a reduced tensor. Here ``Work`` is
   a Python subclass of ``dist.Work`` (c10d's PyWork trampoline sends C++ ``wait()`` and
   ``getFuture()`` to it too): ``wait()`` raises ringcomm's own exception, and every future
   handed out carries a real C++ error (it is the ``then`` child of a signal, and an exception
   raised in a ``then`` callback is one).
2. **Futures carry torch's types.** A future made in Python holds a Python object; torch's C++
   comm hooks (``BuiltinCommHookType.FP16_COMPRESS``) assert ``value().isTensorList()``. Only
   TorchScript can produce a typed future that completes later: ``torch.jit.fork`` of a scripted
   function that waits on the signal and returns the tensors. C++ callers get that one.
3. **No callback stalls completion.** ``then`` callbacks run in the thread that completes the
   future, and torch's PowerSGD waits on another collective inside one. The Engine
   (torch_engine.py) completes the signal from a thread that has handed its role on, so a
   blocked callback never stops later collectives from completing; Python callers get that
   future. The typed one completes on torch's inter-op pool (TorchScript resumes there), which
   callbacks that block could exhaust; so it goes only to C++ callers, whose callbacks (the
   builtin hooks' casts) never block.

Telling C++ callers from Python ones: c10d's trampoline calls the same Python ``get_future``
for both. C++ code (torch's reducer: ``state->allreduce(tensors)->getFuture()``) cannot run
Python bytecode between issuing a collective and asking for its future, so the innermost Python
frame outside the backend's modules, and its instruction, are the same at both calls; a Python caller is
always at another instruction (it made two calls) or in another frame. ``call_site`` records it.
A misjudged caller still gets a correct future: typed for Python (callbacks on the inter-op
pool) or untyped for C++ (the builtin FP16 hook then fails loudly).
"""
from __future__ import annotations

import re
import sys
import threading
import time
from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..errors import CommError, CommTimeoutError

# After the group's deadline the communicator is aborted; its collective then has this long to
# fail with ringcomm's own diagnosis (which names the step and peer) before we stop waiting.
ABORT_GRACE = 5.0
_NAMED = re.compile(r"\w+ #\d+")     # how ringcomm's messages start: "all_reduce #12 ..."
_OUR_MODULES = {__name__, __name__.rsplit(".", 1)[0] + ".torch_backend"}


def call_site():
    """The innermost Python frame outside the backend's modules, and its instruction (module doc)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _OUR_MODULES:
        frame = frame.f_back
    return None if frame is None else (id(frame), frame.f_lasti, frame.f_code)


def seconds(timeout) -> Optional[float]:
    """A c10d timeout (timedelta, seconds, None) in seconds; None for "none given".

    c10d passes kNoTimeout (0 ms) and kUnsetTimeout (-1 ms) to mean "use the default".
    """
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return value if value > 0 else None


# ---- torch.profiler ranges ---------------------------------------------------------------------
def begin_range(name: str, tensors: list):
    """A record_function range "ringcomm:<name>" with the tensors' shapes, as torch's gloo
    records "gloo:all_reduce"; ended by ``end_range`` from the thread that learns the outcome
    (so it is an async range, as gloo's are). None when no profiler is running."""
    if not torch.autograd.profiler._is_profiler_enabled:
        return None
    return torch._C._autograd._record_function_with_args_enter(f"ringcomm:{name}", *tensors)


def end_range(handle) -> None:
    if handle is not None:
        torch._C._autograd._record_function_with_args_exit(handle)


def profiling() -> bool:
    return torch.autograd.profiler._is_profiler_enabled


# ---- typed futures (TorchScript) ----------------------------------------------------------------
def _after(signal: torch.futures.Future[List[torch.Tensor]],
           tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    torch.jit.wait(signal)   # raises the signal's error, so the typed future holds it too
    return tensors


def _fork_after(signal: torch.futures.Future[List[torch.Tensor]],
                tensors: List[torch.Tensor]) -> torch.futures.Future[List[torch.Tensor]]:
    return torch.jit.fork(_after, signal, tensors)


_SCRIPTED: list = []
_SCRIPT_LOCK = threading.Lock()


def _typed_after(signal, tensors: list):
    """A C++-typed future that completes with ``tensors`` (or the error) once ``signal`` does."""
    with _SCRIPT_LOCK:   # compiled on first use (a fraction of a second): most jobs never need it
        if not _SCRIPTED:
            _SCRIPTED.append(torch.jit.script(_fork_after))
    return _SCRIPTED[0](signal, tensors)


# ---- one c10d call ----------------------------------------------------------------------------
class Pending:
    """One c10d call: how to issue it, the ringcomm Works it issued, and its outcome.

    ``result`` is the list of tensors the future carries (for allgather, the output list, as
    gloo and NCCL give it). ``finish`` (write-back of staged copies) runs only after every Work
    succeeded, so a failed collective never touches a tensor through it. The Engine decides
    when ``launch`` runs (torch_engine.py): at once, or after earlier calls' callbacks.
    """

    def __init__(self, group, collective: str, launches: list, result: list, finish: Optional[Callable], site,
                 timeout: Optional[float] = None, profiled=None):
        self.group, self.collective, self.result, self.finish = group, collective, result, finish
        self.site = site
        self.timeout = group.timeout if timeout is None else timeout   # the op's own, or its group's
        self._profiled = profiled          # its torch.profiler range, ended when the outcome is known
        self.what = f"{collective} on rank {group.rank()}"
        self._launches = launches
        self.works: list = []
        self.index: Optional[int] = None     # place in the communicator's issue order, once issued
        self.watched = False                 # Python was given its future (torch_engine.py)
        self.issued = time.perf_counter()
        self.deadline: Optional[float] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()      # outcome known and the future completed: wait() waits for it
        # The futures are made when asked for: most calls are only waited on.
        self._signal = self._future = self._typed = None
        self._published = False
        self._lock = threading.Lock()

    def launch(self, index: int) -> None:
        """Issue the ringcomm collectives, in order; raises what the communicator raises (the
        Works issued before that still complete, and the error is kept as the outcome)."""
        self.index, self.issued = index, time.perf_counter()
        try:
            for launch in self._launches:
                self.works.append(launch())
        except BaseException as err:
            self.error = err
            raise
        finally:
            if self.works:
                self.what = getattr(self.works[0], "description", None) or self.what

    def run_inline(self, index: int) -> None:
        """Run the collectives in this thread, synchronously (the Engine saw nothing else in flight)."""
        self.index, self.issued = index, time.perf_counter()
        try:
            for launch in self._launches:
                launch(False)
            if self.finish is not None:
                self.finish()
        except CommTimeoutError as err:
            self.error = self._named(self._timed_out(err, self.timeout))
        except BaseException as err:   # kept for wait() and the futures
            self.error = self._named(err)

    def _value_or_raise(self, signal):
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def future(self):
        """The future Python callers get: completed by the Engine, a real C++ error on failure
        (it is the ``then`` child of a signal)."""
        with self._lock:
            if self._future is None:
                self._signal = torch.futures.Future()
                self._future = self._signal.then(self._value_or_raise)
                if self._published:
                    self._signal.set_result(None)
                else:
                    # The first callback on it runs before anyone else's: wait() returns once
                    # get_future().value() is readable, as with torch's backends, without
                    # waiting for other callbacks.
                    self._future.add_done_callback(lambda _: self.done.set())
            return self._future

    def typed_future(self):
        future = self.future
        with self._lock:
            if self._typed is None:
                self._typed = _typed_after(future, self.result)
            return self._typed

    def settle(self) -> None:
        """Wait for every Work, then write back; record the outcome. Runs on the leading thread."""
        timeout, comm_timeout = self.timeout, self.group.comm.timeout
        # Equal or longer than ringcomm's own deadline: ringcomm fires first and names the peer.
        slack = max(1.0, 0.05 * timeout) if comm_timeout is not None and timeout >= comm_timeout else 0.0
        self.deadline = time.monotonic() + timeout + slack
        try:
            for work in self.works:
                try:
                    work.wait(max(0.0, self.deadline - time.monotonic()))
                except CommTimeoutError as err:
                    if work.is_completed():        # ringcomm's own deadline, which names the peer
                        raise self._timed_out(err, timeout) from err
                    raise self._expired(work, timeout) from None
            if self.error is None and self.finish is not None:
                self.finish()
        except BaseException as err:   # kept for wait() and the futures
            self.error = self.error or self._named(err)

    def _timed_out(self, err: CommTimeoutError, timeout: float) -> CommTimeoutError:
        """ringcomm's timeout, saying which timeout of torch's it was (the communicator's
        deadline is the largest timeout of its groups, torch_groups.Shared.retime)."""
        whose = "the process group's" if self.timeout == self.group.timeout else "this call's"
        return CommTimeoutError(f"{err} ({whose} timeout of {timeout:g} s)")

    def fail(self, err: BaseException) -> None:
        """The outcome of a call that will never be issued."""
        self.error = err

    def _named(self, err: BaseException) -> BaseException:
        """``err``, its message led by this collective's name and number when it lacks them
        (a peer's abort notice says only who aborted)."""
        if not isinstance(err, CommError) or _NAMED.match(str(err)):
            return err
        try:
            named = type(err)(f"{self.what}: {err}")
        except Exception:   # noqa: BLE001 - an error type that wants other arguments stays as it is
            return err
        named.__cause__ = err
        return named

    def _expired(self, work, timeout: float) -> CommTimeoutError:
        whose = "the process group's" if self.timeout == self.group.timeout else "its"
        reason = (f"{self.what}: not complete within {whose} timeout of {timeout:g} s; "
                  f"the communicator was aborted")
        self.group.abort_communicator(reason)
        try:
            work.wait(ABORT_GRACE)
        except CommError as err:
            if reason not in str(err):   # ringcomm saw something of its own (a peer, a step)
                reason = f"{reason} (ringcomm: {err})"
        return CommTimeoutError(reason)

    def publish(self) -> None:
        """Complete the futures, if any were asked for. Their callbacks run here, in this thread."""
        end_range(self._profiled)
        with self._lock:
            self._published = True
            signal = self._signal
        if signal is None:
            self.done.set()
        else:
            signal.set_result(None)

    def wait(self, timeout: Optional[float]) -> None:
        if timeout is not None:
            if not self.done.wait(timeout):
                raise CommTimeoutError(f"{self.what}: not complete after work.wait({timeout:g} s); the "
                                       f"collective goes on, and the tensor may still change: wait again "
                                       f"or abort the group")
        else:
            # Every issued collective is bounded by its group's deadline (+ the abort grace), and
            # one not yet issued by the engine's stall check; this only catches a stalled completer.
            while not self.done.wait(0.5):
                if self.deadline is not None and time.monotonic() > self.deadline + 2 * ABORT_GRACE + 5:
                    raise CommTimeoutError(f"{self.what}: no outcome {2 * ABORT_GRACE + 5:g} s after its "
                                           f"deadline; ringcomm's c10d completer is stalled")
                if self.index is None:
                    self.group.engine.check_stall(self)
        if self.error is not None:
            raise self.error


class Work(dist.Work):
    """What the "ringcomm" process group returns: errors raise, futures are typed (module doc)."""

    def __init__(self, pending: Pending):
        super().__init__()
        self._pending = pending

    def wait(self, timeout=None) -> bool:
        self._pending.wait(seconds(timeout))
        return True

    def synchronize(self) -> None:   # CPU work: "synchronised" means finished
        self._pending.wait(None)

    def is_completed(self) -> bool:
        return self._pending.done.is_set()

    def is_success(self) -> bool:
        return self._pending.done.is_set() and self._pending.error is None

    def exception(self):
        return self._pending.error if self._pending.done.is_set() else None

    def result(self):
        return self._pending.result

    def get_future(self):
        p = self._pending
        if call_site() == p.site:
            return p.typed_future()
        p.group.engine.watch(p)
        return p.future

    def __repr__(self) -> str:
        state = "pending" if not self.is_completed() else "failed" if self._pending.error else "done"
        return f"<ringcomm c10d Work {self._pending.what} {state}>"


class Combined(dist.Work):
    """What ``_end_coalescing`` returns: the Works of every call made since ``_start_coalescing``
    (inside ``dist._coalescing_manager`` that is one fused call; torch waits on this one)."""

    def __init__(self, works: list):
        super().__init__()
        self._works = list(works)

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self):
        return next((w.exception() for w in self._works if w.exception() is not None), None)

    def result(self):
        return [t for w in self._works for t in w.result()]

    def get_future(self):
        if len(self._works) == 1:
            return self._works[0].get_future()
        results = self.result()
        return torch.futures.collect_all([w.get_future() for w in self._works]).then(
            lambda f: [x.value() for x in f.value()] and results)
