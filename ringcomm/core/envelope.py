"""What a message's tag says about the call that sent it, so mismatches fail loudly.

Every data message of a collective carries, in its tag, the collective's sequence number, which
collective it is (its code, owned by its file in ringcomm/collectives), its dtype, its reduction
op and its element count modulo 32. Ranks that disagree on any of these post receives that can
never match the messages their peers send, so instead of silently reducing int32 bits as float32,
mixing chunks of different lengths, or one rank summing what another takes the maximum of (each
would return another result: replicas that drift), the waits stall; the executor then looks at
the first unmatched message from the peer it waits for (a probe) and raises MismatchError saying
which field differs. That costs nothing on the fast path.

Layout (29 bits: MPICH's tag bound here is 2**29 - 1):
  bit 28       control (abort notices, debug fingerprints): never a data message
  bit 27       point-to-point (send/recv) rather than a collective
  collectives:   bits 19..26 sequence mod 256 | 15..18 collective | 11..14 dtype
                 | 7..10 op (0: none) | 2..6 count mod 32 | 0..1 channel (independent streams
                 of one algorithm)
  point-to-point: bits 23..26 dtype | 0..22 the user's tag
Sub-communicators keep their messages apart above bit 32 (transport views add their context
there) or on MPI communicators of their own, so these 29 bits are per communicator. A count that
differs by a multiple of 32 still fails loudly: a message of another length is refused by its
receiver, and a one-shot window stamp carries the exact count.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

from .ops import DTYPES, OP_NAMES, ReduceOp

DTYPE_NAMES = tuple(DTYPES)
NO_DTYPE = 15                  # dtype field of calls without one (barrier)
CONTROL = 1 << 28
P2P = 1 << 27
ABORT_TAG = CONTROL | 4        # payload: the error text of a rank that gave up
FINGERPRINT_TAG = CONTROL | 8  # RINGCOMM_DEBUG=detail / CHECK_FINITE pre-flight exchange
PINGPONG_TAG = CONTROL | 12    # ringcomm.tune's point-to-point timings
SPLIT_TAG = CONTROL | 16       # comm.split()'s exchange of colors and keys
SEQ_MOD = 32                   # a rank can run ahead of a peer by one call, never 32
ALGORITHM_SHIFT = 24           # bits 24-26 of a collective's tag: which schedule algorithm sent it
ALGORITHMS = 8                 # schedule algorithms a collective may have (0..7)
ALGORITHM_MASK = (ALGORITHMS - 1) << ALGORITHM_SHIFT
COUNT_MOD = 32
USER_TAG_LIMIT = 1 << 23       # send/recv tags are 0 .. USER_TAG_LIMIT - 1
# Leads a member's row in the exchange that gives a closed sub-communicator's MPI communicator
# back (transport/mpi.py retire_communicator). On a reference backend a peer still in a
# collective this rank never entered pairs its pre-flight row with that exchange, and its
# MismatchError names the call so.
CLOSE_CODE = 0x52_45_54_49_52_45_44
STAMP_COUNT_SHIFT = 32         # a one-shot window stamp: the count (stamp_count) above the 29-bit tag
# Stamps are int64 and never negative (a rank that gave up posts -1), which leaves the count 31
# bits. Counts below 2**30 go in as they are; from 2**30 on, bit 30 and the count's low 30 bits,
# its higher bits riding in bits 32-62 of the round's word (``count_word``): a count of 2**31
# elements or more overflowed the stamp and stopped every window algorithm at its first round
# (ValueError from the slot's int64 view), and a hash of the rest let two such counts pass as one.
EXACT_COUNTS = 1 << 30
COUNT_WORD_SHIFT = 32
_LOW_COUNT = EXACT_COUNTS - 1
_LOW_WORD = (1 << COUNT_WORD_SHIFT) - 1
_HIGH_COUNT = (1 << 31) - 1      # the top of a count below 2**61: bits 32-62 of a non-negative int64
# ... and between the two (bits 29-31), which window algorithm posted it: one_shot and direct
# rounds of one call carry different things in their slots (data, or an address to read).
WINDOW_KIND_SHIFT = 29
WINDOW_KINDS = 7               # window algorithms a collective may have (kinds 1..7; 0: none said)

_names: dict = {CLOSE_CODE: "close()"}   # collective code -> name, filled by the collectives registry
_algorithm_names: dict = {}    # collective code -> its schedule algorithms' names, by index (algorithms/)


def register_collective(code: int, name: str) -> None:
    if not 0 <= code < 16 or _names.get(code, name) != name:
        raise ValueError(f"collective code {code} of {name!r} is out of range or taken by {_names.get(code)!r}")
    _names[code] = name


def _name(code: int) -> str:
    return _names.get(code, f"collective {code}")


def register_algorithms(code: int, names: tuple) -> None:
    """The schedule algorithms of collective ``code``; an index into ``names`` rides in every tag."""
    if len(names) > ALGORITHMS:
        raise ValueError(f"{_name(code)} has {len(names)} schedule algorithms; a tag tells {ALGORITHMS} apart")
    _algorithm_names[code] = tuple(names)


def _algorithm_name(code: int, index: int) -> str:
    names = _algorithm_names.get(code, ())
    return names[index] if index < len(names) else f"algorithm {index}"


_OP_CODES = {None: 0, **{op: i + 1 for i, op in enumerate(ReduceOp)}}


def op_code(op) -> int:
    """The envelope's op field: 0 for a collective that reduces nothing, else 1 + the op's place
    in ReduceOp (``op``: a ReduceOp or None)."""
    return _OP_CODES[op]


def _op_name(code: int) -> str:
    return "none" if code == 0 else OP_NAMES[code - 1] if code <= len(OP_NAMES) else f"op {code}"


@lru_cache(maxsize=4096)
def static_bits(code: int, dtype: Optional[str], count: int, op: int = 0) -> int:
    """The tag bits that do not change from call to call of one shape (all but the sequence);
    ``op``: ``op_code`` of the call's reduction."""
    d = DTYPE_NAMES.index(dtype) if dtype else NO_DTYPE
    return code << 15 | d << 11 | op << 7 | (count % COUNT_MOD) << 2


