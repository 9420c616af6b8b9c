"""torch.distributed on ringcomm: the process group of backend "ringcomm".

    import ringcomm, torch.distributed as dist
    dist.init_process_group("ringcomm")   # under mpirun, torchrun, or torch's test harness
    torch.nn.parallel.DistributedDataParallel(model)   # its buckets reduce on ringcomm

``import ringcomm`` registers the backend (autoregister.py); torch_groups.py says which
Communicator each group runs on (the world's, or one its members make for it).

``RingcommProcessGroup`` is a Python ``torch.distributed.ProcessGroup`` subclass (the pattern of
torch/testing/_internal/distributed/multi_threaded_pg.py). c10d calls its methods both from
Python (dist.all_reduce -> ``allreduce``; dist.all_gather_into_tensor -> ``all_gather_single``)
and from C++ (torch's DDP reducer -> ``allreduce``; functional collectives -> ``allreduce``,
``_allgather_base``, ...), so every spelling of each collective is provided. Every method that
CPU torch dispatches to a backend is here; what it maps to is the table in docs/ddp.md.

Each collective becomes ONE ringcomm call, issued in order by the Engine (torch_engine.py) and
returned as a ``torch_work.Work``: ``wait()`` raises the collective's error, its futures are
typed the way torch's C++ hooks expect, and their callbacks may block without stalling later
collectives. The coalesced forms pack their tensors into one buffer, run one collective and
unpack (not a loop of collectives). Data movement goes as bytes, so every dtype travels;
reductions as typed memory, so ringcomm checks the op against the dtype. Tensors the
communicator cannot take in place (CUDA for a CPU-only backend, non-contiguous ones) go through
a contiguous host copy, written back only once the call has succeeded; CUDA tensors stay on the
device where the communicator lists "cuda" in ``comm.devices``. Sends and receives
complete on their own (torch_p2p.py). Each call shows in torch.profiler as "ringcomm:<name>",
named as torch's gloo names its ranges ("gloo:all_reduce").
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions,
                                        BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions,
                                        ScatterOptions)

from ..core.ops import premul_sum
from ..errors import UsageError, bad_value
from ..work import Work as RingcommWork
from .autoregister import BACKEND
from .torch_groups import Shared, forget_world, group_on, init_process_group, register  # noqa: F401
from .torch_monitored import barrier_seconds
from .torch_p2p import P2PWork
from .torch_sparse import sparse_sum
from .torch_tensors import (NUMPY, alike, apart, as_bytes, host_input, host_view, offsets_of, pack, raw, real_pairs,
                            sizes_of, staged, uneven, unpack)
from .torch_work import ABORT_GRACE, Combined, Pending, Work, begin_range, call_site, seconds

RedOp = dist.ReduceOp.RedOpType
_OPS = {RedOp.SUM: "sum", RedOp.AVG: "avg", RedOp.PRODUCT: "prod", RedOp.MIN: "min", RedOp.MAX: "max",
        RedOp.BAND: "band", RedOp.BOR: "bor", RedOp.BXOR: "bxor"}
_OP_NAMES = "ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or PREMUL_SUM"


def _op(opts, collective: str):
    """The ringcomm op of ``opts.reduceOp`` (premul_sum with its factor); an op ringcomm lacks is
    named as torch names it ("ReduceOp.UNUSED"), never as an object address."""
    reduce_op = opts.reduceOp
    kind = getattr(reduce_op, "op", reduce_op)
    if kind == RedOp.PREMUL_SUM:
        factor = reduce_op.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise bad_value(collective, "op", "a PREMUL_SUM whose factor is a number or a 1-element tensor",
                                f"a factor of {factor.numel()} elements")
            factor = factor.item()
        return premul_sum(float(factor))
    if kind not in _OPS:
        raise bad_value(collective, "op", _OP_NAMES, f"ReduceOp.{getattr(kind, 'name', kind)}")
    return _OPS[kind]


def _call(collective: Callable, *args, **kwargs) -> Callable:
    """``launch(async_op=True)``: the ringcomm call, async (a Work) or synchronous (run inline)."""
    return lambda async_op=True: collective(*args, async_op=async_op, **kwargs)


def _typed(t: torch.Tensor):
    """A tensor as a send/recv carries it: typed where ringcomm knows the dtype (a receive of
    another dtype then raises MismatchError), else as bytes."""
    return host_view(t) if (t.dtype in NUMPY or t.dtype == torch.bfloat16) and t.device.type == "cpu" else raw(t)


class RingcommProcessGroup(dist.ProcessGroup):
    """c10d process group whose collectives run on a ringcomm Communicator."""

    def __init__(self, shared: Shared, rank: int, size: int, timeout: Optional[float] = None,
                 name: Optional[str] = None, ranks: Optional[list] = None):
        super().__init__(rank, size)
        comm = shared.comm
        if (rank, size) != (comm.rank, comm.size):
            raise UsageError(f'ringcomm process group got unexpected value for argument "rank, size" '
                             f'(expected its communicator\'s ({comm.rank}, {comm.size}), got ({rank}, {size}))')
        self.comm, self._shared = comm, shared
        self._rank, self._size = rank, size
        self.ranks = ranks   # global ranks of a sub-group; None for the default group
        self._name = name
        # Seconds any one collective of this group may take; None: the communicator's.
        self.timeout = float(timeout if timeout is not None else comm.timeout or dist.default_pg_timeout.total_seconds())
        self._closed: Optional[str] = None
        self._coalesced: Optional[list] = None   # Works since _start_coalescing
        self.engine = shared.engine
        shared.join(self)

    @property
    def comm_seconds(self) -> float:
        """Seconds a collective of this communicator was in flight (which may overlap compute)."""
        return self.engine.busy_seconds

    def getBackendName(self) -> str:   # noqa: N802 - c10d's name
        return BACKEND

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    # c10d keeps a group's name on its C++ backends, which a Python group has none of: kept here.
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        if self._name is None:
            raise UsageError("ringcomm process group: no group name set yet")
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "undefined")

    def __repr__(self) -> str:
        return f"RingcommProcessGroup(rank={self._rank}, size={self._size}, comm={self.comm!r})"

    # ---- timeouts and lifetime ----------------------------------------------------------------
    def set_timeout(self, timeout) -> None:
        value = seconds(timeout)
        if value is None or not math.isfinite(value):
            raise bad_value("set_timeout", "timeout", "a positive timedelta", timeout)
        self.timeout = value
        self._shared.retime()

    def abort_communicator(self, reason: str) -> None:
        """Abort the communicator: every rank's waits on it end with an error."""
        self._shared.abort(reason)

    def abort(self) -> None:
        """dist.distributed_c10d._abort_process_group(): abort the communicator; pending and
        queued collectives fail at once."""
        if self._closed == "aborted":
            return
        self._closed = "aborted"
        self.abort_communicator(f"process group aborted on rank {self._rank} (ProcessGroup.abort)")
        if self._shared.leave(self):
            self.engine.close()
            self._shared.monitor.close()
            forget_world(self._shared)

    def shutdown(self) -> None:
        """dist.destroy_process_group(): let issued collectives finish (or fail on their deadline),
        then close the communicator if this was its last group and it was made for torch."""
        if self._closed is not None:
            return
        self._closed = "shut down"
        self.engine.drain(self.timeout + 2 * ABORT_GRACE)
        if self._shared.leave(self):
            self.engine.close()
            self._shared.monitor.close()
            if self._shared.owned and not self._shared.aborted:
                self.comm.close()
            forget_world(self._shared)

    # ---- plumbing ---------------------------------------------------------------------------
    def _submit(self, collective: str, launches: list, result: list, finish: Optional[Callable], opts,
                tensors: list):
        """One c10d Work for ``launches`` (ringcomm calls, issued in order by the Engine).

        ``opts.asyncOp`` is False when torch's Python API waits at once (dist.all_reduce without
        async_op): then the Engine may run the collective in this thread (not while profiling:
        a range must end on another thread, as gloo's do). ``opts.timeout``, when set, bounds
        this call instead of the group's timeout. ``tensors``: the shapes the profiler records.
        """
        self._check_open(collective)
        profiled = begin_range(collective, tensors)
        pending = Pending(self, collective, launches, result, finish, call_site(),
                          seconds(getattr(opts, "timeout", None)), profiled)
        self.engine.submit(pending, blocking=not getattr(opts, "asyncOp", True) and profiled is None)
        return self._track(Work(pending))

    def _check_open(self, collective: str) -> None:
        if self._closed is not None:
            raise bad_value(collective, "group", "a live process group", f"a group that was {self._closed}")

    def _track(self, work):
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    @staticmethod
    def _one(tensors: list, collective: str, what: str = "tensors"):
        if len(tensors) != 1:
            raise bad_value(collective, what, "one tensor (list) per process", f"{len(tensors)} entries")
        return tensors[0]

    def _same_dtype(self, collective: str, argument: str, tensors: list, dtype) -> None:
        odd = sorted({str(t.dtype) for t in tensors if t.dtype != dtype})
        if odd:
            raise bad_value(collective, argument, f"tensors of {dtype} (one fused call)", f"also {', '.join(odd)}")

    def _count(self, collective: str, argument: str, got: int, expected: int, unit: str = "elements") -> None:
        if got != expected:
            raise bad_value(collective, argument, f"{expected} {unit}", f"{got} {unit}")

    # ---- all-reduce --------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        t = self._one(tensors, "allreduce")
        opts = opts or AllreduceOptions()
        op = _op(opts, "allreduce")
        if t.is_sparse:
            return self._sparse_allreduce(tensors, t, op, opts)
        work_t, back = staged(self.comm, t)
        return self._submit("all_reduce", [_call(self.comm.all_reduce, host_view(work_t), op=op)], tensors, back,
                            opts, [t])

    def _sparse_allreduce(self, tensors, t: torch.Tensor, op, opts):
        """A sparse COO sum, as gloo offers (torch_sparse.py); the result replaces ``t``'s contents."""
        if op != "sum":
            raise bad_value("allreduce", "op", "ReduceOp.SUM for a sparse tensor", f"ReduceOp.{str(op).upper()}")
        result = []

        def run(async_op=True):
            result.append(sparse_sum(self.comm, t))
            done = RingcommWork(f"sparse all_reduce on rank {self._rank}")
            done._finish(result[0])
            return done
        return self._submit("all_reduce", [run], tensors, lambda: t.copy_(result[0].to(t.device)), opts, [t])

    def allreduce_coalesced(self, tensors, opts=None):
        """ONE all-reduce of every tensor packed side by side (they share a dtype, as on gloo)."""
        opts = opts or AllreduceCoalescedOptions()
        op = _op(opts, "allreduce_coalesced")
        if not tensors:
            raise bad_value("allreduce_coalesced", "tensors", "at least one tensor", "none")
        self._same_dtype("allreduce_coalesced", "tensors", tensors, tensors[0].dtype)
        buffer, offsets = pack(tensors)
        flat = buffer.view(tensors[0].dtype)
        return self._submit("all_reduce_coalesced", [_call(self.comm.all_reduce, host_view(flat), op=op)], tensors,
                            lambda: unpack(tensors, buffer, offsets), opts, tensors)

    # ---- broadcast / reduce -----------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        t = self._one(tensors, "broadcast")
        opts = opts or BroadcastOptions()
        work_t, back = staged(self.comm, t)
        # Bytes: a broadcast moves data without arithmetic, so any dtype (bool, complex) travels.
        launch = _call(self.comm.broadcast, raw(work_t), root=opts.rootRank)
        return self._submit("broadcast", [launch], tensors, back, opts, [t])

    def reduce(self, tensors, opts=None):
        t = self._one(tensors, "reduce")
        opts = opts or ReduceOptions()
        op = _op(opts, "reduce")
        work_t, back = staged(self.comm, real_pairs(t, op))
        launch = _call(self.comm.reduce, host_view(work_t), root=opts.rootRank, op=op)
        return self._submit("reduce", [launch], tensors, back, opts, [t])

    # ---- all-gather ----------------------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        """dist.all_gather: rank r's tensor lands in outputs[r]; sizes may differ by rank."""
        outs = self._one(output_tensors, "allgather", "output_tensors")
        x = self._one(input_tensors, "allgather", "input_tensors")
        self._count("allgather", "output_tensors", len(outs), self._size, "tensors")
        self._same_dtype("allgather", "output_tensors", outs, x.dtype)
        self._count("allgather", f"output_tensors[{self._rank}]", outs[self._rank].numel(), x.numel())
        counts = sizes_of(outs)
        gathered = torch.empty(sum(counts), dtype=torch.uint8)
        launch = _call(self.comm.all_gather, raw(gathered), raw(as_bytes(x)), counts=uneven(counts))
        return self._submit("all_gather", [launch], outs, lambda: unpack(outs, gathered, offsets_of(counts)),
                            opts or AllgatherOptions(), [x])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """ONE all-gather of every input packed side by side; output_lists[r] gets rank r's."""
        self._count("allgather_coalesced", "output_lists", len(output_lists), self._size, "lists")
        for r, outs in enumerate(output_lists):
            self._count("allgather_coalesced", f"output_lists[{r}]", len(outs), len(input_list), "tensors")
        mine, _ = pack(input_list)
        counts = [sum(sizes_of(outs)) for outs in output_lists]
        self._count("allgather_coalesced", f"output_lists[{self._rank}]", counts[self._rank], mine.numel(), "bytes")
        gathered = torch.empty(sum(counts), dtype=torch.uint8)
        starts = offsets_of(counts)

        def finish():
            for r, outs in enumerate(output_lists):
                unpack(outs, gathered[starts[r]:starts[r + 1]], offsets_of(sizes_of(outs)))
        launch = _call(self.comm.all_gather, raw(gathered), raw(mine), counts=uneven(counts))
        return self._submit("all_gather_coalesced", [launch], output_lists, finish, opts or AllgatherOptions(),
                            list(input_list))

    def all_gather_single(self, output, input, opts=None):
        if output.dtype != input.dtype:
            raise bad_value("all_gather_into_tensor", "output_tensor", f"a tensor of {input.dtype}", output.dtype)
        self._count("all_gather_into_tensor", "output_tensor", output.numel(), self._size * input.numel())
        out_t, back = staged(self.comm, output)
        mine = apart(alike(input, out_t), out_t, in_place_at=self._rank * input.numel() * input.element_size())
        launch = _call(self.comm.all_gather, raw(out_t), raw(mine))
        return self._submit("all_gather_into_tensor", [launch], [output], back, opts or AllgatherOptions(), [input])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """ONE all-gather of every input packed side by side, unpacked into each output."""
        self._count("all_gather_into_tensor_coalesced", "outputs", len(outputs), len(inputs), "tensors")
        for i, (o, x) in enumerate(zip(outputs, inputs)):
            self._count("all_gather_into_tensor_coalesced", f"outputs[{i}]", o.numel() * o.element_size(),
                        self._size * x.numel() * x.element_size(), "bytes")
        mine, offsets = pack(inputs)
        gathered = torch.empty(self._size * mine.numel(), dtype=torch.uint8)

        def finish():
            rows = gathered.view(self._size, -1)
            for o, start, end in zip(outputs, offsets, offsets[1:]):
                if o.numel():
                    o.copy_(rows[:, start:end].contiguous().view(o.dtype).view(o.shape))
        launch = _call(self.comm.all_gather, raw(gathered), raw(mine))
        return self._submit("all_gather_into_tensor_coalesced", [launch], outputs, finish,
                            opts or AllgatherOptions(), list(inputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter ----------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """dist.reduce_scatter: out = the reduction of every rank's input_list[rank]; the parts
        may differ in size by rank."""
        opts = opts or ReduceScatterOptions()
        out = self._one(output_tensors, "reduce_scatter", "output_tensors")
        chunks = self._one(input_tensors, "reduce_scatter", "input_tensors")
        self._count("reduce_scatter", "input_list", len(chunks), self._size, "tensors")
        self._same_dtype("reduce_scatter", "input_list", chunks, out.dtype)
        counts = [c.numel() for c in chunks]
        self._count("reduce_scatter", f"input_list[{self._rank}]", counts[self._rank], out.numel())
        op = _op(opts, "reduce_scatter")
        buffer, _ = pack(chunks)
        pairs = real_pairs(out, op)
        if pairs is not out:   # complex: counted in real parts
            counts = [2 * c for c in counts]
        out_t, back = staged(self.comm, pairs)
        launch = _call(self.comm.reduce_scatter, host_view(out_t).reshape(-1),
                       host_view(alike(buffer.view(pairs.dtype), out_t)),
                       op=op, counts=uneven(counts))
        return self._submit("reduce_scatter", [launch], [out], back, opts, chunks)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or ReduceScatterOptions()
        op = _op(opts, "reduce_scatter_tensor")
        self._count("reduce_scatter_tensor", "input", input.numel(), self._size * output.numel())
        if output.dtype != input.dtype:
            raise bad_value("reduce_scatter_tensor", "output", f"a tensor of {input.dtype}", output.dtype)
        out_t, back = staged(self.comm, real_pairs(output, op))
        x = host_view(apart(alike(real_pairs(input, op), out_t), out_t))
        launch = _call(self.comm.reduce_scatter, host_view(out_t).reshape(-1), x.reshape(-1), op=op)
        return self._submit("reduce_scatter_tensor", [launch], [output], back, opts, [input])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """ONE reduce-scatter: block r of every input, side by side, is rank r's part."""
        opts = opts or ReduceScatterOptions()
        op = _op(opts, "reduce_scatter_tensor_coalesced")
        self._count("reduce_scatter_tensor_coalesced", "outputs", len(outputs), len(inputs), "tensors")
        if not inputs:
            raise bad_value("reduce_scatter_tensor_coalesced", "inputs", "at least one tensor", "none")
        dtype = inputs[0].dtype
        self._same_dtype("reduce_scatter_tensor_coalesced", "inputs", list(inputs) + list(outputs), dtype)
        for i, (o, x) in enumerate(zip(outputs, inputs)):
            self._count("reduce_scatter_tensor_coalesced", f"inputs[{i}]", x.numel(), self._size * o.numel())
        blocks = torch.cat([host_input(x).reshape(self._size, -1) for x in inputs], dim=1).reshape(-1)
        part = torch.empty(blocks.numel() // self._size, dtype=dtype)
        offsets = offsets_of([o.numel() for o in outputs])

        def finish():
            for o, start, end in zip(outputs, offsets, offsets[1:]):
                o.copy_(part[start:end].view(o.shape))
        launch = _call(self.comm.reduce_scatter, host_view(part), host_view(blocks), op=op)
        return self._submit("reduce_scatter_tensor_coalesced", [launch], outputs, finish, opts, list(inputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- all-to-all ------------------------------------------------------------------------------
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """dist.all_to_all: input_tensors[j] goes to rank j; sizes may differ (uneven)."""
        self._count("alltoall", "output_tensor_list", len(output_tensors), self._size, "tensors")
        self._count("alltoall", "input_tensor_list", len(input_tensors), self._size, "tensors")
        if input_tensors:
            self._same_dtype("alltoall", "output_tensor_list", output_tensors, input_tensors[0].dtype)
            self._same_dtype("alltoall", "input_tensor_list", input_tensors, input_tensors[0].dtype)
        x, _ = pack(input_tensors)
        out_sizes = sizes_of(output_tensors)
        out = torch.empty(sum(out_sizes), dtype=torch.uint8)
        launch = _call(self.comm.all_to_all, raw(out), raw(x), out_sizes, sizes_of(input_tensors))
        return self._submit("all_to_all", [launch], output_tensors,
                            lambda: unpack(output_tensors, out, offsets_of(out_sizes)), opts, list(input_tensors))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """dist.all_to_all_single: splits count rows (dim 0); empty lists split evenly."""
        if output.dtype != input.dtype:
            raise bad_value("all_to_all_single", "output", f"a tensor of {input.dtype}", output.dtype)
        out_bytes = self._row_bytes("output_split_sizes", output, output_split_sizes)
        in_bytes = self._row_bytes("input_split_sizes", input, input_split_sizes)
        out_t, back = staged(self.comm, output)
        launch = _call(self.comm.all_to_all, raw(out_t), raw(apart(alike(input, out_t), out_t)), out_bytes, in_bytes)
        return self._submit("all_to_all", [launch], [output], back, opts, [input])

    all_to_all_single = alltoall_base

    def _row_bytes(self, argument: str, t: torch.Tensor, splits) -> list:
        splits = [int(s) for s in splits]
        nbytes = t.numel() * t.element_size()
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            # Rows, as NCCL checks: 5 float32 over 2 ranks split by bytes cut an element in two.
            if rows % self._size:
                raise bad_value("all_to_all_single", argument, f"split sizes (dim 0 of the tensor, {rows}, does "
                                f"not split evenly over {self._size} ranks)", "none")
            return [nbytes // self._size] * self._size
        self._count("all_to_all_single", argument, len(splits), self._size, "split sizes")
        if any(s < 0 for s in splits) or sum(splits) != rows:
            raise bad_value("all_to_all_single", argument, f"non-negative sizes adding up to dim 0 ({rows})", splits)
        row = nbytes // rows if rows else 0
        return [s * row for s in splits]

    # ---- gather / scatter ----------------------------------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or GatherOptions()
        root = opts.rootRank
        x = self._one(input_tensors, "gather", "input_tensors")
        out, finish, outs = None, None, []
        if self._rank == root:
            outs = self._one(output_tensors, "gather", "output_tensors")
            self._count("gather", "gather_list", len(outs), self._size, "tensors")
            self._same_dtype("gather", "gather_list", outs, x.dtype)
            for r, o in enumerate(outs):
                self._count("gather", f"gather_list[{r}]", o.numel(), x.numel())
            out = torch.empty(self._size * x.numel() * x.element_size(), dtype=torch.uint8)
            finish = lambda: unpack(outs, out, offsets_of(sizes_of(outs)))   # noqa: E731
        elif output_tensors and any(len(o) for o in output_tensors):
            raise bad_value("gather", "gather_list", f"None on ranks other than the root ({root})", "a list")
        launch = _call(self.comm.gather, None if out is None else raw(out), raw(as_bytes(x)), root=root)
        return self._submit("gather", [launch], outs, finish, opts, [x])

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or ScatterOptions()
        root = opts.rootRank
        out = self._one(output_tensors, "scatter", "output_tensors")
        x = None
        if self._rank == root:
            ins = self._one(input_tensors, "scatter", "input_tensors")
            self._count("scatter", "scatter_list", len(ins), self._size, "tensors")
            self._same_dtype("scatter", "scatter_list", ins, out.dtype)
            for r, t in enumerate(ins):
                self._count("scatter", f"scatter_list[{r}]", t.numel(), out.numel())
            x, _ = pack(ins)
        elif input_tensors and any(len(i) for i in input_tensors):
            raise bad_value("scatter", "scatter_list", f"None on ranks other than the root ({root})", "a list")
        out_t, back = staged(self.comm, out)
        launch = _call(self.comm.scatter, raw(out_t), None if x is None else raw(alike(x, out_t)), root=root)
        return self._submit("scatter", [launch], [out], back, opts, [out])

    # ---- point to point --------------------------------------------------------------------------------
    def send(self, tensors, dstRank, tag=0):   # noqa: N803 - c10d's names
        self._check_open("send")
        t = self._one(tensors, "send")
        x = host_input(t)
        profiled = begin_range("send", [t])
        work = self.comm.send(_typed(x), int(dstRank), int(tag), async_op=True)
        return self._track(P2PWork(work, tensors, None, profiled))

    def recv(self, tensors, srcRank, tag=0):   # noqa: N803
        return self._recv(tensors, int(srcRank), tag, "recv")

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, None, tag, "recvAnySource")

    def _recv(self, tensors, src: Optional[int], tag, name: str):
        self._check_open(name)
        t = self._one(tensors, name)
        out_t, back = staged(self.comm, t)
        profiled = begin_range(name, [t])
        work = self.comm.recv(_typed(out_t), src, int(tag), async_op=True)
        return self._track(P2PWork(work, tensors, back, profiled))

    # ---- barrier ---------------------------------------------------------------------------------
    def barrier(self, opts=None):
        """dist.barrier: device_ids name the devices to synchronise on NCCL; a CPU barrier has none."""
        return self._submit("barrier", [_call(self.comm.barrier)], [], None, opts, [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False) -> None:
        """ProcessGroup.monitored_barrier, as gloo's: rank 0 waits for every rank until ``timeout``
        (the group's by default) and names the ranks that did not come; the others raise too,
        with rank 0's reason (torch_monitored.py). Not in the issue order of the collectives."""
        self._check_open("monitored_barrier")
        limit = barrier_seconds(timeout, self.timeout)
        group = f"group {self._name!r}" + ("" if self.ranks is None else f" (global ranks {self.ranks})")
        self._shared.monitor.run(limit, wait_all_ranks, self.timeout, group)

    # ---- coalescing, splitting -----------------------------------------------------------------------
    def _start_coalescing(self, device) -> None:
        """dist._coalescing_manager: torch records the calls and issues one fused call at the end
        (allreduce_coalesced, ...); the Work of ``_end_coalescing`` covers what was issued."""
        if self._coalesced is not None:
            raise bad_value("_start_coalescing", "state", "no coalescing in progress", "one already started")
        self._coalesced = []

    def _end_coalescing(self, device):
        works, self._coalesced = self._coalesced, None
        if works is None:
            raise bad_value("_end_coalescing", "state", "a coalescing started by _start_coalescing", "none")
        return Combined(works)

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, device_types=None):
        """ProcessGroup.split_group (what dist.split_group calls): the group of ``ranks`` (ranks of
        this group), made by its members alone over this group's communicator; None for a rank
        outside it."""
        ranks = sorted(int(r) for r in ranks)
        if self._rank not in ranks:
            return None
        if not group_name:
            raise bad_value("split_group", "group_name", "the group's name (the same on every member)", group_name)
        members = ranks if self.ranks is None else [self.ranks[r] for r in ranks]
        explicit = seconds(timeout) if timeout is not None else None
        pg = group_on(self._shared, ranks, group_name, ranks.index(self._rank), len(ranks), explicit)
        pg.ranks = members
        pg._set_group_name(group_name)
        if group_desc:
            pg._set_group_desc(group_desc)
        return pg

    def merge_remote_group(self, *args, **kwargs):
        raise UsageError("merge_remote_group: the \"ringcomm\" backend cannot join ranks outside this job's "
                         "world (its communicators are made from the world's transports)")
