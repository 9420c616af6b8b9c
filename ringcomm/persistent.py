"""Persistent collectives: validate and plan once, run many times (MPI-4's MPI_Allreduce_init).

    p = comm.all_reduce_init(x, op="sum")     # checks x, op, picks the algorithm, compiles
    for step in range(steps):
        ...                                   # write new values into x
        p()                                   # or w = p.start(); ...; w.wait()

A small in-place all-reduce spends most of its time in Python before and after the bytes move:
argument checks (2-3 us), turning a torch tensor into a flat view (~5 us), choosing the plan.
A persistent call does those once. Per call it checks only what safety needs, cheaply: that the
buffer is still the memory that was validated (same address, size, dtype and layout; a torch
tensor that was resized or re-pointed since raises UsageError). Then it runs exactly what the
ordinary call would, with the same sequence numbers, envelope and window stamps, so ranks may mix
persistent and ordinary calls freely.

The ordinary ``comm.all_reduce(x)`` keeps a few of these for small in-place calls on arrays it
has seen (``FastCalls``): the default path of a training or benchmark loop that reduces the same
small buffer again and again takes the persistent road without the user asking.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np

from .algorithms.one_shot import OneShot, compiled_round
from .core.envelope import SEQ_MOD, STAMP_COUNT_SHIFT, Envelope
from .core.executor import WindowGuard
from .core.ops import ReduceOp, finish_avg
from .errors import CommError, PeerAbortedError, UsageError

_current = threading.current_thread
_SLOW = object()          # "take the ordinary road" (a fast call that does not apply right now)
FAST_LIMIT = 64 << 10     # bytes: above this, Python's per-call cost is noise next to the transfer
FAST_ENTRIES = 16         # arrays the implicit memo remembers (it holds them alive: small ones only)


def _guard(buf):
    """A callable that is True while ``buf``'s object still is the memory it was validated as."""
    obj = buf.obj
    if buf.kind == "torch":
        ptr, numel, dtype = obj.data_ptr(), obj.numel(), obj.dtype
        return lambda: obj.data_ptr() == ptr and obj.numel() == numel and obj.dtype is dtype \
            and obj.is_contiguous()
    shape, dtype, strides = obj.shape, obj.dtype, obj.strides
    # A numpy array cannot move its data while we hold it (ndarray.resize refuses referenced arrays).
    return lambda: obj.dtype is dtype and obj.shape == shape and obj.strides == strides and obj.flags.writeable


class WindowRound:
    """One in-place window all-reduce of a fixed buffer, run inline with nothing but the round."""
    __slots__ = ("comm", "buf", "valid", "flat", "algorithm", "name", "reducer", "shape", "stamp", "count",
                 "avg", "dname", "code", "window", "core")

    def __init__(self, comm, call, plan):
        self.comm, self.buf, self.valid = comm, call.inp, _guard(call.inp)
        self.flat, self.algorithm, self.name = call.inp.flat, plan.window, plan.algorithm
        self.reducer, self.shape = plan.reduce, plan.shape
        self.count, self.code = call.count, call.collective.code
        self.stamp = call.count << STAMP_COUNT_SHIFT | plan.static   # the sequence number goes in per call
        self.avg = call.op is ReduceOp.AVG
        self.dname = call.dtype.name
        # The compiled round, called straight from here when it applies (one_shot.run would pick
        # it too, after checks that cannot change for this buffer).
        window, flat = comm.transport.window, self.flat
        self.window, self.core = window, None
        if window is not None and window.core is not None and isinstance(plan.window, OneShot) \
                and plan.reduce.code >= 0 and type(flat) is np.ndarray and flat.nbytes <= window.capacity:
            self.core = window.core

    def run(self):
        """The result, or _SLOW when the ordinary road must take the call (something is queued,
        the communicator failed or closed: that road raises the right error)."""
        comm = self.comm
        engine = comm.engine
        with engine.state:
            if engine.outstanding or comm._broken is not None or comm._closed:
                return _SLOW
            engine.owner = _current()
            engine.outstanding = 1
            seq = comm._seq
            comm._seq = seq + 1
        entry = comm.recorder.record(seq, "all_reduce", self.count, self.dname)
        try:
            with engine.exec:
                comm._entry = entry
                entry.state, entry.started, entry.algorithm = "running", time.monotonic(), self.name
                stamp = self.stamp | (seq % SEQ_MOD) << 19
                if self.core is not None:
                    compiled_round(self.window, self.core, self.flat, self.flat, self.reducer.code, stamp, 0,
                                   self._trouble, 0, 1)
                else:
                    self.algorithm.run(self.window, self.flat, self.flat, self.shape, self.reducer, stamp, 0,
                                       self._trouble)
                if self.avg:
                    finish_avg(self.flat, self.buf.dtype, comm.size)
                entry.state, entry.ended = "done", time.monotonic()
        except PeerAbortedError as err:
            entry.state = "failed: PeerAbortedError"
            err = comm._with_reason(err, f"all_reduce #{seq} on rank {comm.rank}")
            comm._fail(err)
            raise err
        except CommError as err:
            entry.state = f"failed: {type(err).__name__}"
            comm._fail(err)
            raise
        finally:
            engine.done()
        return self.buf.obj

    def _trouble(self) -> WindowGuard:
        """The guard of the running round (built only when a round stalls or mismatches)."""
        entry = self.comm._entry
        what = f"all_reduce #{entry.seq} ({self.name}, {self.count} x {self.dname})"
        return WindowGuard(self.comm.transport, Envelope(entry.seq, self.code, self.dname, self.count),
                           self.comm.timeout, what, entry.started, self.count)


