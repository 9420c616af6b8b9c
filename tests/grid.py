"""The test grid shared by the per-collective test files: inputs, references, tolerances, one runner.

A case is (count, dtype, op, kind, extra). Inputs are generated in the main thread as float64
values exactly representable in the dtype; the ranks run the call on arrays/tensors made from
them; the main thread compares every rank's output with the collective's own reference
semantics (``ringcomm.collectives.get(name).reference``) within the dtype's rounding, and, where
every rank must hold the same result, byte for byte across ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ringcomm.core.ops import bf16_to_f32

SIZES = list(range(1, 17))
BIG_SIZES = (2, 3, 5, 8)     # world sizes whose grids also run >= 1 MiB cases (slow in threads)
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
FLOATS = ("float16", "bfloat16", "float32", "float64")
OPS = ["sum", "avg", "prod", "min", "max", "band", "bor", "bxor", "premul_sum"]
PRIME = 13
BIG = (1 << 18) + 3          # >= 1 MiB of float32, and not a multiple of any world size > 1
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
         "float64": torch.float64, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
         "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}
FACTOR = 0.375               # premul_sum's factor in the grid: exact in every float dtype


def ops_for(dtype: str) -> list:
    """The ops a dtype takes (as torch's gloo allows, plus avg/premul_sum for floats)."""
    if dtype in FLOATS:
        return ["sum", "avg", "prod", "min", "max", "premul_sum"]
    return ["sum", "prod", "min", "max", "band", "bor", "bxor"]


@dataclass(frozen=True)
class Case:
    count: int
    dtype: str
    op: str
    kind: str                 # "numpy" or "torch"
    extra: tuple = field(default=())   # collective-specific: root, counts, splits, in/out of place

    def __str__(self):
        return f"{self.count} x {self.dtype} {self.op} ({self.kind}{', ' + str(self.extra) if self.extra else ''})"


def counts(size: int) -> list:
    return sorted({0, 1, max(size - 1, 0), PRIME})


def kind_of(i: int, j: int, dtype: str) -> str:
    return "torch" if dtype == "bfloat16" or (i + j) % 2 else "numpy"


def reduction_cases(size: int, big: bool = True) -> list:
    """Every dtype x op at small counts, both array kinds; a few dtype/op pairs at >= 1 MiB."""
    out = []
    for i, count in enumerate(counts(size)):
        for j, dtype in enumerate(DTYPES):
            for op in ops_for(dtype):
                out.append(Case(count, dtype, op, kind_of(i, j, dtype)))
    if big and size in BIG_SIZES:
        out += [Case(BIG, "float32", "sum", "numpy"), Case(BIG, "bfloat16", "avg", "torch"),
                Case(BIG, "int64", "max", "torch")]
    return out


def data_cases(size: int, big: bool = True) -> list:
    """Every dtype at small counts, both kinds (collectives that only move data)."""
    out = [Case(count, dtype, "sum", kind_of(i, j, dtype))
           for i, count in enumerate(counts(size)) for j, dtype in enumerate(DTYPES)]
    if big and size in BIG_SIZES:
        out += [Case(BIG, "float32", "sum", "numpy"), Case(BIG, "bfloat16", "sum", "torch")]
    return out


def thin(case_list: list, size: int) -> list:
    """A deterministic share of the cases for this world size, so that across sizes 1..16 every
    (count, dtype, op, kind) combination still runs at several sizes while each size costs a
    fraction: all at size 1-2, a half up to 4, a quarter up to 8, a sixth above. Cases of
    >= 1 MiB always run."""
    keep = 1 if size <= 2 else 2 if size <= 4 else 4 if size <= 8 else 6
    return [c for i, c in enumerate(case_list) if c.count >= BIG or (i + size) % keep == 0]


def values(case: Case, rank: int, count: int, seed: int = 0) -> np.ndarray:
    """Rank's input as float64 values that are exactly representable in case.dtype."""
    rng = np.random.default_rng([seed, rank, count, DTYPES.index(case.dtype), OPS.index(case.op)])
    dtype, op = case.dtype, case.op
    if dtype == "bool":
        v = rng.integers(0, 2, count).astype(np.float64)
    elif dtype in FLOATS:
        v = rng.uniform(0.8, 1.25, count) if op == "prod" else rng.standard_normal(count)
    elif op == "prod":
        v = rng.integers(1, 4, count).astype(np.float64)
    else:
        info = np.iinfo(dtype)
        lo, hi = (max(info.min, -1000), min(info.max, 1000)) if op not in ("band", "bor", "bxor") else (info.min, info.max)
        v = rng.integers(lo, hi, count, endpoint=True).astype(np.float64)
    return to_float64(make(case, v))


def make(case: Case, v: np.ndarray):
    """An array or tensor of case.kind/dtype holding the values v (rounded to the dtype)."""
    if case.kind == "torch":
        return torch.tensor(v, dtype=torch.float64).to(TORCH[case.dtype]).contiguous()
    return v.astype(case.dtype)


def empty(case: Case, n: int):
    if case.kind == "torch":
        return torch.zeros(n, dtype=TORCH[case.dtype])
    return np.zeros(n, dtype=case.dtype)


def op_arg(case: Case):
    """What the call's ``op=`` gets: a name, or ringcomm.premul_sum(factor)."""
    if case.op == "premul_sum":
        import ringcomm
        return ringcomm.premul_sum(FACTOR)
    return case.op


def to_float64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype in (torch.int64,):
            return x.numpy().astype(np.float64)
        return x.to(torch.float64).numpy()
    return x.astype(np.float64)


def raw_bytes(x) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b""
    return x.tobytes()


def assert_close(case: Case, got, ref: np.ndarray, per_rank: list, where: str) -> None:
    got64 = to_float64(got)
    assert got64.shape == ref.shape, f"{where}: {case}: shape {got64.shape} != {ref.shape}"
    if case.op in ("min", "max") or case.dtype not in FLOATS:
        bad = np.flatnonzero(got64 != ref)
    else:
        n = len(per_rank)
        eps = EPS[case.dtype]
        if case.op == "prod":
            tol = 2 * n * eps * np.abs(ref) + 1e-300
        else:
            stack = np.abs(np.stack(per_rank)) if per_rank[0].size else np.zeros((n, 0))
            scale = np.sum(stack, axis=0) * (FACTOR if case.op == "premul_sum" else 1) / (n if case.op == "avg" else 1)
            tol = 2 * n * eps * scale + eps * np.abs(ref)
        bad = np.flatnonzero(np.abs(got64 - ref) > tol)
    assert bad.size == 0, (f"{where}: {case}: {bad.size} wrong elements, first at {bad[0]}: "
                           f"got {got64[bad[0]]!r}, expected {ref[bad[0]]!r}")


def assert_identical(outputs: list, where: str) -> None:
    first = raw_bytes(outputs[0])
    for rank, out in enumerate(outputs[1:], 1):
        assert raw_bytes(out) == first, f"{where}: rank {rank} differs bitwise from rank 0"


def uneven_counts(size: int, seed: int, zeros: bool = True) -> tuple:
    """Per-rank counts with zeros among them (a rank contributing nothing)."""
    rng = np.random.default_rng([seed, size])
    c = rng.integers(0, 6, size)
    if zeros and size > 1:
        c[rng.integers(0, size)] = 0
    return tuple(int(x) for x in c)


__all__ = ["Case", "SIZES", "DTYPES", "OPS", "BIG", "FACTOR", "reduction_cases", "data_cases", "values",
           "make", "empty", "op_arg", "assert_close", "assert_identical", "to_float64", "raw_bytes",
           "uneven_counts", "bf16_to_f32", "ops_for", "counts", "kind_of", "thin"]
