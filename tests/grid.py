"""The test grid shared by the per-collective test files: inputs, float64 references, tolerances.

A case is (count, dtype, op, kind). Inputs are generated in the main thread, the ranks run the
collective on copies, and the main thread checks every rank's output against a float64 reference
and, byte for byte, against the other ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ringcomm.core.ops import bf16_to_f32

SIZES = list(range(1, 17))
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8"]
OPS = ["sum", "avg", "prod", "min", "max"]
PRIME = 13
BIG = (1 << 18) + 3          # >= 1 MiB of float32, and not a multiple of any world size > 1
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
         "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}


@dataclass(frozen=True)
class Case:
    count: int
    dtype: str
    op: str
    kind: str   # "numpy" or "torch"

    def __str__(self):
        return f"{self.count} x {self.dtype} {self.op} ({self.kind})"


def counts(size: int) -> list:
    return sorted({0, 1, max(size - 1, 0), PRIME})


def cases(size: int, ops=OPS, big: bool = True) -> list:
    """Every dtype x op at small counts, both array kinds; a few dtype/op pairs at >= 1 MiB."""
    out = []
    for i, count in enumerate(counts(size)):
        for j, dtype in enumerate(DTYPES):
            for op in ops:
                if op == "avg" and not dtype.startswith(("float", "bfloat")):
                    continue
                kind = "torch" if dtype == "bfloat16" or (i + j) % 2 else "numpy"
                out.append(Case(count, dtype, op, kind))
    if big:
        big_ops = [op for op in ("sum", "max") if op in ops] or list(ops)[:1]
        out += [Case(BIG, "float32", big_ops[0], "numpy"), Case(BIG, "bfloat16", big_ops[0], "torch"),
                Case(BIG, "int64", big_ops[-1], "torch")]
    return out


def values(case: Case, rank: int, count: int, seed: int = 0) -> np.ndarray:
    """Rank's input as float64 values that are exactly representable in case.dtype."""
    rng = np.random.default_rng([seed, rank, count, DTYPES.index(case.dtype), OPS.index(case.op)])
    if case.dtype.startswith(("float", "bfloat")):
        v = rng.uniform(0.8, 1.25, count) if case.op == "prod" else rng.standard_normal(count)
    elif case.op == "prod":
        v = rng.integers(1, 4, count).astype(np.float64)
    elif case.dtype == "uint8":
        v = rng.integers(0, 256, count).astype(np.float64)
    else:
        v = rng.integers(-1000, 1000, count).astype(np.float64)
    return to_float64(make(case, v))


def make(case: Case, v: np.ndarray):
    """An array or tensor of case.kind/dtype holding the values v (rounded to the dtype)."""
    if case.kind == "torch":
        return torch.tensor(v, dtype=torch.float64).to(TORCH[case.dtype]).contiguous()
    return v.astype(case.dtype)


def to_float64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64).numpy() if x.dtype != torch.int64 else x.numpy().astype(np.float64)
    return x.astype(np.float64)


def raw_bytes(x) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.view(torch.uint8).numpy().tobytes() if x.numel() else b""
    return x.tobytes()


def reference(case: Case, per_rank: list) -> np.ndarray:
    """Float64 (or exact integer) reduction of the ranks' values."""
    stack = np.stack(per_rank) if per_rank[0].size else np.zeros((len(per_rank), 0))
    if case.dtype.startswith(("float", "bfloat")):
        red = {"sum": np.sum, "avg": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[case.op](stack, axis=0)
        return red / len(per_rank) if case.op == "avg" else red
    ints = stack.astype(np.int64)
    red = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[case.op](ints, axis=0)
    return red.astype(case.dtype).astype(np.float64)   # integer sums wrap like the dtype does


def assert_close(case: Case, got, ref: np.ndarray, per_rank: list, where: str) -> None:
    got64 = to_float64(got)
    assert got64.shape == ref.shape, f"{where}: shape {got64.shape} != {ref.shape}"
    if case.op in ("min", "max") or not case.dtype.startswith(("float", "bfloat")):
        bad = np.flatnonzero(got64 != ref)
    else:
        n = len(per_rank)
        eps = EPS[case.dtype]
        if case.op == "prod":
            tol = 2 * n * eps * np.abs(ref) + 1e-300
        else:
            scale = np.sum(np.abs(np.stack(per_rank)), axis=0) / (n if case.op == "avg" else 1)
            tol = 2 * n * eps * scale + eps * np.abs(ref)
        bad = np.flatnonzero(np.abs(got64 - ref) > tol)
    assert bad.size == 0, (f"{where}: {case}: {bad.size} wrong elements, first at {bad[0]}: "
                           f"got {got64[bad[0]]!r}, expected {ref[bad[0]]!r}")


def assert_identical(outputs: list, where: str) -> None:
    first = raw_bytes(outputs[0])
    for rank, out in enumerate(outputs[1:], 1):
        assert raw_bytes(out) == first, f"{where}: rank {rank} differs bitwise from rank 0"


__all__ = ["Case", "SIZES", "DTYPES", "OPS", "BIG", "cases", "values", "make", "reference",
           "assert_close", "assert_identical", "to_float64", "raw_bytes", "bf16_to_f32"]
