"""What every collective is: one object that owns everything about it.

A ``Collective`` validates its arguments and decides the shape of its output (``prepare``, on the
calling rank, before any communication), states its reference semantics (``reference``, what the
tests compare against), its bus-bandwidth factor (benchmarks, the simulator), its envelope code
(the tag field that makes ranks in different collectives fail loudly), and how each reference
backend runs it (``mpi`` with the MPI library's own call, ``c10d`` with torch.distributed's). The
communicator, backends, selector, simulator, benchmarks and tests read these objects; none keeps a
table of its own. Adding a collective is one file here plus its line in ``__init__.py``.

Everything a call needs travels in a ``Call``: its buffers as flat views (``inp``, ``out``), what
to return, the reduction, the root, the counts that make the program's ``Shape``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.buffers import Buffer, address, as_buffer, overlaps
from ..core.ops import DType, ReduceOp, check_op, finish_avg, parse_op, prescale_factor, scale_into
from ..core.schedule import Shape
from ..errors import bad_type, bad_value


class Call:
    """One call of a collective, as ``prepare`` left it (slotted: one is built per call)."""
    __slots__ = ("collective", "inp", "out", "dtype", "op", "factor", "root", "count", "counts",
                 "recv_counts", "in_place", "writable", "result", "peer", "tag", "source", "uneven",
                 "snapshot")

    def __init__(self, collective: "Collective", inp: Optional[Buffer], out: Optional[Buffer], *,
                 dtype: Optional[DType], count: int, result=None, op: Optional[ReduceOp] = None,
                 factor: Optional[float] = None, root: int = 0, counts: Optional[tuple] = None,
                 recv_counts: Optional[tuple] = None, in_place: bool = True, writable: bool = False):
        self.collective, self.inp, self.out, self.dtype = collective, inp, out, dtype
        self.count, self.result, self.op, self.factor, self.root = count, result, op, factor, root
        # writable: the input may be overwritten (it becomes the result, as in an in-place all_reduce)
        self.counts, self.recv_counts, self.in_place, self.writable = counts, recv_counts, in_place, writable
        self.peer = self.tag = self.source = None
        self.uneven = False   # all_to_all: splits were passed (every rank passes them, or none does)
        # (to, from): flat arrays copied before any message (``before``): an in-place gather
        # root's block, an in-place all_to_all's x, set aside so no algorithm reads and writes
        # one memory (set_aside)
        self.snapshot: Optional[tuple] = None

    @property
    def name(self) -> str:
        return self.collective.name

    def copy(self) -> "Call":
        """A fresh call on the same buffers (before() may rebind a call's input: premul scaling)."""
        twin = Call.__new__(Call)
        for slot in Call.__slots__:
            setattr(twin, slot, getattr(self, slot))
        return twin

    @property
    def device(self) -> str:
        buf = self.inp if self.inp is not None else self.out
        return "cpu" if buf is None else buf.device

    def arrays(self) -> tuple:
        """(IN, OUT) flat arrays; OUT is IN for an in-place call, None where this rank has no output."""
        inp = None if self.inp is None else self.inp.flat
        if self.in_place:
            return inp, inp
        return inp, None if self.out is None else self.out.flat

    def shape(self, size: int, seg: int, nodes=None) -> Shape:
        return Shape(size, self.count, self.root, seg, self.counts, self.recv_counts, nodes, self.in_place)

    def __repr__(self) -> str:
        return (f"<Call {self.name} count={self.count} dtype={self.dtype and self.dtype.name} op={self.op} "
                f"root={self.root}>")


class Collective:
    """Base of every collective. Subclasses set the class attributes and write ``prepare``."""
    name: str
    code: int               # envelope code, unique, < 16
    reduces = False         # takes an op
    rooted = False          # takes a root; rooted collectives end with a confirmation barrier
    uneven = False          # has a counts/splits argument; an uneven call confirms too

    # -- what the communicator asks ----------------------------------------------------------
    def bus_factor(self, size: int) -> float:
        """nccl-tests' busbw = algbw x this, comparable across sizes and to the link's peak."""
        raise NotImplementedError

    def nbytes(self, call: Call, size: int) -> int:
        """Bytes of the collective's vector on ``size`` ranks: what the selector prices (the size
        its algorithms' costs are written in) and benchmarks divide by."""
        return call.count * (call.dtype.itemsize if call.dtype else 1)

    def envelope_count(self, call: Call) -> int:
        """The count every rank of a matching call agrees on (the tag's count field)."""
        return call.count

    def confirms(self, call: Call) -> bool:
        """Whether a schedule ends with the confirmation barrier: where a rank whose own messages
        all matched could return while another found that the ranks disagree. A root is one such
        thing; uneven counts another: each message is checked against its receiver's expectation
        alone, so ranks 0 and 1 of a pairwise all_to_all returned normally while rank 2 raised
        that rank 0 sent it fewer elements than its out_splits said (a ring all_gather the same)."""
        return self.rooted or self.is_uneven(call)

    def is_uneven(self, call: Call) -> bool:
        return call.counts is not None and len(set(call.counts)) > 1

    def window_word(self, call: Call) -> int:
        """What a window round carries beside its stamp (tag and exact count), so that ranks that
        disagree on what the count does not show raise: the root, or how uneven counts split
        the vector (ranks that agree on the total but not the split would read the wrong bytes).
        Below bit 32 where it is not a digest: the plan adds a large count's top above
        (envelope.count_word)."""
        if self.rooted:
            return call.root
        if self.is_uneven(call):
            return hash(call.counts) & ((1 << 62) - 1)   # ints hash alike in every process
        return 0

    def describe_word(self, mine: int, theirs: int) -> str:
        if self.rooted:
            return f"root: expected {mine}, received {theirs}"
        return "counts: the ranks passed different per-rank counts"

    def before(self, call: Call, rank: int, size: int) -> None:
        """Local work before any communication: premul_sum and the half-precision avg scale the
        input (ops.prescale_factor), in place where the input becomes the result anyway, else into
        the output (which then serves as the input of an in-place call), else into a copy."""
        if call.snapshot is not None:
            to, source = call.snapshot
            to[...] = source
        factor = None if call.op is None else prescale_factor(call.op, call.factor, call.dtype, size)
        if factor is None:
            return
        inp, out = call.arrays()
        if call.writable:
            scale_into(inp, inp, call.dtype, factor)
        elif out is not None and out is not inp and out.size == inp.size:
            scale_into(out, inp, call.dtype, factor)
            call.inp, call.in_place, call.writable = call.out, True, True
        else:
            scaled = np.empty_like(inp)
            scale_into(scaled, inp, call.dtype, factor)
            call.inp = Buffer(call.inp.obj, scaled, call.inp.dtype, call.inp.kind, call.inp.device)

    def after(self, call: Call, rank: int, size: int) -> None:
        """Local work after the communication (avg of float32/float64 divides the sum)."""
        if call.op is ReduceOp.AVG:
            _, out = call.arrays()
            if out is not None:
                finish_avg(self.result_view(call, out), call.dtype, size)

    def result_view(self, call: Call, out: np.ndarray) -> np.ndarray:
        return out

    # -- reference semantics (tests) ------------------------------------------------------------
    def reference(self, inputs: list, **kwargs) -> list:
        """What every rank must end with, from every rank's input (float64 or int64 arrays)."""
        raise NotImplementedError

    # -- reference backends ---------------------------------------------------------------------
    def mpi(self, backend, call: Call):
        """Start the MPI library's own call on ``backend.world``; return (request, keep-alive)."""
        raise NotImplementedError(f"the mpi backend does not support {self.name}")

    def c10d(self, backend, call: Call):
        """Start torch.distributed's call on ``backend._pg``; return (work, finish)."""
        raise NotImplementedError(f"backend {backend.backend!r} does not support {self.name}")

    def __repr__(self) -> str:
        return f"<collective {self.name}>"


# -- argument checks shared by the collectives -------------------------------------------------
def buffer(x, collective: str, argument: str, read_only: bool = False) -> Buffer:
    """``read_only``: the call never writes it (module core/buffers.py, ``as_buffer``)."""
    return as_buffer(x, collective, argument, read_only)


def reduction(collective: str, op, dtype: DType) -> tuple:
    """(ReduceOp, premul factor or None), refusing pairs the dtype cannot take."""
    parsed, factor = parse_op(op, collective)
    check_op(collective, parsed, dtype)
    return parsed, factor


def root_of(collective: str, root, size: int) -> int:
    return rank_of(collective, "root", root, size)


def rank_of(collective: str, argument: str, value, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise bad_type(collective, argument, "an int", type(value).__name__)
    if not 0 <= value < size:
        raise bad_value(collective, argument, f"a rank in [0, {size - 1}]", int(value))
    return int(value)


def counts_of(collective: str, argument: str, counts, size: int) -> tuple:
    """A per-rank element count tuple: ``size`` non-negative ints."""
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise bad_type(collective, argument, f"a sequence of {size} ints", type(counts).__name__)
    if len(counts) != size:
        raise bad_value(collective, argument, f"{size} counts (one per rank)", f"{len(counts)} counts")
    out = []
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
            raise bad_value(collective, argument, "non-negative ints", list(counts))
        out.append(int(c))
    return tuple(out)


def same_kind(collective: str, out: Buffer, x: Buffer) -> None:
    """``out`` and ``x`` alike in device (index included), array type and dtype (checked before any
    message moves)."""
    if out.device != x.device:
        raise bad_value(collective, "out", f"memory on the device of x ({x.device})", f"memory on {out.device}")
    if out.kind != x.kind:
        raise bad_type(collective, "out", f"the same array type as x ({x.kind})", out.kind)
    if out.dtype is not x.dtype:
        raise bad_type(collective, "out", f"dtype {x.dtype.name} like x", f"dtype {out.dtype.name}")


def elements(collective: str, argument: str, buf: Buffer, expected: int) -> None:
    if buf.numel != expected:
        raise bad_value(collective, argument, f"{expected} elements", f"{buf.numel} elements")


def is_block(whole: Buffer, part: Buffer, start: int) -> bool:
    """Whether ``part`` is exactly ``whole``'s elements from ``start`` on (MPI_IN_PLACE's form of
    gather and scatter at the root, of all_gather and all_to_all): that very memory, not merely
    some of it. Called after same_kind, so the dtypes agree."""
    return part.numel > 0 and whole.device == part.device and \
        address(whole.flat[start:start + part.numel]) == address(part.flat)


def set_aside(buf: Buffer) -> Buffer:
    """A buffer like ``buf`` on memory of its own (in place: a gather or scatter root's block, an
    all_to_all's x), on ``buf``'s device: cupy allocates on the current one, which is not
    necessarily the array's."""
    flat = buf.flat
    if isinstance(flat, np.ndarray):
        aside = np.empty_like(flat)
    else:
        with flat.device:
            aside = np.empty_like(flat)   # cupy's, through NEP 18
    return Buffer(buf.obj, aside, buf.dtype, buf.kind, buf.device)


def disjoint(collective: str, out: Buffer, x: Buffer) -> None:
    if overlaps(out.flat, x.flat):
        raise bad_value(collective, "out", "memory that does not overlap x", "an array overlapping x")


def reduce_reference(inputs: list, op: str, dtype: str, factor: float = 1.0) -> np.ndarray:
    """The exact reduction of every rank's values: float64 for floating types, int64 wrapped to the
    dtype for integers, logical for bool (as torch's gloo reduces them)."""
    stack = np.stack(inputs) if inputs[0].size else np.zeros((len(inputs), 0))
    if dtype == "bool":
        b = stack.astype(bool)
        red = {"sum": np.any, "max": np.any, "bor": np.any, "prod": np.all, "min": np.all,
               "band": np.all, "bxor": lambda a, axis: np.logical_xor.reduce(a, axis=axis)}[op](b, axis=0)
        return red.astype(np.float64)
    if dtype.startswith(("float", "bfloat")):
        if op == "premul_sum":
            return np.sum(stack * factor, axis=0)
        red = {"sum": np.sum, "avg": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](stack, axis=0)
        return red / len(inputs) if op == "avg" else red
    ints = stack.astype(np.int64)
    red = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "band": np.bitwise_and.reduce,
           "bor": np.bitwise_or.reduce, "bxor": np.bitwise_xor.reduce}[op](ints, axis=0)
    return red.astype(dtype).astype(np.float64)   # integer sums wrap like the dtype does
