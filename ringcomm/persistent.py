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

The ordinary blocking calls keep a few of these (``FastCalls``): ``all_reduce(x)`` in place,
``broadcast``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``gather`` and ``scatter``
with even counts, up to 4 MiB, whose plan is a window algorithm. The second call on the very
same buffer objects is remembered, the third and later take the persistent road without the
user asking: the default path of a training or benchmark loop that moves the same buffers again
and again skips ~20-45 us of argument checks and planning per call. The memo holds the buffers
of at most 16 calls and 16 MiB alive; ``*_init`` is the explicit form, with no such limits.
``send`` and ``recv`` keep their prepared calls the same way (``PreparedP2P``).
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Optional

import numpy as np

from . import algorithms
from .algorithms.one_shot import OneShot, compiled_round
from .core.envelope import Envelope, op_code, window_stamp
from .core.buffers import version_bumper
from .core.executor import WindowGuard
from .core.ops import ReduceOp
from .errors import CommError, PeerAbortedError, UsageError

_current = threading.current_thread
_NONE = type(None)   # called, gives None: the "weak reference" of an absent buffer (gather's out off root)
_SLOW = object()          # "take the ordinary road" (a fast call that does not apply right now)
NO_LAST = (object(), object(), None)   # FastCalls.last when there is none: no x or op is these
# Bytes of a call: above this, the ordinary road's Python is a few percent of the transfer. At 2
# and 4 MiB it still was 8-15% (2 ranks, the ordinary road's checks and planning with the caches
# cold from the copies: all_to_all 4 MiB 370-375 -> 334-348 us when remembered), at 16 MiB 2-6%,
# which is not worth holding 32 MiB or more of a caller's buffers alive.
FAST_LIMIT = 4 << 20
FAST_ENTRIES = 16         # calls the implicit memo remembers
FAST_BYTES = 16 << 20     # buffer bytes it may keep alive in all (the oldest calls are forgotten first)


def _guard(buf, written: bool = True):
    """A callable that is True while ``buf``'s object still is the memory it was validated as
    (and, if the call writes it, still writable)."""
    obj = buf.obj
    if buf.kind == "torch":
        ptr, numel, dtype = obj.data_ptr(), obj.numel(), obj.dtype
        if not written:
            return lambda: obj.data_ptr() == ptr and obj.numel() == numel and obj.dtype is dtype \
                and obj.is_contiguous()
        # every call that may write it tells autograd so (buffers.mark_written; bump gives None)
        bump, objs = version_bumper(), (obj,)
        return lambda: obj.data_ptr() == ptr and obj.numel() == numel and obj.dtype is dtype \
            and obj.is_contiguous() and bump(objs) is None
    shape, dtype, strides = obj.shape, obj.dtype, obj.strides
    # A numpy array cannot move its data while we hold it (ndarray.resize refuses referenced arrays).
    if not written:
        return lambda: obj.dtype is dtype and obj.shape == shape and obj.strides == strides
    return lambda: obj.dtype is dtype and obj.shape == shape and obj.strides == strides and obj.flags.writeable


def guard_of(call):
    """A callable that is True while the call's buffers (input and output) still are the memory
    it validated."""
    guards = [_guard(b, written) for b, written in ((call.inp, call.in_place), (call.out, True)) if b is not None]
    if len(guards) == 1:
        return guards[0]
    first, second = guards   # checked on every fast call: two calls, not all() over a generator
    return lambda: first() and second()


