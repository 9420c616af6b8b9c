"""What a message's tag says about the collective that sent it, so mismatches fail loudly.

Every data message of a collective carries, in its MPI tag, the collective's sequence number,
which collective it is, its dtype and its element count modulo 1024. Ranks that disagree on any
of these post receives that can never match the messages their peers send, so instead of
silently reducing int32 bits as float32, or mixing chunks of different lengths, the waits stall;
the executor then looks at the first unmatched message from the peer it waits for (a probe) and
raises MismatchError saying which field differs. That costs nothing on the fast path.

Layout (29 bits, MPICH's tag bound here is 2**29 - 1):
  bit 28       control (abort notices, debug fingerprints): never a data message
  bits 18..27  sequence number mod 1024
  bits 15..17  collective
  bits 12..14  dtype
  bits  2..11  count mod 1024
  bits  0..1   channel (independent streams of one algorithm)
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

from ..algorithms import COLLECTIVES
from .ops import DTYPES

DTYPE_NAMES = tuple(DTYPES)
CONTROL = 1 << 28
ABORT_TAG = CONTROL | 4        # payload: the error text of a rank that gave up
FINGERPRINT_TAG = CONTROL | 8  # RINGCOMM_DEBUG=detail / CHECK_FINITE pre-flight exchange
PINGPONG_TAG = CONTROL | 12    # ringcomm.tune's point-to-point timings
SEQ_MOD = 1024
COUNT_MOD = 1024
STAMP_COUNT_SHIFT = 32   # a one-shot window stamp: the exact count above the 29-bit tag


@lru_cache(maxsize=4096)
def static_bits(collective: str, dtype: Optional[str], count: int) -> int:
    """The tag bits that do not change from call to call of one shape (all but the sequence)."""
    code = DTYPE_NAMES.index(dtype) if dtype else 7
    return COLLECTIVES.index(collective) << 15 | code << 12 | (count % COUNT_MOD) << 2


class Envelope:
    """The fields one collective call stamps on its messages (immutable by convention; built
    once per call, so it is a plain slotted class: a frozen dataclass costs twice as much)."""
    __slots__ = ("seq", "collective", "dtype", "count")

    def __init__(self, seq: int, collective: str, dtype: Optional[str], count: int):
        self.seq, self.collective, self.dtype, self.count = seq, collective, dtype, count   # dtype None: barrier

    def __eq__(self, other) -> bool:
        return isinstance(other, Envelope) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        return f"Envelope(seq={self.seq}, collective={self.collective!r}, dtype={self.dtype!r}, count={self.count})"

    def fields(self) -> tuple:
        return self.seq, self.collective, self.dtype, self.count

    def base_tag(self) -> int:
        return (self.seq % SEQ_MOD) << 18 | static_bits(self.collective, self.dtype, self.count)

    def describe_mismatch(self, tag: int, peer: int) -> Optional[str]:
        """Why a message with ``tag`` from ``peer`` cannot belong to this collective, or None."""
        if tag & CONTROL:
            return None
        seq, coll, dtype, count = tag >> 18 & 1023, tag >> 15 & 7, tag >> 12 & 7, tag >> 2 & 1023
        theirs_coll = COLLECTIVES[coll] if coll < len(COLLECTIVES) else f"collective {coll}"
        theirs_dtype = DTYPE_NAMES[dtype] if dtype < len(DTYPE_NAMES) else None
        if seq != self.seq % SEQ_MOD:
            return (f"rank {peer} is at collective #{seq} (mod {SEQ_MOD}, {theirs_coll}) while this rank "
                    f"is at #{self.seq} ({self.collective}): a rank skipped or added a collective")
        diffs = []
        if theirs_coll != self.collective:
            diffs.append(f"collective: expected {self.collective}, received {theirs_coll}")
        if theirs_dtype != self.dtype:
            diffs.append(f"dtype: expected {self.dtype}, received {theirs_dtype}")
        if count != self.count % COUNT_MOD:
            diffs.append(f"count: expected {self.count} (= {self.count % COUNT_MOD} mod {COUNT_MOD}), "
                         f"received {count} mod {COUNT_MOD}")
        return f"rank {peer} differs in " + "; ".join(diffs) if diffs else None


def window_stamp(seq: int, static: int, count: int) -> int:
    """What a one-shot round writes beside its slot: the call's tag (sequence and ``static``
    bits) and its exact count, so ranks whose counts agree mod 1024 still disagree here."""
    return count << STAMP_COUNT_SHIFT | (seq % SEQ_MOD) << 18 | static


def stamp_parts(stamp: int) -> tuple:
    """(tag, exact count) of a window stamp."""
    return stamp & ((1 << STAMP_COUNT_SHIFT) - 1), stamp >> STAMP_COUNT_SHIFT


class ControlEnvelope(Envelope):
    """Envelope of a control exchange: a fixed tag, so it matches whatever collective peers are in."""
    __slots__ = ("tag",)

    def __init__(self, tag: int):
        super().__init__(0, "all_gather", "int64", 0)
        self.tag = tag

    def base_tag(self) -> int:
        return self.tag

    def describe_mismatch(self, tag: int, peer: int) -> Optional[str]:
        return None
