"""The Communicator: the public collectives, validated here and run over one transport.

One call flows: validate arguments (raise before any byte moves) -> take the next sequence
number -> choose an algorithm (forced name, or the selector's cost model) -> fetch the rank's
cached program -> stage the work array with the transport -> execute the program -> finish
(avg divides, reduce_scatter copies its chunk out). Async calls queue the same job on the
communicator's progress thread; jobs always run in issue order, sync or async.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import algorithms, env
from .core import executor
from .core.buffers import Buffer, address, as_buffer, check_pair
from .core.envelope import ABORT_TAG, Envelope, static_bits, window_stamp
from .core.ops import ReduceOp, combiner, divide_by_size, parse_op, reducer
from .core.schedule import DEFAULT_SEGMENT_BYTES, chunk
from .diagnostics import preflight
from .diagnostics.flight_recorder import FlightRecorder
from .errors import (
    CommError,
    CommTimeoutError,
    PeerAbortedError,
    UsageError,
    bad_type,
    bad_value,
)
from .selection.selector import Selector
from .transport.base import Transport
from .work import Work

DEFAULT_TIMEOUT = 300.0
PLAN_MEMO = 1024   # distinct call shapes remembered; a training loop repeats a handful
_log = logging.getLogger("ringcomm.selector")


class _Plan(NamedTuple):
    """Everything about a call that its shape decides, worked out once per shape."""
    algorithm: str
    why: str                   # how the algorithm was chosen (for RINGCOMM_DEBUG=info)
    one_shot: object           # the window algorithm to run, or None for a program
    program: object            # compiled program; for a one-shot algorithm: whether there is work
    reduce: Optional[Callable]
    combine: Optional[Callable]
    static: int                # the envelope's tag bits but the sequence number


class Call:
    """What a collective was asked to do: enough to fingerprint it and to record it.
    (Slotted, not a dataclass: one is built per call, and that cost is on every call's path.)"""
    __slots__ = ("name", "buf", "op", "root")

    def __init__(self, name: str, buf: Optional[Buffer] = None, op: Optional[ReduceOp] = None, root: int = 0):
        self.name, self.buf, self.op, self.root = name, buf, op, root

    @property
    def count(self) -> int:
        return 0 if self.buf is None else self.buf.flat.size

    @property
    def dtype(self) -> Optional[str]:
        return None if self.buf is None else self.buf.dtype.name


class Communicator:
    backend = "ringcomm"

    def __init__(self, transport: Transport, *, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 selector: Optional[Selector] = None, local_rank: Optional[int] = None,
                 local_size: Optional[int] = None, node_count: int = 1, topology=None):
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.local_rank = self.rank if local_rank is None else local_rank
        self.local_size = self.size if local_size is None else local_size
        self.node_count = node_count
        self.topology = topology   # ringcomm.topology.Topology, when known
        self.timeout = timeout
        self.selector = selector or Selector.from_env()   # RINGCOMM_ALGO, tuning file
        self._seq = 0
        self._broken: Optional[BaseException] = None
        self._state = threading.Lock()     # guards _seq, _outstanding, the queue
        self._exec = threading.Lock()      # held while a collective moves data
        self._outstanding = 0
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition(self._state)
        self._progress: Optional[threading.Thread] = None
        self._closed = False
        self._notices: list = []           # abort notices in flight; kept so they are not freed early
        self.recorder = FlightRecorder(self.rank)
        self._entry = None                 # flight-recorder entry of the running collective
        self._plans: dict = {}            # call shape -> what _plan worked out for it
        self._plans_for = self.selector
        self.debug = env.get("RINGCOMM_DEBUG")
        self.check_finite = env.get("RINGCOMM_CHECK_FINITE")
        self._preflight_on = self.debug == "detail" or self.check_finite
        for collective, forced in self.selector.forced.items():
            if algorithms.needs_window(collective, forced) and transport.window is None:
                raise UsageError(f"RINGCOMM_ALGO forces {collective}={forced}, which needs ranks that "
                                 f"share memory (a transport with a shared window: shm on one node, "
                                 f"or threads); this job's {transport.name} transport has none")

    # ---- public collectives -------------------------------------------------------------
    def all_reduce(self, x, op="sum", *, algorithm=None, async_op=False):
        name = "all_reduce"
        buf = as_buffer(x, name, "x")
        op = self._check_op(name, op, buf)
        algorithm = self._check_algorithm(name, algorithm, buf)

        def job(seq):
            self._collective(name, algorithm, buf.flat, buf, seq, op=op)
            if op is ReduceOp.AVG:
                divide_by_size(buf.flat, buf.dtype, self.size)
            return x
        return self._submit(Call(name, buf, op), job, async_op)

    def broadcast(self, x, root=0, *, algorithm=None, async_op=False):
        name = "broadcast"
        buf = as_buffer(x, name, "x")
        root = self._check_root(name, root)
        algorithm = self._check_algorithm(name, algorithm)

        def job(seq):
            self._collective(name, algorithm, buf.flat, buf, seq, root=root)
            return x
        return self._submit(Call(name, buf, root=root), job, async_op)

    def reduce(self, x, root=0, op="sum", *, algorithm=None, async_op=False):
        name = "reduce"
        buf = as_buffer(x, name, "x")
        root = self._check_root(name, root)
        op = self._check_op(name, op, buf)
        algorithm = self._check_algorithm(name, algorithm)

        def job(seq):
            # Non-roots reduce in a copy: like MPI_Reduce, their input stays as it was.
            work = buf.flat if self.rank == root else buf.flat.copy()
            self._collective(name, algorithm, work, buf, seq, op=op, root=root)
            if self.rank == root and op is ReduceOp.AVG:
                divide_by_size(work, buf.dtype, self.size)
            return x
        return self._submit(Call(name, buf, op, root), job, async_op)

    def all_gather(self, out, x, *, algorithm=None, async_op=False):
        name = "all_gather"
        xb, ob = as_buffer(x, name, "x"), as_buffer(out, name, "out")
        check_pair(name, ob, xb, self.size * xb.numel)
        algorithm = self._check_algorithm(name, algorithm)

        def job(seq):
            off, n = chunk(ob.numel, self.size, self.rank)
            own = ob.flat[off:off + n]
            if address(own) != address(xb.flat):   # skip the copy when x is out's own chunk
                own[...] = xb.flat
            self._collective(name, algorithm, ob.flat, ob, seq)
            return out
        return self._submit(Call(name, xb), job, async_op)

    def reduce_scatter(self, out, x, op="sum", *, algorithm=None, async_op=False):
        name = "reduce_scatter"
        xb, ob = as_buffer(x, name, "x"), as_buffer(out, name, "out")
        check_pair(name, ob, xb, xb.numel // self.size if xb.numel % self.size == 0 else -1)
        op = self._check_op(name, op, xb)
        algorithm = self._check_algorithm(name, algorithm)

        def job(seq):
            work = xb.flat.copy()   # the input is left untouched, as in torch and MPI
            self._collective(name, algorithm, work, xb, seq, op=op)
            off, n = chunk(work.size, self.size, self.rank)
            ob.flat[...] = work[off:off + n]
            if op is ReduceOp.AVG:
                divide_by_size(ob.flat, ob.dtype, self.size)
            return out
        return self._submit(Call(name, xb, op), job, async_op)

    def barrier(self, *, algorithm=None, async_op=False):
        name = "barrier"
        algorithm = self._check_algorithm(name, algorithm)
        empty = np.empty(0, np.uint8)

        def job(seq):
            self._collective(name, algorithm, empty, None, seq)
        return self._submit(Call(name), job, async_op)

    # ---- lifecycle ------------------------------------------------------------------------
    def abort(self, reason: str = "aborted by the user") -> None:
        err = CommError(reason)
        self._broken = self._broken or err
        self.transport.abort(err)
        self.close()
        self.transport.close()

    def close(self) -> None:
        with self._state:
            self._closed = True
            self._wake.notify_all()
        if self._progress is not None and self._progress is not threading.current_thread():
            self._progress.join(timeout=5)

    def __repr__(self) -> str:
        return f"<ringcomm.Communicator backend={self.backend} rank={self.rank} size={self.size}>"

    # ---- argument checks (calling rank, before any communication) ---------------------------
    def _check_op(self, name: str, op, buf: Buffer) -> ReduceOp:
        op = parse_op(op, name)
        if op is ReduceOp.AVG and not buf.dtype.is_float:
            raise bad_value(name, "op", f"sum, prod, min or max for integer dtype {buf.dtype.name}", "avg")
        return op

    def _check_root(self, name: str, root) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise bad_type(name, "root", "an int", type(root).__name__)
        if not 0 <= root < self.size:
            raise bad_value(name, "root", f"a rank in [0, {self.size - 1}]", int(root))
        return int(root)

    def _check_algorithm(self, name: str, algorithm, buf: Optional[Buffer] = None) -> Optional[str]:
        if algorithm is None:
            return None
        if not isinstance(algorithm, str):
            raise bad_type(name, "algorithm", "a str or None", type(algorithm).__name__)
        algorithms.get(name, algorithm)
        if algorithms.needs_window(name, algorithm) and self._window_for(buf) is None:
            raise bad_value(name, "algorithm", f"an algorithm other than {algorithm} (it needs ranks that "
                            f"share host memory; this {self.transport.name} transport offers no window for "
                            f"{'this array' if buf is not None and buf.device != 'cpu' else 'this job'})",
                            algorithm)
        return algorithm

    def _window_for(self, buf: Optional[Buffer]):
        """The transport's shared window, if this buffer may use it (host memory only)."""
        return self.transport.window if buf is None or buf.device == "cpu" else None

    # ---- execution ----------------------------------------------------------------------------
    def _collective(self, name: str, algorithm: Optional[str], work: np.ndarray, buf: Optional[Buffer],
                    seq: int, *, op: Optional[ReduceOp] = None, root: int = 0) -> None:
        """Run collective ``name`` in place on the flat array ``work``: the backend seam.

        Semantics per collective (W = work): all_reduce, every rank's W becomes the reduction;
        broadcast, W becomes root's W; reduce, root's W becomes the reduction (other ranks' W is a
        scratch copy); all_gather, W holds size chunks, rank r's already filled, and all become
        filled; reduce_scatter, chunk r of rank r's W becomes the reduction of everyone's chunk r;
        barrier, W is empty. For ``op`` AVG, reduce as a sum: the callers divide afterwards.
        Reference backends (MPI, gloo, NCCL) override this method and nothing else.
        """
        dtype = None if buf is None else buf.dtype
        key = (name, algorithm, work.size, dtype, op, root, buf is None or buf.device == "cpu")
        if self._plans_for is not self.selector:   # a new selector (tuning, forcing) decides afresh
            self._plans.clear()
            self._plans_for = self.selector
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= PLAN_MEMO:
                self._plans.clear()
            plan = self._plans[key] = self._plan(key, work.itemsize if buf is None else dtype.itemsize)
        chosen, how, one_shot, program, reduce, combine, static = plan
        if _log.isEnabledFor(logging.INFO):   # RINGCOMM_DEBUG=info: why this algorithm ran
            _log.info("rank %d %s #%d: %s, %d x %s (%s)", self.rank, name, seq, chosen, work.size,
                      dtype.name if dtype else "bytes", how)
        self._entry.algorithm = chosen
        dname = None if dtype is None else dtype.name
        if one_shot is not None:
            if program:   # more than one rank and something to reduce
                started = self._entry.started   # the deadline counts from the start of the call
                one_shot.run(self.transport.window, work, reduce, combine,
                             window_stamp(seq, static, work.size),
                             lambda: executor.WindowGuard(
                                 self.transport, Envelope(seq, name, dname, work.size), self.timeout,
                                 f"{name} #{seq} ({chosen}, {work.size} x {dname})", started, work.size))
            return
        if not program:
            return
        what = f"{name} #{seq} ({chosen}, {work.size} x {dname or 'bytes'})"
        envelope = Envelope(seq, name, dname, work.size)
        if type(self.transport).stage is Transport.stage:   # nothing to stage: skip the ~1 us context
            executor.run(program, self.transport, work, reduce, envelope=envelope, timeout=self.timeout, what=what)
            return
        with self.transport.stage((work,)):
            executor.run(program, self.transport, work, reduce, envelope=envelope, timeout=self.timeout, what=what)

    def _plan(self, key: tuple, itemsize: int) -> _Plan:
        name, forced, count, dtype, op, root, host = key
        nodes = None if self.topology is None else self.topology.node_of
        chosen = forced or self.selector.choose(name, count * itemsize, self.size,
                                                dtype=dtype.name if dtype else "uint8", nodes=nodes,
                                                transport=self.transport, window=host)
        how = "algorithm= argument" if forced else \
            "RINGCOMM_ALGO" if name in self.selector.forced else "cost model"
        reduce = None if op is None else reducer(op, dtype)
        combine = None if op is None else combiner(op, dtype)
        static = static_bits(name, dtype.name if dtype else None, count)
        if algorithms.needs_window(name, chosen):
            return _Plan(chosen, how, algorithms.get(name, chosen), self.size > 1 and count > 0, reduce, combine,
                         static)
        seg = max(1, DEFAULT_SEGMENT_BYTES // itemsize)
        program = algorithms.plan(name, chosen, self.rank, self.size, count, root, seg, nodes)
        return _Plan(chosen, how, None, program, reduce, combine, static)

    def _submit(self, call: "Call", job: Callable, async_op: bool):
        with self._state:
            if self._broken is not None:
                raise CommError(f"{call.name} on rank {self.rank}: communicator is unusable after an earlier "
                                f"failure: {self._broken}") from self._broken
            seq = self._seq
            self._seq += 1
            entry = self.recorder.record(seq, call.name, call.count, call.dtype)
            inline = not async_op and self._outstanding == 0
            self._outstanding += 1
            if not inline:
                work = Work(f"{call.name} #{seq} on rank {self.rank}")
                self._queue.append((seq, call, job, work, entry))
                self._ensure_progress_thread()
                self._wake.notify()
        if inline:
            try:
                with self._exec:
                    return self._execute(seq, call, job, entry)
            finally:
                with self._state:
                    self._outstanding -= 1
        return work if async_op else work.wait()

    def _execute(self, seq: int, call: "Call", job: Callable, entry):
        """Run one job (under the exec lock): pre-flight, data movement, bookkeeping on failure."""
        self._entry = entry
        entry.state, entry.started = "running", time.monotonic()
        try:
            if self._preflight_on:
                self._preflight(seq, call)
            result = job(seq)
        except CommError as err:
            entry.state = f"failed: {type(err).__name__}"
            self._fail(err)
            raise
        except BaseException as err:
            entry.state = f"failed: {type(err).__name__}"
            raise
        entry.state, entry.ended = "done", time.monotonic()
        return result

    def _preflight(self, seq: int, call: "Call") -> None:
        non_finite = self.check_finite and call.buf is not None and \
            preflight.has_non_finite(call.buf.flat, call.buf.dtype.name)
        mine = preflight.fingerprint(call.name, seq, call.count, call.dtype, call.op and call.op.value,
                                     call.root, non_finite)
        preflight.check(self.transport, self.timeout, f"{call.name} #{seq}", mine,
                        check_fields=self.debug == "detail")

    def _fail(self, err: CommError) -> None:
        """The communicator is broken from now on; tell the peers so that they fail fast too."""
        first = self._broken is None
        self._broken = self._broken or err
        if isinstance(err, CommTimeoutError):
            self.recorder.dump(str(err))
        if first and not isinstance(err, PeerAbortedError):
            text = np.frombuffer(str(err).encode()[:4000], np.uint8).copy()
            for peer in range(self.size):
                if peer != self.rank:
                    try:
                        self._notices.append(self.transport.isend(text, peer, ABORT_TAG))
                    except CommError:
                        pass   # that peer is gone too: nothing to tell it

    def _ensure_progress_thread(self) -> None:
        if self._progress is None:
            self._progress = threading.Thread(target=self._progress_loop, daemon=True,
                                              name=f"ringcomm-progress-{self.rank}")
            self._progress.start()

    def _progress_loop(self) -> None:
        while True:
            with self._state:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                seq, call, job, work, entry = self._queue.popleft()
            result, error = None, None
            try:
                with self._exec:
                    result = self._execute(seq, call, job, entry)
            except BaseException as err:  # surfaced to the caller through Work.wait()
                error = err
            with self._state:
                self._outstanding -= 1
            work._finish(result, error)
