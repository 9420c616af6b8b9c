"""Runs one rank's program over a transport, with deadlines and errors that say where it stuck.

A compiled program is a tuple of lanes; a lane is a list of steps. One lane runs with plain
blocking waits. Several lanes (independent pipelines on their own channels) are advanced
together: whichever lane's next request has completed moves on, so no lane waits on another.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from .errors import CommTimeoutError
from .schedule import CHANNELS, Recv, RecvReduce, Send, lanes_of, sends_first
from .transport.base import Reducer, Transport

TAG_SPACE = 8192     # sequence numbers wrap here; MPI guarantees tags up to 32767
POLL_SLICE = 200e-6  # with several lanes, how long to block on one before checking the others


def tag_base(seq: int) -> int:
    return (seq % TAG_SPACE) * CHANNELS


def compile_program(program) -> tuple:
    """Precompute, once per cached program, what the executor needs to know about each step."""
    return tuple([(tuple(step), sends_first(step), sum(op.count for op in step if isinstance(op, RecvReduce)))
                  for step in lane] for lane in lanes_of(program) if lane)


class _Step:
    """One posted step: its requests in completion order, and reductions deferred to its end."""
    __slots__ = ("requests", "reductions", "cursor")

    def __init__(self, step, late_reduce, transport, work, scratch, reduce, base):
        recvs, sends, self.reductions, used = [], [], [], 0
        for op in step:   # receives first, so a peer's send never waits on our posting order
            region = work[op.off:op.off + op.count]
            tag = base + op.channel
            if isinstance(op, Recv):
                recvs.append((op, transport.irecv(region, op.peer, tag)))
            elif isinstance(op, RecvReduce):
                tmp = scratch[used:used + op.count]
                used += op.count
                if late_reduce:   # W must not change under the in-flight sends of this step
                    recvs.append((op, transport.irecv(tmp, op.peer, tag)))
                    self.reductions.append((region, tmp))
                else:
                    recvs.append((op, transport.irecv_reduce(region, op.peer, tag, reduce, tmp)))
        for op in step:
            if isinstance(op, Send):
                sends.append((op, transport.isend(work[op.off:op.off + op.count], op.peer, base + op.channel)))
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

    def finish(self, reduce) -> None:
        for region, tmp in self.reductions:
            reduce(region, tmp)

    def blocking_op(self):
        return self.requests[self.cursor][0]


def run(compiled, transport: Transport, work: np.ndarray, reduce: Optional[Reducer], *,
        seq: int, timeout: Optional[float], what: str) -> None:
    """Execute a compiled program on ``work`` in place.

    ``what`` names the call in errors, e.g. "all_reduce #12 (ring, 4096 x float32)".
    """
    if not compiled:
        return
    base = tag_base(seq)
    deadline = None if timeout is None else time.monotonic() + timeout
    # empty_like: scratch lives where work does (numpy, or cupy for CUDA tensors)
    scratch = [np.empty_like(work, shape=max(n for *_, n in lane)) for lane in compiled]
    position = [0] * len(compiled)
    posted: list = [None] * len(compiled)
    slice_ = None if len(compiled) == 1 else 0.0
    while True:
        moved = False
        for i, lane in enumerate(compiled):
            if posted[i] is None:
                if position[i] == len(lane):
                    continue
                step, late_reduce, _ = lane[position[i]]
                posted[i] = _Step(step, late_reduce, transport, work, scratch[i], reduce, base)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if posted[i].advance(left if slice_ is None else slice_):
                posted[i].finish(reduce)
                posted[i] = None
                position[i] += 1
                moved = True
            elif slice_ is None or (deadline is not None and time.monotonic() > deadline):
                _timeout(what, transport.rank, timeout, posted[i].blocking_op(), position[i], len(lane))
        if all(position[i] == len(lane) for i, lane in enumerate(compiled)):
            return
        if not moved and slice_ is not None:
            slice_ = min(POLL_SLICE, 2 * slice_ or 10e-6)   # back off while nothing moves
        elif slice_ is not None:
            slice_ = 0.0


def _timeout(what, rank, timeout, op, k, steps):
    verb = "send to" if isinstance(op, Send) else "receive from"
    raise CommTimeoutError(f"{what} on rank {rank}: timed out after {timeout:g} s waiting to {verb} "
                           f"rank {op.peer} ({op.count} elements, step {k + 1} of {steps})")