class FastCalls:
    """The implicit memo of ``comm.all_reduce``: small in-place calls on arrays seen before."""
    __slots__ = ("rounds",)

    def __init__(self):
        self.rounds: dict = {}   # (id(x), op as passed) -> (x, WindowRound)

    def get(self, x, op):
        hit = self.rounds.get((id(x), op))
        if hit is None or hit[0] is not x:
            return None
        if not hit[1].valid():
            del self.rounds[(id(x), op)]
            return None
        return hit[1]

    def remember(self, x, op, round_: WindowRound) -> None:
        if len(self.rounds) >= FAST_ENTRIES:
            self.rounds.pop(next(iter(self.rounds)))
        self.rounds[(id(x), op)] = (x, round_)


def fast_round(comm, call, plan) -> Optional[WindowRound]:
    """A WindowRound for this call if it qualifies: a window plan, in place, host memory, small,
    no prescaling, and nothing that must look at every call (debug logging, pre-flight)."""
    if plan.window is None or not call.in_place or call.device != "cpu" or call.factor is not None:
        return None
    if call.op is ReduceOp.AVG and call.dtype.name in ("float16", "bfloat16"):
        return None   # scaled before the sum (ops.prescale_factor): the ordinary road does it
    if call.count * call.dtype.itemsize > FAST_LIMIT or comm._preflight_on or comm._logging() or comm.size < 2:
        return None
    return WindowRound(comm, call, plan)


class Persistent:
    """``comm.all_reduce_init(x, op)``: one validated, planned call, run by ``p()`` or ``p.start()``."""

    def __init__(self, comm, call, algorithm: Optional[str]):
        self.comm, self.call, self.algorithm = comm, call, algorithm
        self.valid = _guard(call.inp) if call.inp is not None else (lambda: True)
        self._window = None
        self._checked = False

    def __call__(self):
        """Run it and return the result (as the ordinary blocking call would)."""
        self._check()
        if self._window is not None:
            result = self._window.run()
            if result is not _SLOW:
                return result
        return self.comm._start_prepared(self.call.copy(), self.algorithm, False)

    def start(self):
        """Start it asynchronously: a ``Work`` whose ``wait()`` returns the result."""
        self._check()
        return self.comm._start_prepared(self.call.copy(), self.algorithm, True)

    def _check(self) -> None:
        if not self.valid():
            raise UsageError(f"{self.call.name}: the buffer of this persistent call changed since all_reduce_init "
                             f"(resized, re-pointed or re-typed); make a new one")
        if not self._checked:   # the plan is known after the first run (the selector decides there)
            self._checked = True
            plan = self.comm._plan_for(self.call, self.algorithm)
            self._window = fast_round(self.comm, self.call, plan)