class WindowCall:
    """One window collective on fixed buffers, run inline with nothing but its rounds."""
    __slots__ = ("comm", "call", "valid", "inp", "out", "algorithm", "name", "reducer", "shape", "static",
                 "count", "word", "dname", "code", "finish", "window", "core", "road")

    def __init__(self, comm, call, plan, valid=None):
        self.comm, self.call = comm, call
        self.valid = valid or guard_of(call)
        self.inp, self.out = call.arrays()
        self.algorithm, self.name, self.reducer, self.shape = plan.window, plan.algorithm, plan.reduce, plan.shape
        self.static, self.count, self.word = plan.static, plan.count, plan.word
        self.code, self.dname = call.collective.code, call.dtype.name
        self.finish = call.op is ReduceOp.AVG   # the sum divided afterwards (Collective.after)
        # The compiled all-reduce round, called straight from here when it applies (one_shot.run
        # would pick it too, after checks that cannot change for these buffers).
        window, flat = comm.transport.window, self.inp
        self.window, self.core = window, None
        if window is not None and window.core is not None and isinstance(plan.window, OneShot) \
                and plan.reduce.code >= 0 and type(flat) is np.ndarray and flat.nbytes <= window.capacity:
            self.core = window.core
        # The other window calls the core runs whole (one round from a plan, algorithms/_planned.py;
        # the direct all-to-all's two), asked for once: it depends on nothing a valid call can change.
        self.road = None if self.core is not None or window is None else \
            plan.window.road(window, self.inp, self.out, plan.shape, plan.reduce, plan.word)

    def run(self):
        """The result, or _SLOW when the ordinary road must take the call (something is queued,
        the communicator failed or closed: that road raises the right error)."""
        comm, call = self.comm, self.call
        engine = comm.engine
        state = engine.state
        # Locks are a large part of a 1 KiB call here: one section under ``state`` takes the
        # number and the inline claim (with ``exec``); the end is two releases, no third lock.
        state.acquire()
        try:
            if comm._broken is not None or comm._closed or not engine.claim_inline(_current()):
                return _SLOW
            seq = comm._seq
            comm._seq = seq + 1
        finally:
            state.release()
        try:
            comm._entry = entry = comm.recorder.running(seq, call.collective.name, call.count, self.dname, self.name)
            stamp = window_stamp(seq, self.static, self.count)
            if self.core is not None:
                compiled_round(self.window, self.core, self.inp, self.out, self.reducer.code, stamp, 0,
                               self._trouble, 0, 1)
            elif self.road is not None:
                self.road(stamp, self.word, self._trouble)
            else:
                self.algorithm.run(self.window, self.inp, self.out, self.shape, self.reducer, stamp,
                                   self.word, self._trouble)
            if self.finish:
                call.collective.after(call, comm.rank, comm.size)
            entry.state, entry.ended = "done", time.monotonic()
        except PeerAbortedError as err:
            entry.state = "failed: PeerAbortedError"
            err = comm._with_reason(err, f"{call.collective.name} #{seq} on rank {comm.rank}")
            comm._fail(err, call)
            raise err
        except CommError as err:
            entry.state = f"failed: {type(err).__name__}"
            comm._fail(err, call)
            raise
        except BaseException as err:   # mid-round (Ctrl-C): Communicator._interrupted
            entry.state = f"failed: {type(err).__name__}"
            comm._interrupted(err, f"{call.collective.name} #{seq} on rank {comm.rank}", call)
            raise
        finally:
            engine.release_inline()
        return call.result

    def _trouble(self) -> WindowGuard:
        """The guard of the running round (built only when a round stalls or mismatches)."""
        entry, call = self.comm._entry, self.call
        what = f"{call.collective.name} #{entry.seq} ({self.name}, {call.count} x {self.dname})"
        envelope = Envelope(entry.seq, self.code, self.dname, self.count, op_code(call.op))
        return WindowGuard(self.comm.transport, envelope, self.comm.timeout, what, entry.started, self.count, self.word,
                           call.collective.describe_word, self.static, algorithms.window_names(call.collective.name))


