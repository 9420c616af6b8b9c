"""Send and receive framed by a header, for a library whose point-to-point trusts the receiver.

torch's gloo pairs a send with a receive by (peer, tag) and never compares their lengths: a
shorter message left the rest of the receive buffer as it was and succeeded (two ones into three
sevens: [1, 1, 7]); a longer one killed the receiving process with SIGABRT from gloo's thread
(pair.cc: "op.preamble.length <= op.nbytes"); an empty receive from any rank failed inside gloo
and left the group unusable. ringcomm promises a MismatchError and an untouched buffer instead.

So a send goes as two messages: a header (payload bytes, dtype, the send's number in its
(sender, receiver, tag) stream) under tag 2 * tag + 1, then the payload, if it has bytes, under
2 * tag. A receive takes the header first and only then posts the payload's receive: into the
caller's buffer when the two agree, else into scratch of the header's size (the stream stays in
step) and then it raises MismatchError. A receive from any rank learns its sender from the
header. The payload receives of one (sender, tag) are posted in the order of the sends' numbers,
whichever waiting thread got its header first, because gloo hands a (pair, tag)'s messages to
its receives in the order they were posted: the payload of send k lands where header k did.
Header receives keep MPI's posting order: gloo gives a message to the pair's own receive before
an earlier one from any rank, and one run in ten handed rank 1's first message to the receive
posted second. So while a receive from any rank under a tag waits for its header, later
receives under that tag wait to post theirs (``Frames.blocking``), each behind every earlier
one that still blocks (a receive from any rank until it has its header, a deferred one until it
has posted).
The price is a second message per send, on a backend that is there for comparison.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import torch

from ..core.envelope import DTYPE_NAMES
from ..errors import CommTimeoutError, MismatchError


class Frames:
    """The numbers of one communicator's framed streams: sends numbered per (receiver, tag),
    payload receives posted per (sender, tag)."""

    def __init__(self):
        self.turn = threading.Condition()
        self.sent: dict = {}
        self.posted: dict = {}
        self.blocking: dict = {}   # tag -> events of receives that later ones must wait for (module doc)

    def release(self, tag: int, event: threading.Event) -> None:
        with self.turn:
            if event in self.blocking.get(tag, ()):
                self.blocking[tag].remove(event)
        event.set()

    def next_send(self, dst: int, tag: int) -> int:
        """(under ``turn``) The number of the next send to ``dst`` under ``tag``."""
        k = self.sent.get((dst, tag), 0)
        self.sent[(dst, tag)] = k + 1
        return k

    def wait_turn(self, src: int, tag: int, k: int, deadline: Optional[float]) -> bool:
        """Block until payload receive ``k`` of (src, tag) is next to post; False at the deadline."""
        with self.turn:
            while self.posted.get((src, tag), 0) != k:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.turn.wait(left)
            return True

    def done_turn(self, src: int, tag: int) -> None:
        with self.turn:
            self.posted[(src, tag)] = self.posted.get((src, tag), 0) + 1
            self.turn.notify_all()


class FramedPointToPoint:
    """``_post`` (point_to_point.py) for a c10d backend (``pg``, ``timeout``, ``tensor``,
    ``_waited``, ``frames``): the module docstring."""

    def _post(self, call, work):
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        run = self._framed_send(call) if call.name == "send" else self._framed_recv(call, work, deadline)
        return self._waited(run, work)   # c10d.py: a thread runs it

    def _framed_send(self, call):
        inp, _ = call.arrays()
        payload = self.tensor(inp, call.dtype)
        nbytes = payload.numel() * payload.element_size()
        header = torch.tensor([nbytes, DTYPE_NAMES.index(call.dtype.name), 0], dtype=torch.int64)
        frames = self.frames
        with frames.turn:   # numbered and posted together: header k is posted before header k + 1
            header[2] = frames.next_send(call.peer, call.tag)
            handles = [self.pg.send([header], call.peer, 2 * call.tag + 1)]
            if nbytes:
                handles.append(self.pg.send([payload], call.peer, 2 * call.tag))

        def run() -> None:
            # gloo's Work does not keep the tensors alive, and ``payload`` may view the memory
            # of a tensor only the call holds (an async send of a temporary; core/buffers.py
            # host_view): both live until the send is done.
            keep = (call, header, payload)
            for handle in handles:
                handle.wait()
            del keep
        return run

    def _framed_recv(self, call, work, deadline):
        _, out = call.arrays()
        target = self.tensor(out, call.dtype)
        want = (target.numel() * target.element_size(), DTYPE_NAMES.index(call.dtype.name))
        header = torch.zeros(3, dtype=torch.int64)
        tag = call.tag
        frames = self.frames

        def post():
            if call.peer is None:
                return self.pg.recv_anysource([header], 2 * tag + 1)
            return self.pg.recv([header], call.peer, 2 * tag + 1)

        with frames.turn:
            earlier = list(frames.blocking.get(tag, ()))
            mine = threading.Event() if call.peer is None or earlier else None
            if mine is not None:
                frames.blocking.setdefault(tag, []).append(mine)
            handle = None if earlier else post()

        def headed():
            try:
                for event in earlier:
                    if not event.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                        raise CommTimeoutError(f"{work.description}: timed out after {self.timeout:g} s waiting for "
                                               f"an earlier receive under tag {tag} to take its message")
                posted = handle or post()
                if call.peer is not None and mine is not None:
                    frames.release(tag, mine)   # posted: a later receive may post behind it
                posted.wait()
                return posted
            finally:
                if mine is not None:
                    frames.release(tag, mine)

        def run() -> None:
            keep = call   # the Buffer keeps the tensor ``target`` views alive (as above)
            posted = headed()
            src = call.peer if call.peer is not None else posted._source_rank()
            work.source = src
            nbytes, code, k = (int(v) for v in header)
            if not self.frames.wait_turn(src, tag, k, deadline):
                raise CommTimeoutError(f"{work.description}: timed out after {self.timeout:g} s waiting for an "
                                       f"earlier receive from rank {src} under tag {tag} to take its message")
            agree = (nbytes, code) == want
            try:
                into = target if agree else torch.empty(nbytes, dtype=torch.uint8)
                payload = self.pg.recv([into], src, 2 * tag) if nbytes else None
            finally:
                self.frames.done_turn(src, tag)
            if payload is not None:
                payload.wait()
            if not agree:
                theirs = DTYPE_NAMES[code] if 0 <= code < len(DTYPE_NAMES) else f"dtype {code}"
                raise MismatchError(f"{work.description}: the message from rank {src} has {nbytes} bytes of "
                                    f"{theirs}, the receive expected {want[0]} bytes of {call.dtype.name} "
                                    f"(do the ranks agree on the count and dtype?)")
            del keep
        return run
