"""Pre-flight check before a collective: every rank shows its fingerprint to every other.

Enabled by RINGCOMM_DEBUG=detail (cf. TORCH_DISTRIBUTED_DEBUG=DETAIL) or RINGCOMM_CHECK_FINITE=1.
The ranks all-gather (collective, sequence number, count, dtype, op, root, has-non-finite) on a
fixed control tag, so the exchange matches even when a rank skipped a collective. Every rank then
sees the same table and raises the same error, naming which ranks differ in which field.
"""
from __future__ import annotations

import numpy as np

from .. import algorithms
from ..core import executor
from ..core.envelope import FINGERPRINT_TAG, ControlEnvelope, Envelope
from ..core.schedule import Shape
from ..core.ops import DTYPES, OP_NAMES, bf16_to_f32
from ..errors import MismatchError, NonFiniteError

FIELDS = ("collective", "sequence number", "count", "dtype", "op", "root", "non-finite input")
_DTYPES = ("-",) + tuple(DTYPES)
_OPS = ("-",) + OP_NAMES


def has_non_finite(flat: np.ndarray, dtype_name: str) -> bool:
    if dtype_name == "bfloat16":
        flat = bf16_to_f32(flat)
    elif not dtype_name.startswith("float"):
        return False
    return bool(flat.size) and not np.isfinite(flat).all()


def fingerprint(code, seq, count, dtype, op, root, non_finite) -> np.ndarray:
    """``code``: the collective's envelope code (its file in ringcomm/collectives says which)."""
    return np.array([code, seq, count,
                     _DTYPES.index(dtype or "-"), _OPS.index(op or "-"), root, int(non_finite)], np.int64)


def _show(field: int, value: int) -> str:
    if field == 0:
        return Envelope(0, value, None, 0).collective
    if field == 3:
        return _DTYPES[value]
    if field == 4:
        return _OPS[value]
    return str(value)


def check(transport, timeout, what: str, mine: np.ndarray, *, check_fields: bool) -> None:
    size, width = transport.size, mine.size
    table = np.zeros(size * width, np.int64)
    table[transport.rank * width:(transport.rank + 1) * width] = mine
    program = algorithms.plan("all_gather", "ring", transport.rank, Shape(size, table.size, seg=max(1, table.size)))
    executor.run(program, transport, (table, table, None), None, envelope=ControlEnvelope(FINGERPRINT_TAG),
                 timeout=timeout, what=f"{what} pre-flight check")
    rows = table.reshape(size, width)
    if check_fields:
        diffs = []
        for field in range(width - 1):
            values = rows[:, field]
            if (values != values[0]).any():
                groups = {}
                for rank, v in enumerate(values):
                    groups.setdefault(_show(field, int(v)), []).append(rank)
                diffs.append(f"{FIELDS[field]}: " + "; ".join(f"ranks {r} have {v}" for v, r in groups.items()))
        if diffs:
            raise MismatchError(f"{what} on rank {transport.rank}: ranks disagree: " + " | ".join(diffs))
    bad = [rank for rank in range(size) if rows[rank, -1]]
    if bad:
        raise NonFiniteError(f"{what} on rank {transport.rank}: input holds NaN or Inf on ranks {bad}")
