"""Reduction operators and the dtypes they run on.

Every reduction here is an in-place ``dst = dst OP src`` on flat numpy arrays of the *storage*
dtype. The algorithms only ever call these kernels, so the per-element order of reduction is fixed
by the algorithm's schedule alone, which is what keeps results bitwise identical across ranks.

Half precision: numpy computes float16 arithmetic in float32 and rounds once per operation, and
bfloat16 (stored as uint16, numpy has no bf16) is widened to float32 here explicitly, then rounded
to nearest-even. Each pairwise step therefore rounds once, as NCCL does, rather than compounding
rounding inside a half-precision accumulation loop.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import bad_value


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PROD = "prod"
    MIN = "min"
    MAX = "max"

    def __str__(self) -> str:  # error messages print "sum", not "ReduceOp.SUM"
        return self.value

    __hash__ = object.__hash__   # members are singletons; Enum's own hash is Python code (per call)


OP_NAMES = tuple(op.value for op in ReduceOp)


_BY_VALUE = {op.value: op for op in ReduceOp}   # a dict hit is ~4x cheaper than ReduceOp("sum")


def parse_op(op, collective: str) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        if op in _BY_VALUE:
            return _BY_VALUE[op]
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    raise bad_value(collective, "op", f"one of {', '.join(OP_NAMES)} or a ringcomm.ReduceOp", op)


@dataclass(frozen=True, eq=False)   # one instance per dtype (DTYPES): identity is equality, and hashes fast
class DType:
    name: str
    storage: np.dtype      # what the bytes are in memory, and what numpy views them as
    is_float: bool

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize


DTYPES = {
    d.name: d
    for d in (
        DType("float16", np.dtype(np.float16), True),
        DType("bfloat16", np.dtype(np.uint16), True),
        DType("float32", np.dtype(np.float32), True),
        DType("float64", np.dtype(np.float64), True),
        DType("int32", np.dtype(np.int32), False),
        DType("int64", np.dtype(np.int64), False),
        DType("uint8", np.dtype(np.uint8), False),
    )
}


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f32: np.ndarray, out: np.ndarray) -> None:
    """Round float32 to bfloat16 (nearest-even), NaN kept quiet, written into ``out`` (uint16)."""
    bits = f32.view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    np.right_shift(rounded, 16, out=rounded)
    out[...] = rounded
    nan = np.isnan(f32)
    if nan.any():
        out[nan] = 0x7FC0


_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,   # avg is a sum on the wire; divide_by_size() finishes it
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}

Reducer = Callable[[np.ndarray, np.ndarray], None]


class Reduction:
    """The kernels of one (op, dtype): ``r(dst, msg)`` computes dst = dst OP msg, ``r(dst, msg, own)``
    computes dst = own OP msg (an out-of-place step: the own operand is read, never written)."""
    __slots__ = ("reduce", "combine")

    def __init__(self, reduce: Reducer, combine):
        self.reduce, self.combine = reduce, combine

    def __call__(self, dst: np.ndarray, msg: np.ndarray, own=None) -> None:
        if own is None:
            self.reduce(dst, msg)
        else:
            self.combine(dst, own, msg)


def reducer(op: ReduceOp, dtype: DType) -> Reduction:
    """The ``Reduction`` for ``op`` on ``dtype``: ``r(dst, src)`` computes ``dst = dst OP src``."""
    found = _REDUCERS.get((op, dtype.name))
    if found is None:
        found = _REDUCERS[(op, dtype.name)] = Reduction(_make_reducer(op, dtype), combiner(op, dtype))
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


def divide_by_size(buf: np.ndarray, dtype: DType, size: int) -> None:
    """Finish an avg: every rank divides identical bits by the same n, so results stay identical."""
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