class Envelope:
    """The fields one collective call stamps on its messages (immutable by convention; built
    once per call, so it is a plain slotted class: a frozen dataclass costs twice as much)."""
    __slots__ = ("seq", "code", "dtype", "count", "op", "algorithm")

    def __init__(self, seq: int, code: int, dtype: Optional[str], count: int, op: int = 0, algorithm: int = 0):
        self.seq, self.code, self.dtype, self.count = seq, code, dtype, count   # dtype None: barrier
        self.op = op   # op_code of the reduction, 0 for none
        # which of the collective's schedule algorithms runs (register_algorithms): ranks that
        # passed different ones as algorithm= would otherwise take each other's messages of one
        # size as their own (ring and recursive_doubling on 2 ranks returned a wrong sum)
        self.algorithm = algorithm

    @property
    def collective(self) -> str:
        return _name(self.code)

    def __eq__(self, other) -> bool:
        return isinstance(other, Envelope) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        return (f"Envelope(seq={self.seq}, collective={self.collective!r}, dtype={self.dtype!r}, count={self.count}, "
                f"op={_op_name(self.op)!r}, algorithm={_algorithm_name(self.code, self.algorithm)!r})")

    def fields(self) -> tuple:
        return self.seq, self.code, self.dtype, self.count, self.op, self.algorithm

    def base_tag(self) -> int:
        return (self.algorithm << ALGORITHM_SHIFT | (self.seq % SEQ_MOD) << 19
                | static_bits(self.code, self.dtype, self.count, self.op))

    def numbered_alike(self, tag: int) -> bool:
        """Whether the collective message ``tag`` carries this call's number. From a peer this
        rank is not waiting on it still proves a disagreement when the rest differs: a peer is at
        most one call ahead of a rank whose messages it needs (every collective needs every
        rank's, and rooted ones end with a confirmation), never SEQ_MOD calls."""
        tag &= (1 << 29) - 1
        return not tag & (CONTROL | P2P) and (tag >> 19 & SEQ_MOD - 1) == self.seq % SEQ_MOD

    def describe_mismatch(self, tag: int, peer: int) -> Optional[str]:
        """Why a message with ``tag`` from ``peer`` cannot belong to this collective, or None.
        ``tag`` may also be a window stamp's (envelope.stamp_parts), which names a window
        algorithm instead (window_kind_of) and no schedule algorithm."""
        message = not window_kind_of(tag)
        tag &= (1 << 29) - 1
        if tag & (CONTROL | P2P):   # a send may wait for its receive across collectives (MPI's rule)
            return None
        seq, code, dtype, op, count = tag >> 19 & SEQ_MOD - 1, tag >> 15 & 15, tag >> 11 & 15, tag >> 7 & 15, tag >> 2 & 31
        algorithm = tag >> ALGORITHM_SHIFT & ALGORITHMS - 1
        theirs_coll = _name(code)
        theirs_dtype = DTYPE_NAMES[dtype] if dtype < len(DTYPE_NAMES) else None
        if seq != self.seq % SEQ_MOD:
            return (f"rank {peer} is at collective #{seq} (mod {SEQ_MOD}, {theirs_coll}) while this rank "
                    f"is at #{self.seq} ({self.collective}): a rank skipped or added a collective")
        diffs = []
        if code != self.code:
            diffs.append(f"collective: expected {self.collective}, received {theirs_coll}")
        if theirs_dtype != self.dtype:
            diffs.append(f"dtype: expected {self.dtype}, received {theirs_dtype}")
        if op != self.op:
            diffs.append(f"op: expected {_op_name(self.op)}, received {_op_name(op)}")
        if count != self.count % COUNT_MOD:
            diffs.append(f"count: expected {self.count} (= {self.count % COUNT_MOD} mod {COUNT_MOD}), "
                         f"received {count} mod {COUNT_MOD}")
        if message and algorithm != self.algorithm and code == self.code:
            diffs.append(f"algorithm: expected {_algorithm_name(self.code, self.algorithm)}, received "
                         f"{_algorithm_name(code, algorithm)} (algorithm= or RINGCOMM_ALGO)")
        return f"rank {peer} differs in " + "; ".join(diffs) if diffs else None


