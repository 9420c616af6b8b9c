"""Reduction operators and the dtypes they run on.

Every reduction here is an in-place ``dst = dst OP src`` (or ``out = a OP b``) on flat numpy
arrays of the *storage* dtype. The algorithms only ever call these kernels, so the per-element
order of reduction is fixed by the algorithm's schedule alone, which is what keeps results
bitwise identical across ranks.

Half precision: numpy computes float16 arithmetic in float32 and rounds once per operation, and
bfloat16 (stored as uint16, numpy has no bf16) is widened to float32 here explicitly, then rounded
to nearest-even. Each pairwise step therefore rounds once, as NCCL does, rather than compounding
rounding inside a half-precision accumulation loop.

Which op runs on which dtype follows torch's gloo (measured: docs/collectives.md): band, bor and
bxor need integers or bool; avg and premul_sum need floating types; bool sums are logical or and
products logical and. Two deliberate differences: int16 is accepted (gloo refuses the dtype
altogether), and the average of float16/bfloat16 scales every input by 1/n before summing, as
NCCL does, so an average that is representable never overflows on the way (gloo sums first: two
ranks passing 60000.0 in float16 get inf there).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import bad_type, bad_value


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"   # sum of factor * x; pass ringcomm.premul_sum(factor)

    def __str__(self) -> str:  # error messages print "sum", not "ReduceOp.SUM"
        return self.value

    __hash__ = object.__hash__   # members are singletons; Enum's own hash is Python code (per call)


OP_NAMES = tuple(op.value for op in ReduceOp)
_BY_VALUE = {op.value: op for op in ReduceOp}   # a dict hit is ~4x cheaper than ReduceOp("sum")
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_FLOAT_ONLY = (ReduceOp.AVG, ReduceOp.PREMUL_SUM)


class PreMulSum:
    """``op=ringcomm.premul_sum(factor)``: every rank's input is multiplied by ``factor`` (in the
    input's dtype, one rounding) and the products are summed, as torch/NCCL define premul_sum."""
    __slots__ = ("factor",)

    def __init__(self, factor: float):
        if isinstance(factor, bool) or not isinstance(factor, (int, float, np.floating, np.integer)):
            raise bad_type("premul_sum", "factor", "a real number", type(factor).__name__)
        if not np.isfinite(factor):
            raise bad_value("premul_sum", "factor", "a finite number", factor)
        self.factor = float(factor)

    def __repr__(self) -> str:
        return f"premul_sum({self.factor!r})"


def premul_sum(factor: float) -> PreMulSum:
    return PreMulSum(factor)


def parse_op(op, collective: str) -> tuple:
    """(ReduceOp, premul factor or None) from what the user passed."""
    if isinstance(op, ReduceOp):
        if op is ReduceOp.PREMUL_SUM:
            raise bad_value(collective, "op", "ringcomm.premul_sum(factor) (premul_sum needs its factor)", op.value)
        return op, None
    if isinstance(op, PreMulSum):
        return ReduceOp.PREMUL_SUM, op.factor
    if isinstance(op, str):
        found = _BY_VALUE.get(op) or _BY_VALUE.get(op.lower())
        if found is not None and found is not ReduceOp.PREMUL_SUM:
            return found, None
    names = ", ".join(n for n in OP_NAMES if n != "premul_sum")
    raise bad_value(collective, "op", f"one of {names}, a ringcomm.ReduceOp or ringcomm.premul_sum(factor)", op)


@dataclass(frozen=True, eq=False)   # one instance per dtype (DTYPES): identity is equality, and hashes fast
class DType:
    name: str
    storage: np.dtype      # what the bytes are in memory, and what numpy views them as
    kind: str              # "float", "int" or "bool"

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


