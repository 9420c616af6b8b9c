"""Handles for asynchronous collectives."""
from __future__ import annotations

import threading
from typing import Optional

from .errors import CommTimeoutError
from .transport.polling import wait_polling


class Work:
    """The result of ``async_op=True``: ``wait()`` returns the output buffer or raises its error."""

    __slots__ = ("description", "_done", "_result", "_error", "source", "_drive")

    def __init__(self, description: str):
        self.description = description
        self.source = None   # the sender of a receive from any rank, once it completed
        self._done = threading.Event()
        self._result = None
        self._error: Optional[BaseException] = None
        self._drive = None   # a posted send/recv: tests it once from the waiting thread (Engine.drive)

    def wait(self, timeout: Optional[float] = None):
        drive, left = self._drive, timeout
        if drive is not None and not self._done.is_set():
            # Complete it from here rather than sleep until the progress thread next looks at it.
            if not wait_polling(lambda: self._done.is_set() or drive(), timeout):
                left = 0.0   # the time is spent: a last look, not a second wait
        if not self._done.wait(left):
            raise CommTimeoutError(f"{self.description}: not complete after waiting {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        done = self._done
        if not done.is_set() and self._drive is not None:
            self._drive(False)   # a posted send/recv: one test, unless another thread is testing it
        return done.is_set()

    def exception(self) -> Optional[BaseException]:
        return self._error if self._done.is_set() else None

    def _finish(self, result=None, error: Optional[BaseException] = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"<Work {self.description} {state}>"