class _Memo:
    """What the two implicit memos share: calls remembered on the very buffer objects they ran
    on, keyed by their arguments as passed. A call is remembered when it comes a second time on
    the same buffers (``again``); the memo keeps its buffers alive, so it holds few and small
    ones (FAST_ENTRIES calls, FAST_BYTES in all, none above FAST_LIMIT; the oldest go first)."""
    __slots__ = ("calls", "pinned", "lock", "seen")

    def __init__(self):
        self.calls: dict = {}   # key -> [buffers as passed, what is remembered, bytes held]
        self.pinned = 0
        self.lock = threading.Lock()   # threads sharing the communicator may learn and forget at once
        self.seen: dict = {}    # calls run once (key -> weak refs to their buffers): remembered if they come again

    def again(self, key, objs: tuple) -> bool:
        """Whether a call on these very buffers ran under ``key`` before; if not, note that it did.
        A loop that passes a fresh view each time then pays a dict entry per call instead of
        holding each view."""
        try:
            before = self.seen.get(key)
            if before is None or before[0]() is not objs[0] or (len(objs) > 1 and before[1]() is not objs[1]):
                if len(self.seen) >= 4 * FAST_ENTRIES:
                    self.seen.clear()
                # weak: a view made for one call dies with it, and a new one at its address (its id)
                # must not count as the same buffer coming again
                self.seen[key] = [_NONE if o is None else weakref.ref(o) for o in objs]
                return False
        except TypeError:   # an unhashable argument, or a buffer type without weak references
            return False
        return True

    def keep(self, key, objs: tuple, value, held: int) -> None:
        """Remember ``value`` for ``key``, forgetting the oldest calls while over the bounds."""
        with self.lock:
            self._drop(key)
            while self.calls and (len(self.calls) >= FAST_ENTRIES or self.pinned + held > FAST_BYTES):
                self._drop(next(iter(self.calls)))
            self.calls[key] = [objs, value, held]
            self.pinned += held

    def _drop(self, key) -> Optional[list]:
        entry = self.calls.pop(key, None)
        if entry is not None:
            self.pinned -= entry[2]
        return entry


class FastCalls(_Memo):
    """The implicit memo of the blocking collectives: window calls on buffers seen before.

    Keyed by the call's arguments as passed (the buffers' ids, op, root); a hit also checks that
    the buffers are the very objects remembered and still the memory that was validated. A call
    is remembered, as it was prepared and planned, when it comes a second time on the same
    buffers, and its WindowCall is built when it comes a third."""
    __slots__ = ("last",)

    def __init__(self):
        super().__init__()   # calls: key -> [buffers as passed, WindowCall or its arguments, bytes held]
        # (x, op, WindowCall) of the last all_reduce found here: the next call of a loop is that
        # one again, and checking so costs less than building and hashing its key (a 1 KiB call
        # is ~7 us, the key and lookup ~0.5 of it). Forgotten with its entry.
        self.last: tuple = NO_LAST

    def get(self, key, objs) -> Optional[WindowCall]:
        try:
            hit = self.calls.get(key)
        except TypeError:   # an unhashable argument: the ordinary road explains what is wrong with it
            return None
        if hit is None:
            return None
        held = hit[0]
        if held[0] is not objs[0] or (len(objs) > 1 and held[1] is not objs[1]):
            return None
        road = hit[1]
        if type(road) is tuple:   # first repeat: build it now
            road = hit[1] = WindowCall(*road)
        if not road.valid():
            with self.lock:
                self._drop(key)
            return None
        return road

    def remember(self, key, objs, comm, call) -> None:
        """Remember a call just run, if it ran on these very buffers before and may take the fast
        road next time (``fast_road``), without building a road it would never take."""
        if too_large(comm, call):
            # Never on the fast road: planning it anyway cost a 4 MiB all_to_all 10 us of its ~400
            # (the caches are cold from the copies then).
            return
        if not self.again(key, objs):
            return
        plan = comm._plan_for(call, None)
        held = fast_road(comm, call, plan)
        if held is not None:
            # the guard now, while the buffers are what the call validated (the road is built later)
            self.keep(key, objs, (comm, call, plan, guard_of(call)), held)

    def _drop(self, key) -> Optional[list]:
        entry = super()._drop(key)
        if entry is not None and self.last[2] is entry[1]:
            self.last = NO_LAST
        return entry