def p2p_tag(dtype: str, user_tag: int) -> int:
    """The tag of a send/recv: its dtype and the user's tag (so a float32 receive never takes an
    int32 message of the same length)."""
    return P2P | DTYPE_NAMES.index(dtype) << 23 | user_tag


def describe_p2p_mismatch(tag: int, dtype: str, user_tag: int, peer: int) -> Optional[str]:
    """Why a message with ``tag`` from ``peer`` is not what a receive of (dtype, user_tag) waits for."""
    tag &= (1 << 29) - 1
    if not tag & P2P or tag & CONTROL or tag & (USER_TAG_LIMIT - 1) != user_tag:
        return None
    theirs = tag >> 23 & 15
    theirs_dtype = DTYPE_NAMES[theirs] if theirs < len(DTYPE_NAMES) else f"dtype {theirs}"
    if theirs_dtype != dtype:
        return f"rank {peer} sent {theirs_dtype} under tag {user_tag}, this rank receives {dtype}"
    return None


def window_stamp(seq: int, static: int, count: int) -> int:
    """What a one-shot round writes beside its slot: the call's tag (sequence and ``static``
    bits) and its count (``stamp_count``), so ranks whose counts agree mod 32 still disagree here."""
    if count >= EXACT_COUNTS:
        count = stamp_count(count)
    return count << STAMP_COUNT_SHIFT | (seq % SEQ_MOD) << 19 | static


def stamp_count(count: int) -> int:
    """A count as a window stamp carries it: exact below EXACT_COUNTS, else bit 30 and its low
    30 bits (the rest: ``count_word``)."""
    if count < EXACT_COUNTS:
        return count
    return EXACT_COUNTS | count & _LOW_COUNT


def count_word(count: int) -> int:
    """What a count of EXACT_COUNTS or more adds (XOR) to its round's word: the bits its stamp has
    no room for, in bits 32-62 (0 below EXACT_COUNTS). The words posted otherwise, a root or a
    flag, lie below bit 32; an uneven call's hash of its counts stays a hash."""
    if count < EXACT_COUNTS:
        return 0
    return (count >> 30 & _HIGH_COUNT) << COUNT_WORD_SHIFT


def stamp_parts(stamp: int) -> tuple:
    """(tag, count as stamp_count gave it) of a window stamp."""
    return stamp & ((1 << STAMP_COUNT_SHIFT) - 1), stamp >> STAMP_COUNT_SHIFT


def count_differs(peer: int, mine: int, theirs: int, words: tuple = ()) -> str:
    """Why a peer's stamp count (``theirs``, stamp_count's) is not this rank's count ``mine``;
    empty if it is. ``words``: (this rank's round word, the peer's), which hold the rest of a
    count of EXACT_COUNTS or more (``count_word``); without them, or where the rest of the words
    differs (a root: Collective.describe_word says so), such a count is judged by its low 30 bits."""
    if theirs < EXACT_COUNTS:
        return "" if theirs == mine else f"rank {peer} differs in count: expected {mine}, received {theirs}"
    if words and not (words[0] ^ words[1]) & _LOW_WORD:
        # Their word is ours but for the counts' tops: XOR ours out, theirs is left.
        top = (words[0] ^ words[1]) >> COUNT_WORD_SHIFT ^ (mine >> 30 & _HIGH_COUNT)
        full = top << 30 | theirs & _LOW_COUNT
        return "" if full == mine else f"rank {peer} differs in count: expected {mine}, received {full}"
    if theirs == stamp_count(mine):
        return ""
    return f"rank {peer} differs in count: expected {mine}, received another count of {EXACT_COUNTS} or more"


def word_detail(word: int) -> int:
    """A round's word without what ``count_word`` added: the part Collective.describe_word reads."""
    return word & _LOW_WORD


def window_kind_bits(kind: int) -> int:
    """The stamp bits of window algorithm ``kind`` (algorithms.window_kind), ORed into a window
    plan's static bits (never into a message tag: those stay under 2**29, MPI's bound)."""
    return kind << WINDOW_KIND_SHIFT


def window_kind_of(stamp: int) -> int:
    return stamp >> WINDOW_KIND_SHIFT & WINDOW_KINDS


class ControlEnvelope(Envelope):
    """Envelope of a control exchange: a fixed tag, so it matches whatever collective peers are in."""
    __slots__ = ("tag",)

    def __init__(self, tag: int, what: str = "control exchange"):
        super().__init__(0, 15, "int64", 0)
        self.tag = tag

    def base_tag(self) -> int:
        return self.tag

    def describe_mismatch(self, tag: int, peer: int) -> Optional[str]:
        return None