DTYPES = {
    d.name: d
    for d in (
        DType("float16", np.dtype(np.float16), "float"),
        DType("bfloat16", np.dtype(np.uint16), "float"),
        DType("float32", np.dtype(np.float32), "float"),
        DType("float64", np.dtype(np.float64), "float"),
        DType("int8", np.dtype(np.int8), "int"),
        DType("int16", np.dtype(np.int16), "int"),
        DType("int32", np.dtype(np.int32), "int"),
        DType("int64", np.dtype(np.int64), "int"),
        DType("uint8", np.dtype(np.uint8), "int"),
        DType("bool", np.dtype(np.bool_), "bool"),
    )
}


def check_op(collective: str, op: ReduceOp, dtype: DType) -> None:
    """Refuse the pairs torch's gloo refuses (module doc), naming what would work."""
    if op in _BITWISE and dtype.is_float:
        raise bad_value(collective, "op", f"sum, prod, min, max, avg or premul_sum for floating dtype {dtype.name}",
                        op.value)
    if op in _FLOAT_ONLY and not dtype.is_float:
        raise bad_value(collective, "op", f"sum, prod, min, max, band, bor or bxor for {dtype.kind} dtype "
                        f"{dtype.name}", op.value)


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f32: np.ndarray, out: np.ndarray) -> None:
    """Round float32 to bfloat16 (nearest-even), NaN kept quiet, written into ``out`` (uint16)."""
    bits = f32.view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    np.right_shift(rounded, 16, out=rounded)
    nan = np.isnan(f32)
    if isinstance(f32, np.ndarray):
        out[...] = rounded
        if nan.any():   # a scan of host memory: cheap, and most arrays hold no NaN
            out[nan] = 0x7FC0
        return
    # Device memory (cupy): asking the host whether any lane is NaN would copy to the host and
    # wait for the device on every reduction, so NaN lanes are replaced arithmetically.
    rounded -= rounded * nan
    rounded += nan * np.uint32(0x7FC0)
    out[...] = rounded


_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,          # avg and premul_sum are sums on the wire (see finish/prescale)
    ReduceOp.PREMUL_SUM: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

Reducer = Callable[[np.ndarray, np.ndarray], None]


# The compiled window round's reduction codes (core/_round.c: op * 7 + dtype). Floating types get
# only sum and prod there: min/max of floats (NaN, signed zeros) keep numpy's own semantics.
_ROUND_OPS = {ReduceOp.SUM: 0, ReduceOp.AVG: 0, ReduceOp.PREMUL_SUM: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2,
              ReduceOp.MAX: 3, ReduceOp.BAND: 4, ReduceOp.BOR: 5, ReduceOp.BXOR: 6}
_ROUND_TYPES = {"float32": 0, "float64": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6}


def round_code(op: ReduceOp, dtype: DType) -> int:
    """The compiled round's code for (op, dtype), or -1 where only the Python round applies."""
    t = _ROUND_TYPES.get(dtype.name)
    o = _ROUND_OPS[op]
    if t is None or (dtype.is_float and o > 1):
        return -1
    return o * len(_ROUND_TYPES) + t


class Reduction:
    """The kernels of one (op, dtype): ``r(dst, msg)`` computes dst = dst OP msg, ``r(dst, msg, own)``
    computes dst = own OP msg (an out-of-place step: the own operand is read, never written).
    ``code``: the compiled window round's code for the pair (``round_code``), -1 if it has none.
    ``message_first``: the same kernels with the message as the first operand (RecvReduce.first)."""
    __slots__ = ("reduce", "combine", "code", "message_first")

    def __init__(self, reduce: Reducer, combine, code: int = -1):
        self.reduce, self.combine, self.code = reduce, combine, code
        self.message_first = _MessageFirst(combine)

    def __call__(self, dst: np.ndarray, msg: np.ndarray, own=None) -> None:
        if own is None:
            self.reduce(dst, msg)
        else:
            self.combine(dst, own, msg)


class _MessageFirst:
    """``r(dst, msg)``: dst = msg OP dst; ``r(dst, msg, own)``: dst = msg OP own. Bitwise, OP is
    not commutative: maximum(-0.0, 0.0) returns its first operand, and so does a sum of two NaNs
    that differ in sign or payload."""
    __slots__ = ("combine",)

    def __init__(self, combine):
        self.combine = combine

    def __call__(self, dst: np.ndarray, msg: np.ndarray, own=None) -> None:
        self.combine(dst, msg, dst if own is None else own)