class PreparedP2P(_Memo):
    """The implicit memo of ``comm.send`` and ``comm.recv``: their prepared calls, on buffers seen
    before. A send or receive has no plan to skip, but its argument checks and its Call cost
    ~1.5 us each, and more with the caches cold from the previous message's copy: remembered, a
    1 KiB exchange (send, recv, wait; 2 ranks) took 22.9 us instead of 27.3-27.9, 1 MiB 101-104
    instead of 115-116 (torch tensors 23 and 103-108 instead of 30-31 and 120-125). A
    prepared call is never changed by running it, so one serves every later call with the very
    same buffer object (still the memory it was validated as: ``guard_of``), peer and tag.

    The peer and the tag are part of the key only when they are plain ints (or a receive's None):
    True == 1 and hashes alike, but the ordinary road refuses a bool. Remembered, like FastCalls,
    when the buffer comes a second time, and only on host memory."""
    __slots__ = ()

    def call(self, collective, comm, buf, peer, tag):
        """``collective.prepare(comm, buf, peer, tag)``, or the same call prepared before."""
        if type(tag) is not int or (type(peer) is not int and peer is not None):
            return collective.prepare(comm, buf, peer, tag)
        key = (collective.code, id(buf), peer, tag)
        hit = self.calls.get(key)   # [(buffer,), (prepared Call, its guard), bytes held]
        if hit is not None and hit[0][0] is buf:
            call, valid = hit[1]
            if valid():
                return call
            with self.lock:
                self._drop(key)   # changed since: the ordinary checks judge it again
        call = collective.prepare(comm, buf, peer, tag)
        if call.device == "cpu" and not too_large(comm, call) and self.again(key, (buf,)):
            data = call.inp if call.inp is not None else call.out
            self.keep(key, (buf,), (call, guard_of(call)), data.flat.nbytes)
        return call


def too_large(comm, call) -> bool:
    """Whether the call moves more than FAST_LIMIT bytes: never on the fast road (``fast_road``)."""
    return call.collective.nbytes(call, comm.size) > FAST_LIMIT


def fast_road(comm, call, plan) -> Optional[int]:
    """The buffer bytes a WindowCall of this call would hold, if the call qualifies: a window plan
    with work to do, host memory, at most FAST_LIMIT bytes, nothing to scale or copy before the
    communication, and nothing that must look at every call (debug logging, pre-flight); else None."""
    if plan.window is None or not plan.program or call.device != "cpu" or call.factor is not None:
        return None
    if call.snapshot is not None:
        return None   # the copy before the call (Collective.before), which the road skips
    if call.op is ReduceOp.AVG and call.dtype.name in ("float16", "bfloat16"):
        return None   # scaled before the sum (ops.prescale_factor): the ordinary road does it
    if comm._preflight_on or comm._logging() or comm.size < 2 or too_large(comm, call):
        return None
    held = sum(b.flat.nbytes for b in (call.inp, call.out) if b is not None)
    return held if held <= FAST_BYTES else None


class Persistent:
    """``comm.all_reduce_init(x, op)``: one validated, planned call, run by ``p()`` or ``p.start()``."""

    def __init__(self, comm, call, algorithm: Optional[str]):
        self.comm, self.call, self.algorithm = comm, call, algorithm
        self.valid = guard_of(call)   # the output too: a resized out= must not be written
        self._window = None
        self._checked = False
        self._active = None   # the Work of a start() not yet completed

    def __call__(self):
        """Run it and return the result (as the ordinary blocking call would)."""
        self._check()
        if self._active is not None:
            self._refuse_active()
        if self._window is not None:
            result = self._window.run()
            if result is not _SLOW:
                return result
        return self.comm._start_prepared(self.call.copy(), self.algorithm, False)

    def start(self):
        """Start it asynchronously: a ``Work`` whose ``wait()`` returns the result. As with
        MPI_Start, a persistent call runs once at a time: starting it again before its Work
        completed raises (it once reduced twice in place: 1 became 4 on 2 ranks)."""
        self._check()
        if self._active is not None:
            self._refuse_active()
        work = self._active = self.comm._start_prepared(self.call.copy(), self.algorithm, True)
        return work

    def _refuse_active(self) -> None:
        if not self._active.is_completed():
            raise UsageError(f"{self.call.name}: this persistent call was started and its Work has not "
                             f"completed; wait() for it before running it again (MPI_Start's rule)")
        self._active = None

    def _check(self) -> None:
        if not self.valid():
            raise UsageError(f"{self.call.name}: the buffer of this persistent call changed since all_reduce_init "
                             f"(resized, re-pointed, re-typed or made read-only); make a new one")
        if not self._checked:   # the plan is known after the first run (the selector decides there)
            self._checked = True
            plan = self.comm._plan_for(self.call, self.algorithm)
            if fast_road(self.comm, self.call, plan) is not None:
                self._window = WindowCall(self.comm, self.call, plan, self.valid)
