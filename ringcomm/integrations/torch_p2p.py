"""Works of the "ringcomm" process group's send, recv and recv_anysource.

Point-to-point operations complete on their own, not in the collectives' issue order: ringcomm
posts them in issue order (which is what pairs them, per peer and tag) and its progress thread
completes them between collectives (core/progress.py). Settling them in line with collectives
would deadlock valid programs: a receive posted early, whose sender first waits for a
collective this rank issues later, would hold up that collective's Work forever. So they never
enter the Engine's queue (torch_engine.py); a call from a callback needs no turn either, since
no collective can be paired with a send.

``wait()`` raises the operation's error and writes a staged copy back only after success; the
future, made when asked for, completes from a thread of its own, as does the profiler range
(torch's profiler wants it ended on another thread than the one that began it, like gloo's).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .torch_work import end_range, seconds


class P2PWork(dist.Work):
    def __init__(self, work, result: list, finish: Optional[Callable] = None, profiled=None):
        super().__init__()
        self._work, self._result, self._finish = work, result, finish
        self._lock = threading.Lock()
        self._finished = False
        self._future = None
        if profiled is not None:
            threading.Thread(target=self._end_range_when_done, args=(profiled,), daemon=True,
                             name="ringcomm-c10d-p2p-profile").start()

    def _end_range_when_done(self, profiled) -> None:
        try:
            self._work.wait()
        except Exception:   # noqa: BLE001 - the error is the caller's to see, in wait()
            pass
        end_range(profiled)

    def _settle(self) -> None:
        """Raise the operation's error; after success, write back once."""
        self._work.wait()
        with self._lock:
            if not self._finished:
                self._finished = True
                if self._finish is not None:
                    self._finish()

    def wait(self, timeout=None) -> bool:
        t = seconds(timeout)
        if t is not None:
            self._work.wait(t)   # CommTimeoutError when not done: the operation goes on
        self._settle()
        return True

    def synchronize(self) -> None:
        self._settle()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_completed() and self._work.exception() is None

    def exception(self):
        return self._work.exception()

    def result(self):
        return self._result

    def _source_rank(self) -> int:
        """The sender of a recv_anysource (dist.recv(src=None) asks, after wait())."""
        return -1 if self._work.source is None else int(self._work.source)

    def get_future(self):
        with self._lock:
            if self._future is None:
                signal = torch.futures.Future()
                self._future = signal.then(self._value_or_raise)   # a real C++ error on failure
                threading.Thread(target=self._complete, args=(signal,), daemon=True,
                                 name="ringcomm-c10d-p2p-future").start()
            return self._future

    def _complete(self, signal) -> None:
        try:
            self._settle()
        except BaseException:   # noqa: BLE001 - _value_or_raise raises it into the future
            pass
        signal.set_result(None)

    def _value_or_raise(self, _signal):
        self._settle()
        return self._result

    def __repr__(self) -> str:
        return f"<ringcomm c10d P2PWork {self._work.description} {'done' if self.is_completed() else 'pending'}>"
