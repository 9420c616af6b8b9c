"""The Communicator: the public calls, each validated by its collective and run over one transport.

One call flows: the collective object validates the arguments and prepares a ``Call`` (raising
before any byte moves) -> the engine takes the next sequence number and runs the call in issue
order (inline, or on the progress thread) -> local work before (premul scaling) -> the backend
seam ``_collective`` (here: choose an algorithm, fetch the rank's compiled program, run it over
the transport; reference backends call their library instead) -> local work after (avg).
Point-to-point calls are posted in issue order and complete on their own (point_to_point.py,
core/progress.py); sub-communicators are subcommunicators.py.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import algorithms, env
from .collectives import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, GATHER, RECV, REDUCE,
                          REDUCE_SCATTER, SCATTER, SEND, Call)
from .core import executor
from .core.envelope import (ABORT_TAG, Envelope, count_word, op_code, static_bits, window_kind_bits,
                            window_stamp)
from .core.ops import reducer
from .core.progress import Engine
from .core.schedule import DEFAULT_SEGMENT_BYTES, DEVICE_SEGMENT_BYTES
from .core.streams import scope_for
from .diagnostics import preflight
from .diagnostics.flight_recorder import FlightRecorder
from .errors import (PEER_ENDED, CommError, CommTimeoutError, CommunicatorLimitError, PeerAbortedError, RingcommError,
                     UsageError, bad_type, bad_value)
from .persistent import _SLOW, NO_LAST, FastCalls, Persistent, PreparedP2P
from .point_to_point import PointToPoint
from .selection.selector import Selector
from .subcommunicators import _DUP, _SPLIT, Holders, SubCommunicators
from .transport.base import Transport
from .transport.devices import cupy_installed
from .work import Work

DEFAULT_TIMEOUT = 300.0
PLAN_MEMO = 1024   # distinct call shapes remembered; a training loop repeats a handful
_log = logging.getLogger("ringcomm.selector")

# Every communicator of this process, so that a forked child can disown them (``_disown``).
_LIVE: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


def _disown_all() -> None:
    for comm in list(_LIVE):
        comm._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_all)


class _Plan(NamedTuple):
    """Everything about a call that its shape decides, worked out once per shape."""
    algorithm: str
    why: str                   # how the algorithm was chosen (for RINGCOMM_DEBUG=info)
    window: object             # the window algorithm to run, or None for a program
    program: object            # compiled program; for a window algorithm: whether there is work
    reduce: Optional[Callable]
    static: int                # the envelope's tag bits but the sequence number (a window plan's: and its kind)
    count: int                 # the envelope's count
    shape: object = None       # a window algorithm's Shape
    word: int = 0              # what a window round carries beside its stamp (Collective.window_word ^ count_word)
    index: int = 0             # a program's schedule algorithm, as its tags carry it (Envelope.algorithm)


class Communicator(PointToPoint, SubCommunicators):
    backend = "ringcomm"

    def __init__(self, transport: Transport, *, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 selector: Optional[Selector] = None, local_rank: Optional[int] = None,
                 local_size: Optional[int] = None, node_count: int = 1, topology=None,
                 context: tuple = ()):
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.local_rank = self.rank if local_rank is None else local_rank
        self.local_size = self.size if local_size is None else local_size
        self.node_count = node_count
        self.topology = topology   # ringcomm.topology.Topology, when known
        self.timeout = timeout
        self.context = context     # () for the world; a split's path from it
        self.selector = selector or Selector.from_env()   # RINGCOMM_ALGO, tuning file
        self._seq = 0
        self._seq_p2p = 0
        self._unmatched: list = []         # receives matched in posting order, not yet matched (point_to_point.py)
        self._splits = 0
        self._groups_made: dict = {}       # (key, members) -> groups made of them (subcommunicators._group)
        self.holders = Holders()   # a sub-communicator takes its parent's (_sub)
        self._holding = True       # until close() gives up this communicator's hold
        self._broken: Optional[BaseException] = None
        self._closed = False
        self._forked: Optional[str] = None   # why a forked child cannot use it (``_disown``)
        self._pid = os.getpid()
        self._notices: list = []           # abort notices in flight; kept so they are not freed early
        # The buffers of the call that broke this communicator, kept alive from then on: a peer
        # still in that call may yet write into them (direct gather writes the root's output),
        # and freed memory would be reused by other objects.
        self._failed_call = None
        self.engine = Engine(f"rank {self.rank}", self._fail)
        self.recorder = FlightRecorder(self.rank)
        self._entry = None                 # flight-recorder entry of the running call
        self._plans: dict = {}            # call shape -> what _plan worked out for it
        self._fast = FastCalls()           # blocking window calls on buffers seen before (persistent.py)
        self._p2p = PreparedP2P()          # send/recv calls on buffers seen before (persistent.py)
        self._devices: Optional[tuple] = None   # see ``devices``
        self._plans_for = self.selector
        self.debug = env.get("RINGCOMM_DEBUG")
        self.check_finite = env.get("RINGCOMM_CHECK_FINITE")
        self._check_fields = self.debug == "detail"
        self._preflight_on = self._check_fields or self.check_finite
        for collective, forced in self.selector.forced.items():
            if self._lacks_window(algorithms.get(collective, forced), transport.window):
                raise UsageError(f"RINGCOMM_ALGO forces {collective}={forced}, which needs ranks that "
                                 f"share memory (a transport with a shared window: shm on one node, "
                                 f"or threads); this {self._windowless()}")
        _LIVE.add(self)

    def _disown(self) -> None:
        """In a child forked from this process (a DataLoader worker, a multiprocessing fork):
        the child shares the parent's shared memory, sockets and sequence numbers, but its peers
        pair every call with the parent. Two forked children's all_reduces summed each other's
        data and put the parents' next call out of step; one child's call would pair with a
        peer's call meant for its parent. So every call raises here, and close() lets go of
        nothing the parent still uses."""
        self._forked = (f"this process (pid {os.getpid()}) is a fork of the one that created the communicator "
                        f"(pid {self._pid}), and its peers pair every call with that process; a forked "
                        f"child (a DataLoader worker, a multiprocessing fork) cannot communicate on it: "
                        f"leave communication to the parent")
        self._broken = UsageError(self._forked)   # the roads that skip _check_usable refuse it too

    # ---- collectives ------------------------------------------------------------------------------
    def all_reduce(self, x, op="sum", *, out=None, algorithm=None, async_op=False):
        """Every rank ends with the reduction of every rank's x (in x, or in ``out``)."""
        # _remembered's steps written out: this is the hottest call, and a closure per call costs
        plain = out is None and algorithm is None and not async_op
        if plain:   # an in-place call on an array seen before: the persistent road (persistent.py)
            fast = self._fast
            last = fast.last   # the road of the previous all_reduce: a loop's next call is the same
            if last[0] is x and last[1] is op and last[2].valid():
                road = last[2]
            else:
                road = fast.get(("all_reduce", id(x), op), (x,))
                fast.last = (x, op, road) if road is not None else NO_LAST
            if road is not None and (result := road.run()) is not _SLOW:
                return result
        key = ("all_reduce", id(x), op)
        call = ALL_REDUCE.prepare(self, x, op, out)
        return self._start_and_learn(call, algorithm, async_op, key if plain else None, (x,))

    def all_reduce_init(self, x, op="sum", *, out=None, algorithm=None) -> Persistent:
        """A persistent all_reduce (MPI_Allreduce_init): checked and planned now, run by ``p()``
        (blocking) or ``p.start()`` (a Work) as often as needed on the same buffers."""
        call = ALL_REDUCE.prepare(self, x, op, out)
        return Persistent(self, call, self._check_algorithm(call, algorithm))

    def broadcast(self, x, root=0, *, algorithm=None, async_op=False):
        """Every rank's x becomes root's x."""
        # A root is part of the memo's key only as a plain int: 1.0 and True equal 1 as keys,
        # and the ordinary road refuses them.
        return self._remembered(("broadcast", id(x), root) if type(root) is int else None, (x,),
                                lambda: BROADCAST.prepare(self, x, root),
                                algorithm, async_op)

    def reduce(self, x, root=0, op="sum", *, out=None, algorithm=None, async_op=False):
        """Root ends with the reduction (in its x, or in ``out`` on root); no other rank's x changes."""
        return self._start(REDUCE.prepare(self, x, root, op, out), algorithm, async_op)

    def all_gather(self, out, x, *, counts=None, algorithm=None, async_op=False):
        """out = every rank's x, concatenated in rank order (``counts``: per-rank sizes)."""
        return self._remembered(("all_gather", id(out), id(x)) if counts is None else None, (out, x),
                                lambda: ALL_GATHER.prepare(self, out, x, counts), algorithm, async_op)

    def reduce_scatter(self, out, x, op="sum", *, counts=None, algorithm=None, async_op=False):
        """out = this rank's part of the reduction of every rank's x (``counts``: per-rank parts)."""
        return self._remembered(("reduce_scatter", id(out), id(x), op) if counts is None else None, (out, x),
                                lambda: REDUCE_SCATTER.prepare(self, out, x, op, counts), algorithm, async_op)

    def all_to_all(self, out, x, out_splits=None, in_splits=None, *, algorithm=None, async_op=False):
        """Block j of x goes to rank j; out holds every rank's block for this rank, in rank order."""
        even = out_splits is None and in_splits is None
        return self._remembered(("all_to_all", id(out), id(x)) if even else None, (out, x),
                                lambda: ALL_TO_ALL.prepare(self, out, x, out_splits, in_splits), algorithm, async_op)

    def gather(self, out, x, root=0, *, algorithm=None, async_op=False):
        """Root's out = every rank's x, concatenated in rank order (out None on other ranks)."""
        return self._remembered(("gather", id(out), id(x), root) if type(root) is int else None, (out, x),
                                lambda: GATHER.prepare(self, out, x, root), algorithm, async_op)

    def scatter(self, out, x, root=0, *, algorithm=None, async_op=False):
        """out = block ``rank`` of root's x (x None on other ranks)."""
        return self._remembered(("scatter", id(out), id(x), root) if type(root) is int else None, (out, x),
                                lambda: SCATTER.prepare(self, out, x, root), algorithm, async_op)

    def barrier(self, *, algorithm=None, async_op=False):
        return self._start(BARRIER.prepare(self), algorithm, async_op)

    # ---- point to point ---------------------------------------------------------------------------
    def send(self, x, dst, tag=0, *, async_op=False):
        """Send x to rank ``dst``; matched by the receive of ``dst`` with the same tag, in order.
        As with MPI_Isend, ``x`` must not change until the send completes (``async_op``: until
        its Work's wait returns): a large send is read by the receiver straight from ``x``."""
        return self._point_to_point(self._p2p.call(SEND, self, x, dst, tag), async_op)

    def recv(self, out, src, tag=0, *, async_op=False):
        """Receive into ``out`` from rank ``src`` (None: any rank; the blocking call then returns
        ``(out, source)`` and the Work has ``source``)."""
        return self._point_to_point(self._p2p.call(RECV, self, out, src, tag), async_op)

    # ---- sub-communicators ------------------------------------------------------------------------
    def split(self, color, key=0) -> Optional["Communicator"]:
        """MPI_Comm_split: ranks passing the same ``color`` form one new communicator, ordered by
        ``key`` then by rank; ``color=None`` gets None. Collective over this communicator. The new
        one has its own sequence numbers and tags and shares this one's transports."""
        # MPI_Comm_split takes C ints: a larger color raised OverflowError inside it on some
        # ranks while the rest waited there forever.
        if color is not None and (isinstance(color, bool) or not isinstance(color, (int, np.integer))
                                  or not 0 <= color < 2 ** 31):
            raise bad_value("split", "color", "an int in [0, 2**31) or None", color)
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise bad_type("split", "key", "an int", type(key).__name__)
        if not -2 ** 31 <= key < 2 ** 31:
            raise bad_value("split", "key", "an int in [-2**31, 2**31)", key)
        call = Call(_SPLIT, None, None, dtype=None, count=0, result=None)
        return self._submit(call, lambda seq: self._split(seq, color, int(key)), async_op=False)

    def dup(self) -> "Communicator":
        """A communicator of the same ranks with its own sequence numbers and tags: for a second
        thread that runs collectives of its own (collective over this communicator). A split of
        one color, named dup in its errors and records."""
        call = Call(_DUP, None, None, dtype=None, count=0, result=None)
        return self._submit(call, lambda seq: self._split(seq, 0, self.rank, "dup"), async_op=False)

    def _sub(self, transport, topology, path) -> "Communicator":
        sub = Communicator(transport, timeout=self.timeout, selector=self.selector,
                           local_rank=None if topology is None else topology.local_rank,
                           local_size=None if topology is None else topology.local_size,
                           node_count=1 if topology is None else topology.node_count,
                           topology=topology, context=path)
        sub.holders = self.holders   # a view of this one's transports: they outlive it
        self.holders.join()
        return sub

    # ---- lifecycle --------------------------------------------------------------------------------
    def abort(self, reason: str = "aborted by the user") -> None:
        """Give up: peers waiting on this rank raise PeerAbortedError carrying ``reason``."""
        err = CommError(f"rank {self.rank} aborted: {reason}")
        self._fail(err)
        self.transport.abort(err)
        self.close()
        self.transport.close()

    def close(self) -> None:
        """No further calls (they raise at once); calls already issued finish first. Device
        memory of the CUDA IPC transport is released (with every rank of the node that closes).
        In a forked child it only marks this copy closed (``_disown``)."""
        if self._forked is not None:
            self._closed = True
            self._plans, self._fast, self._p2p = {}, FastCalls(), PreparedP2P()
            return
        with self.engine.state:   # a call checks it under state, so none starts after this
            self._closed = True
        wait = (self.timeout or DEFAULT_TIMEOUT) + 5
        if not self.engine.close(timeout=wait):
            owner = self.engine.owner
            raise CommTimeoutError(f"close on rank {self.rank}: a call from thread "
                                   f"{owner.name if owner else '?'!r} still runs after {wait:g} s; the "
                                   f"transport stays open under it (close again once it returns)")
        close_device = getattr(self.transport, "close_device", None)
        if close_device is not None:
            close_device()
        clean = self._broken is None and not self.engine.outstanding
        leave = getattr(self.transport, "leave", None)
        if self.context and leave is not None:   # a sub-communicator: what it never received must not hold shared rings
            leave()
            if clean:
                self.transport.retire()   # its own MPI communicator, if any, once every member has closed it
        with self.engine.state:
            held, self._holding = self._holding, False
            # Plans made here hold windows and buffers of the transport: let them go with it.
            self._plans, self._fast, self._p2p = {}, FastCalls(), PreparedP2P()
        if held:
            self.holders.leave(clean)

    def _allow_thread(self, thread: threading.Thread, allow: bool = True) -> None:
        """Let ``thread`` call on behalf of whichever thread has calls in flight (integrations
        whose completion callbacks issue collectives, like torch's DDP comm hooks); ``allow=False``
        forgets it (a thread that ends)."""
        with self.engine.state:
            if allow:
                self.engine.delegates.add(thread)
            else:
                self.engine.delegates.discard(thread)

    @property
    def devices(self) -> tuple:
        """Where collectives take memory in place: ("cpu",), plus "cuda" when device memory can
        travel here (cupy installed, and one rank, or every peer on this node over CUDA IPC).
        DDP and the torch backend stage tensors of other devices through host memory."""
        if self._devices is None:
            refusal = getattr(self.transport, "device_refusal", None)
            reachable = self.size == 1 or (refusal is not None and refusal(None) is None)
            self._devices = ("cpu", "cuda") if reachable and cupy_installed() else ("cpu",)
        return self._devices

    def __repr__(self) -> str:
        return f"<ringcomm.Communicator backend={self.backend} rank={self.rank} size={self.size}>"

    # ---- argument checks (calling rank, before any communication) ---------------------------------
    def _check_algorithm(self, call: Call, algorithm) -> Optional[str]:
        name = call.name
        if call.device != "cpu":
            self._check_device(call)
        if algorithm is None:
            return None
        if not isinstance(algorithm, str):
            raise bad_type(name, "algorithm", "a str or None", type(algorithm).__name__)
        chosen = algorithms.get(name, algorithm)
        if self._lacks_window(chosen, self._window_for(call)):
            why = (f"{self.transport.name} transport offers no window for this array" if call.device != "cpu"
                   else self._windowless()) if self._window_for(call) is None \
                else f"{self.transport.name} transport cannot read peers' memory in place here (CMA is off)"
            raise bad_value(name, "algorithm", f"an algorithm other than {algorithm} (it needs ranks that "
                            f"share host memory; this {why})", algorithm)
        if chosen.kind == "schedule" and chosen.even_only and call.collective.is_uneven(call):
            raise bad_value(name, "algorithm", f"an algorithm for uneven counts (not {algorithm}, which needs "
                            f"equal counts on every rank)", algorithm)
        return algorithm

    def _windowless(self) -> str:
        """Why this communicator has no shared window, for errors that refuse a window algorithm."""
        if not self.context:
            return f"job's {self.transport.name} transport offers no window"
        # A closed sub-communicator keeps its slot: a member still in it may read its region.
        return ("sub-communicator offers no window: it gets one only where its members share a node and a "
                "shared-window slot is free on each of them (7 per rank; a sub-communicator keeps its "
                "slot after close, so a job that made 7 with windows has none left)")

    def _lacks_window(self, algorithm, window) -> bool:
        """Whether ``algorithm`` is a window algorithm that ``window`` (None: none) cannot run.
        A communicator of one rank moves nothing, so any algorithm runs on it: refusing one there
        would fail a program on the one rank a split left alone while its peers go on."""
        return algorithm.kind == "window" and self.size > 1 and not algorithm.runs_on(window)

    def _check_device(self, call: Call) -> None:
        """Device memory where this communicator cannot carry it: UsageError before the call."""
        refusal = getattr(self.transport, "device_refusal", None)
        if refusal is not None:
            why = refusal(call.device)
        elif self.size > 1:
            why = (f"this communicator's {self.transport.name} transport carries host memory only; CUDA "
                   f"tensors travel over CUDA IPC between ranks of one node (RINGCOMM_TRANSPORT=auto), "
                   f"or through backend 'nccl'")
        else:
            why = None
        forced = self.selector.forced.get(call.name)
        if why is None and forced is not None and self._lacks_window(algorithms.get(call.name, forced),
                                                                     self._window_for(call)):
            schedules = ", ".join(n for n in algorithms.names(call.name) if not algorithms.is_window(call.name, n))
            why = (f"RINGCOMM_ALGO forces {forced}, which runs on host shared memory only, and this call's "
                   f"buffers are on {call.device}: force a schedule algorithm ({schedules})")
        if why is not None:
            raise UsageError(f"{call.name} on rank {self.rank}: {why}")

    def _window_for(self, call: Call):
        """The transport's shared window, if this call may use it (host memory only)."""
        return self.transport.window if call.device == "cpu" else None

    # ---- execution --------------------------------------------------------------------------------
    def _remembered(self, key: Optional[tuple], objs: tuple, prepare: Callable, algorithm, async_op: bool):
        """A collective whose blocking calls may take the memo's road (persistent.py): ``key`` (its
        arguments as passed; None where they rule it out) finds a road remembered for these very
        buffers ``objs``; otherwise ``prepare()`` and the ordinary road, which may remember it."""
        if algorithm is not None or async_op:
            key = None
        elif key is not None and (result := self._fast_run(key, objs)) is not _SLOW:
            return result
        return self._start_and_learn(prepare(), algorithm, async_op, key, objs)

    def _fast_run(self, key: tuple, objs: tuple):
        """Run a blocking call on buffers seen before by the road remembered for it (persistent.py);
        _SLOW when there is none or it does not apply now."""
        fast = self._fast.get(key, objs)
        return _SLOW if fast is None else fast.run()

    def _start_and_learn(self, call: Call, algorithm, async_op: bool, key: Optional[tuple], objs: tuple):
        """Run the call; if ``key`` is given and the call qualifies, remember its road for the next
        blocking call with the same arguments."""
        result = self._start(call, algorithm, async_op)
        if key is not None and self.size > 1:
            self._fast.remember(key, objs, self, call)
        return result

    def _start(self, call: Call, algorithm, async_op: bool):
        return self._start_prepared(call, self._check_algorithm(call, algorithm), async_op)

    def _start_prepared(self, call: Call, algorithm: Optional[str], async_op: bool):
        collective = call.collective

        def job(seq):
            collective.before(call, self.rank, self.size)
            self._collective(call, algorithm, seq)
            collective.after(call, self.rank, self.size)
            return call.result
        return self._submit(call, job, async_op)

    def _collective(self, call: Call, algorithm: Optional[str], seq: int) -> None:
        """Move the data of ``call``: the backend seam. Reference backends (MPI, gloo, NCCL)
        override this method and nothing else; ``call.arrays()`` are its input and output."""
        plan = self._plan_for(call, algorithm)
        if _log.isEnabledFor(logging.INFO):   # RINGCOMM_DEBUG=info: why this algorithm ran
            _log.info("rank %d %s #%d: %s, %d x %s (%s)", self.rank, call.name, seq, plan.algorithm, call.count,
                      call.dtype.name if call.dtype else "bytes", plan.why)
        self._entry.algorithm = plan.algorithm
        dname = call.dtype.name if call.dtype else None
        if not plan.program:
            # Uneven calls may move nothing on one rank and much on another: nothing to meet over.
            if self.size > 1 and not call.collective.is_uneven(call):
                self._meet(call, seq, dname)
            return
        inp, out = call.arrays()
        if plan.window is not None:
            if self.size == 1:
                if not call.in_place:
                    out[...] = inp
                return
            started = self._entry.started   # the deadline counts from the start of the call
            plan.window.run(self.transport.window, inp, out, plan.shape, plan.reduce,
                            window_stamp(seq, plan.static, plan.count), plan.word,
                            lambda: executor.WindowGuard(
                                self.transport,
                                Envelope(seq, call.collective.code, dname, plan.count, op_code(call.op)),
                                self.timeout, self._what(call, seq, plan.algorithm), started, plan.count,
                                plan.word, call.collective.describe_word, plan.static,
                                algorithms.window_names(call.collective.name)))
            return
        if call.device != "cpu" and self.size > 1:
            self._device_route(call, seq, plan.algorithm)
        envelope = Envelope(seq, call.collective.code, dname, plan.count, op_code(call.op), plan.index)
        bufs = (inp, out, None)
        what = self._what(call, seq, plan.algorithm)
        if type(self.transport).stage is Transport.stage:   # nothing to stage: skip the ~1 us context
            executor.run(plan.program, self.transport, bufs, plan.reduce, envelope=envelope, timeout=self.timeout,
                         what=what)
            return
        with self.transport.stage(tuple(a for a in (inp, out) if a is not None)):
            executor.run(plan.program, self.transport, bufs, plan.reduce, envelope=envelope, timeout=self.timeout,
                         what=what)

    def _meet(self, call: Call, seq: int, dname: Optional[str]) -> None:
        """A call with nothing to move on this rank still meets its peers, in a barrier whose
        messages carry this call's envelope: a rank whose call is empty where a peer's is not
        (or is another collective) raises MismatchError with the peer. It once returned at
        once, and its peers timed out waiting for it."""
        program = algorithms.plan("barrier", "dissemination", self.rank, BARRIER.prepare(self).shape(self.size, 1))
        envelope = Envelope(seq, call.collective.code, dname, 0, op_code(call.op))
        executor.run(program, self.transport, (None, None, None), None, envelope=envelope, timeout=self.timeout,
                     what=self._what(call, seq, "dissemination"))

    def _device_route(self, call: Call, seq: int, algorithm: str) -> None:
        """The CUDA IPC transport, created by the first device call (a handshake over the node,
        transport/routed.py) within this call's deadline, released by a peer's abort notice."""
        create = getattr(self.transport, "device_transport", None)
        if create is None:
            return
        left = None if self.timeout is None else max(0.0, self._entry.started + self.timeout - time.monotonic())
        try:
            create(left, self._peer_gave_up)
        except CommError as err:
            raise type(err)(f"{self._what(call, seq, algorithm)} on rank {self.rank}: setting up the CUDA IPC "
                            f"transport: {err}") from err

    def _peer_gave_up(self) -> Optional[str]:
        """"rank R gave up: <its reason>" if a peer's abort notice waits here, else None."""
        notice = self.transport.probe(None, ABORT_TAG)
        return None if notice is None else self.transport.read_notice(notice)

    @staticmethod
    def _logging() -> bool:
        return _log.isEnabledFor(logging.INFO)

    @staticmethod
    def _what(call: Call, seq: int, algorithm: str) -> str:
        return f"{call.name} #{seq} ({algorithm}, {call.count} x {call.dtype.name if call.dtype else 'bytes'})"

    def _plan_for(self, call: Call, forced: Optional[str]) -> _Plan:
        # call.uneven: an all_to_all with splits passed plans as uneven even where this rank's
        # splits equal an even call's (its peers' may not), so it must not reuse that call's plan
        key = (call.collective, forced, call.count, call.counts, call.recv_counts, call.root, call.in_place,
               call.dtype, call.op, call.device != "cpu", call.uneven)
        if self._plans_for is not self.selector:   # a new selector (tuning, forcing) decides afresh
            self._plans.clear()
            self._plans_for = self.selector
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= PLAN_MEMO:
                self._plans.clear()
            plan = self._plans[key] = self._plan(call, forced)
        return plan

    def _plan(self, call: Call, forced: Optional[str]) -> _Plan:
        collective, name = call.collective, call.name
        nodes = None if self.topology is None else self.topology.node_of
        host = call.device == "cpu"
        nbytes = collective.nbytes(call, self.size)
        chosen = forced or self.selector.choose(name, nbytes, self.size, dtype=call.dtype.name if call.dtype else "uint8",
                                                nodes=nodes, transport=self.transport, window=host,
                                                uneven=collective.is_uneven(call))
        by_env = self.selector.forced.get(name)
        how = "algorithm= argument" if forced else "RINGCOMM_ALGO" if by_env == chosen else \
            "cost model" if by_env is None else f"cost model: RINGCOMM_ALGO's {by_env} needs equal counts"
        reduce = None if call.op is None else reducer(call.op, call.dtype)
        count = collective.envelope_count(call)
        static = static_bits(collective.code, call.dtype.name if call.dtype else None, count, op_code(call.op))
        seg_bytes = DEFAULT_SEGMENT_BYTES if host else DEVICE_SEGMENT_BYTES
        seg = max(1, seg_bytes // (call.dtype.itemsize if call.dtype else 1))
        if algorithms.is_window(name, chosen):
            window, shape = algorithms.get(name, chosen), call.shape(self.size, seg)
            static |= window_kind_bits(algorithms.window_kind(name, chosen))
            return _Plan(chosen, how, window, window.has_work(shape), reduce, static, count, shape,
                         collective.window_word(call) ^ count_word(count))
        program = algorithms.plan(name, chosen, self.rank, call.shape(self.size, seg, nodes),
                                  collective.confirms(call))
        return _Plan(chosen, how, None, program, reduce, static, count, index=algorithms.schedule_index(name, chosen))

    def _submit(self, call: Call, job: Callable, async_op: bool):
        engine = self.engine
        scope = scope_for(call)   # device memory: its device and the caller's stream (core/streams.py)
        with engine.state:
            self._check_usable(call.name)
            me = engine.admit(call.name)
            seq = self._seq
            self._seq += 1
            entry = self.recorder.record(seq, call.name, call.count, call.dtype and call.dtype.name)
            inline = not async_op and engine.outstanding == 0 and engine.inline is None
            if inline:
                engine.inline = me
            else:
                work = Work(f"{call.name} #{seq} on rank {self.rank}")

                def run():
                    result, error = None, None
                    try:
                        with engine.exec:
                            result = self._execute(seq, call, job, entry, scope)
                    except BaseException as err:  # surfaced to the caller through Work.wait()
                        error = err
                    engine.done()
                    work._finish(result, error)
                engine.enqueue(run)
        if inline:
            engine.exec.acquire()
            try:
                return self._execute(seq, call, job, entry, scope)
            finally:
                engine.release_inline()
        if async_op:
            return work
        try:
            return work.wait()
        except BaseException as err:   # a blocking call left: it runs on, and its caller cannot tell
            self._interrupted(err, work.description, call)
            raise

    def _check_usable(self, what: str) -> None:
        if self._forked is not None:
            raise UsageError(f"{what} on rank {self.rank}: {self._forked}")
        if self._closed:
            raise CommError(f"{what} on rank {self.rank}: the communicator is closed")
        if self._broken is not None:
            raise CommError(f"{what} on rank {self.rank}: communicator is unusable after an earlier "
                            f"failure: {self._broken}") from self._broken

    def _execute(self, seq: int, call: Call, job: Callable, entry, scope=None):
        """Run one job (under the exec lock): pre-flight, data movement, bookkeeping on failure.
        ``scope``: a device call's DeviceScope, entered around all of it."""
        self._entry = entry
        entry.state, entry.started = "running", time.monotonic()
        try:
            if self._broken is not None:   # queued before an earlier call failed
                raise CommError(f"{call.name} #{seq} on rank {self.rank}: not run: the communicator failed "
                                f"earlier: {self._broken}") from self._broken
            if scope is None:
                result = self._run_job(seq, call, job)
            else:
                with scope:
                    result = self._run_job(seq, call, job)
        except PeerAbortedError as err:
            entry.state = "failed: PeerAbortedError"
            err = self._with_reason(err, f"{call.name} #{seq} on rank {self.rank}")
            self._fail(err, call)
            raise err
        except CommunicatorLimitError:   # refused alike on every rank: nothing out of step
            entry.state = "failed: CommunicatorLimitError"
            raise
        except CommError as err:
            entry.state = f"failed: {type(err).__name__}"
            err = self._named(err, f"{call.name} #{seq} on rank {self.rank}")
            self._fail(err, call)
            raise err
        except BaseException as err:
            entry.state = f"failed: {type(err).__name__}"
            self._interrupted(err, f"{call.name} #{seq} on rank {self.rank}", call)
            raise
        entry.state, entry.ended = "done", time.monotonic()
        return result

    def _run_job(self, seq: int, call: Call, job: Callable):
        if self._preflight_on and call.collective.name != "split":
            self._preflight(seq, call)
        return job(seq)

    def _preflight(self, seq: int, call: Call) -> None:
        preflight.check(self.transport, self.timeout, f"{call.name} #{seq}", self._fingerprint(seq, call),
                        check_fields=self._check_fields, call_parts=preflight.parts(call, self.size),
                        pairwise=call.recv_counts is not None)

    def _fingerprint(self, seq: int, call: Call) -> list:
        buf = call.inp
        non_finite = self.check_finite and buf is not None and \
            preflight.has_non_finite(buf.flat, buf.dtype.name)
        return preflight.fingerprint(call.collective.code, seq, call.collective.envelope_count(call),
                                     call.dtype and call.dtype.name, call.op and call.op.value, call.root, non_finite)

    def _with_reason(self, err: PeerAbortedError, what: str) -> PeerAbortedError:
        """A transport that saw a peer give up (a flag in shared memory, a released wait) knows
        only that it did; the peer's abort notice says why. Read it, if it came. Without one,
        the error still names the call (``what``: "all_reduce #7 on rank 1")."""
        named = err if str(err).startswith(what.split(" on rank ")[0]) else PeerAbortedError(f"{what}: {err}")
        if named is not err:
            named.__cause__ = err
        if " gave up: " in str(err):   # the notice read already (a transport's aborted_reason)
            return named
        try:
            why = self._peer_gave_up()
        except CommError:
            return named
        if why is None:
            return named
        better = PeerAbortedError(f"{what}: {why}")
        better.__cause__ = err
        return better

    def _named(self, err: CommError, what: str) -> CommError:
        """``err`` naming its call (``what``: "all_reduce #7 on rank 1"), where it is a transport's
        own words: "shm transport on rank 1: cannot read 524288 bytes at ... of rank 0" came with
        no call, and no word of the peer's abort notice that had come first (it was interrupted
        and had exited since); with one waiting, its reason goes in too."""
        if str(err).startswith(what.split(" on rank ")[0]):
            return err
        try:
            why = self._peer_gave_up()
        except CommError:
            why = None
        try:
            named = type(err)(f"{what}: {err}" + (f"; {why}" if why else ""))
        except Exception:   # a subclass built otherwise: its own words stand
            return err
        named.__cause__ = err
        return named

    def _interrupted(self, err: BaseException, what: str, call: Optional[Call] = None) -> None:
        """A call left in the middle by an exception not the library's own: KeyboardInterrupt
        (Ctrl-C in a notebook), one raised by a signal handler, a bug. Its messages are half
        moved and nobody can tell which: a blocking recv retried after Ctrl-C took the sender's
        next message, and the first landed later in the abandoned buffer. So the communicator is
        broken from here on, loudly on every rank (``_fail`` tells the peers at once, instead of
        leaving them to wait for this rank until their timeout); ``err`` itself propagates."""
        if isinstance(err, RingcommError) or self._broken is not None:
            return
        why = f": {err}" if str(err) else ""
        self._fail(CommError(f"{what}: interrupted by {type(err).__name__}{why}; its messages are half moved, "
                             f"so this communicator cannot go on (a new one can: ringcomm.init)"), call)

    def _fail(self, err: CommError, call: Optional[Call] = None) -> None:
        """The communicator is broken from now on; tell the peers so that they fail fast too.
        ``call``: the collective that failed, whose buffers stay alive (``_failed_call``)."""
        first = self._broken is None
        self._broken = self._broken or err
        if first and call is not None:
            self._failed_call = call
        if isinstance(err, CommTimeoutError):
            self.recorder.dump(str(err))
        if first and _tells_peers(err):
            text = np.frombuffer(str(err).encode()[:4000], np.uint8).copy()
            for peer in range(self.size):
                if peer != self.rank:
                    try:
                        self._notices.append(self.transport.isend(text, peer, ABORT_TAG))
                    except CommError:
                        pass   # that peer is gone too: nothing to tell it
        window = self.transport.window
        if first and window is not None:   # after the notices: a peer that sees the poison finds why
            window.poison()


def _tells_peers(err: CommError) -> bool:
    """Whether a failure is news to the other ranks: not when a peer's own notice or abort
    brought it (that peer told everyone), but when this rank found a peer's process ended, which
    only the peers of its node can see (transport/shm) and nobody announced."""
    if not isinstance(err, PeerAbortedError):
        return True
    text = str(err)
    return PEER_ENDED in text and " gave up: " not in text
