"""Pre-flight check before a collective: every rank shows its fingerprint to every other.

Enabled by RINGCOMM_DEBUG=detail (cf. TORCH_DISTRIBUTED_DEBUG=DETAIL) or RINGCOMM_CHECK_FINITE=1,
and always on the reference backends (backends/reference.py), whose libraries check nothing.
The ranks all-gather (collective, sequence number, count, dtype, op, root, has-non-finite, then
the call's parts: an uneven call's counts, an all_to_all's splits) on a fixed control tag, so the
exchange matches even when a rank skipped a collective. Every rank then sees the same table and
raises the same error, naming which ranks differ in which field.
"""
from __future__ import annotations

import numpy as np

from .. import algorithms
from ..core import executor
from ..core.envelope import CLOSE_CODE, FINGERPRINT_TAG, ControlEnvelope, Envelope
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


def fingerprint(code, seq, count, dtype, op, root, non_finite) -> list:
    """``code``: the collective's envelope code (its file in ringcomm/collectives says which)."""
    return [code, seq, count, _DTYPES.index(dtype or "-"), _OPS.index(op or "-"), root, int(non_finite)]


def parts(call, size: int) -> list:
    """What a call's ranks must agree on beyond the fingerprint, 2 * size values: the counts of
    an uneven all_gather or reduce_scatter (every rank passes the same), and an all_to_all's
    splits, sent then received (what rank i sends rank j is what rank j expects from rank i);
    zeros where a call has none."""
    counts, received = call.counts, call.recv_counts
    return [*(counts if counts is not None and len(counts) == size else (0,) * size),
            *(received if received is not None and len(received) == size else (0,) * size)]


def _show(field: int, value: int) -> str:
    if field == 0:
        return Envelope(0, value, None, 0).collective
    if field == 3:
        return _DTYPES[value]
    if field == 4:
        return _OPS[value]
    return str(value)


def check(transport, timeout, what: str, mine: list, *, check_fields: bool,
          call_parts: list = None, pairwise: bool = False) -> None:
    """All-gather ``mine`` (``fingerprint``) and ``call_parts`` (``parts``) over ``transport``
    on the control tag, then ``compare``."""
    size = transport.size
    row = np.array(mine if call_parts is None else mine + call_parts, np.int64)
    width = row.size
    table = np.zeros(size * width, np.int64)
    table[transport.rank * width:(transport.rank + 1) * width] = row
    program = algorithms.plan("all_gather", "ring", transport.rank, Shape(size, table.size, seg=max(1, table.size)))
    executor.run(program, transport, (table, table, None), None, envelope=ControlEnvelope(FINGERPRINT_TAG),
                 timeout=timeout, what=f"{what} pre-flight check")
    compare(table.reshape(size, width), f"{what} on rank {transport.rank}", check_fields=check_fields,
            with_parts=call_parts is not None, pairwise=pairwise)


def compare(rows: np.ndarray, what: str, *, check_fields: bool, with_parts: bool, pairwise: bool) -> None:
    """Raise the same error on every rank from the same table (a row per rank: the fingerprint,
    then ``parts`` where ``with_parts``): MismatchError naming the fields and ranks that differ
    (where ``check_fields``), else NonFiniteError naming the ranks whose input is not finite."""
    size, fields = rows.shape[0], len(FIELDS)
    if check_fields and not _agree(rows, fields, with_parts, pairwise):
        diffs = []
        # A close()'s exchange has a row of message counts after its code, no call's fields.
        shown = 1 if (rows[:, 0] == CLOSE_CODE).any() else fields - 1
        for field in range(shown):
            values = rows[:, field]
            if (values != values[0]).any():
                groups = {}
                for rank, v in enumerate(values):
                    groups.setdefault(_show(field, int(v)), []).append(rank)
                diffs.append(f"{FIELDS[field]}: " + "; ".join(f"ranks {r} have {v}" for v, r in groups.items()))
        if with_parts and not diffs:
            diffs += _parts_differ(rows[:, fields:], size, pairwise)
        if diffs:
            raise MismatchError(f"{what}: ranks disagree: " + " | ".join(diffs))
    bad = [rank for rank in range(size) if rows[rank, fields - 1]]
    if bad:
        raise NonFiniteError(f"{what}: input holds NaN or Inf on ranks {bad}")


def _agree(rows: np.ndarray, fields: int, with_parts: bool, pairwise: bool) -> bool:
    """Whether ``compare`` has nothing to report but non-finite input: two vector comparisons
    (a call of a reference backend checks every time, and the field-by-field walk cost 20 us)."""
    size = rows.shape[0]
    same = rows[:, :fields - 1] == rows[0, :fields - 1]
    if not with_parts:
        return bool(same.all())
    if pairwise:
        return bool(same.all()) and bool((rows[:, fields:fields + size] == rows[:, fields + size:].T).all())
    return bool(same.all()) and bool((rows[:, fields:] == rows[0, fields:]).all())


def _parts_differ(table: np.ndarray, size: int, pairwise: bool) -> list:
    sends, receives = table[:, :size], table[:, size:]
    if pairwise:
        return [f"rank {i} sends {sends[i, j]} elements to rank {j}, which expects {receives[j, i]} from it"
                for i in range(size) for j in range(size) if sends[i, j] != receives[j, i]][:4]
    if (sends != sends[0]).any():
        groups = {}
        for rank in range(size):
            groups.setdefault(str(sends[rank].tolist()), []).append(rank)
        return ["counts: " + "; ".join(f"ranks {r} have {v}" for v, r in groups.items())]
    return []
