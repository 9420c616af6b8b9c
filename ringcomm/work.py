"""Handles for asynchronous collectives."""
from __future__ import annotations

import threading
from typing import Callable, Optional, Union

from .errors import CommTimeoutError
from .transport.polling import wait_polling

# Guards the moment a Work gets its Event: only a thread that has to block on an unfinished Work
# makes one, so the many Works finished before anyone waits (a small send done at its copy, a
# receive completed by the thread that waits on it) never pay for an Event (3 us to make, 1.5 to
# set: a fifth of a small send). One lock for all: it is held for a few bytecodes.
_EVENTS = threading.Lock()


class Work:
    """The result of ``async_op=True``: ``wait()`` returns the output buffer or raises its error.
    One is made for every send and receive, blocking ones too, so it costs little: no Event unless
    a thread has to sleep on it, and a description given as a function is spelled only if read
    (most calls finish without anyone reading theirs)."""

    __slots__ = ("_what", "_finished", "_event", "_result", "_error", "source", "_drive")

    def __init__(self, description: Union[str, Callable[[], str]]):
        self._what = description
        self.source = None   # the sender of a receive from any rank, once it completed
        self._finished = False
        self._event: Optional[threading.Event] = None
        self._result = None
        self._error: Optional[BaseException] = None
        self._drive = None   # a posted send/recv: tests it once from the waiting thread (Engine.drive)

    @property
    def description(self) -> str:
        what = self._what
        if not isinstance(what, str):
            what = self._what = what()
        return what

    def wait(self, timeout: Optional[float] = None):
        drive, left = self._drive, timeout
        if drive is not None and not self._finished:
            # Complete it from here rather than sleep until the progress thread next looks at it.
            if not wait_polling(lambda: self._finished or drive(), timeout):
                left = 0.0   # the time is spent: a last look, not a second wait
        if not self._block(left):
            raise CommTimeoutError(f"{self.description}: not complete after waiting {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _block(self, timeout: Optional[float]) -> bool:
        """Sleep until finished (at most ``timeout`` seconds); whether it is."""
        if self._finished:
            return True
        with _EVENTS:
            if self._finished:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)

    def is_completed(self) -> bool:
        if not self._finished and self._drive is not None:
            self._drive(False)   # a posted send/recv: one test, unless another thread is testing it
        return self._finished

    def exception(self) -> Optional[BaseException]:
        return self._error if self._finished else None

    def _finish(self, result=None, error: Optional[BaseException] = None) -> None:
        self._result, self._error = result, error
        with _EVENTS:
            self._finished = True
            event = self._event
        if event is not None:
            event.set()

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"<Work {self.description} {state}>"