def reducer(op: ReduceOp, dtype: DType) -> Reduction:
    """The ``Reduction`` for ``op`` on ``dtype``: ``r(dst, src)`` computes ``dst = dst OP src``."""
    found = _REDUCERS.get((op, dtype.name))
    if found is None:
        found = _REDUCERS[(op, dtype.name)] = Reduction(_make_reducer(op, dtype), combiner(op, dtype),
                                                        round_code(op, dtype))
    return found


def combiner(op: ReduceOp, dtype: DType) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """Return ``f(out, a, b)`` computing ``out = a OP b`` elementwise with the same rounding as
    ``reducer`` (one pass where a copy and an in-place reduction would take two)."""
    found = _COMBINERS.get((op, dtype.name))
    if found is None:
        found = _COMBINERS[(op, dtype.name)] = _make_combiner(op, dtype)
    return found


_REDUCERS: dict = {}
_COMBINERS: dict = {}


def _make_reducer(op: ReduceOp, dtype: DType) -> Reducer:
    ufunc = _UFUNC[op]
    if dtype.name == "bfloat16":
        def reduce_bf16(dst: np.ndarray, src: np.ndarray) -> None:
            wide = bf16_to_f32(dst)
            ufunc(wide, bf16_to_f32(src), out=wide)
            f32_to_bf16(wide, dst)
        return reduce_bf16

    def reduce_native(dst: np.ndarray, src: np.ndarray) -> None:
        ufunc(dst, src, out=dst)
    return reduce_native


def _make_combiner(op: ReduceOp, dtype: DType):
    ufunc = _UFUNC[op]
    if dtype.name == "bfloat16":
        def combine_bf16(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            wide = bf16_to_f32(a)
            ufunc(wide, bf16_to_f32(b), out=wide)
            f32_to_bf16(wide, out)
        return combine_bf16

    def combine_native(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        ufunc(a, b, out=out)
    return combine_native


def prescale_factor(op: ReduceOp, factor: Optional[float], dtype: DType, size: int) -> Optional[float]:
    """The factor every rank multiplies its input by before the sum, or None: premul_sum's own,
    and 1/n for the average of half-precision types (module doc: no overflow on the way)."""
    if op is ReduceOp.PREMUL_SUM:
        return factor
    if op is ReduceOp.AVG and dtype.name in ("float16", "bfloat16") and size > 1:
        return 1.0 / size
    return None


def scale_into(out: np.ndarray, src: np.ndarray, dtype: DType, factor: float) -> None:
    """out = src * factor, rounded once to the storage type (out may be src)."""
    if dtype.name == "bfloat16":
        f32_to_bf16(bf16_to_f32(src) * np.float32(factor), out)
    elif dtype.name == "float16":
        np.copyto(out, (src.astype(np.float32) * np.float32(factor)).astype(np.float16))
    else:
        np.multiply(src, src.dtype.type(factor), out=out)


def finish_avg(buf: np.ndarray, dtype: DType, size: int) -> None:
    """Finish an avg that was summed unscaled (float32, float64): every rank divides identical bits
    by the same n, so results stay identical. Half types were scaled before the sum instead."""
    if size == 1 or buf.size == 0 or dtype.name in ("float16", "bfloat16"):
        return
    np.divide(buf, buf.dtype.type(size), out=buf)


def divide_by_size(buf: np.ndarray, dtype: DType, size: int) -> None:
    """Divide identical bits by n on every rank (any floating dtype)."""
    if size == 1 or buf.size == 0:
        return
    if dtype.name == "bfloat16":
        wide = bf16_to_f32(buf)
        np.divide(wide, np.float32(size), out=wide)
        f32_to_bf16(wide, buf)
    elif dtype.name == "float16":
        buf[...] = (buf.astype(np.float32) / np.float32(size)).astype(np.float16)
    else:
        np.divide(buf, buf.dtype.type(size), out=buf)
