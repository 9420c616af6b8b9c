"""Algorithms as schedules: each rank's program is a list of steps, each step a set of ops.

An algorithm is a pure function ``program(rank, shape) -> [Step, ...]`` over the collective's
named buffers: ``IN`` (what the caller passed in; only read), ``OUT`` (where the result goes) and
``TMP`` (scratch the program needs; its size is read off the program). For an in-place call IN
and OUT are the same memory. Ops name a buffer and an element range of it:

- ``Send(peer, off, count, channel, buf)``       send buf[off:off+count]
- ``Recv(peer, off, count, channel, buf)``       overwrite buf[off:off+count] with the message
- ``RecvReduce(peer, off, count, channel, buf, own, own_off, first)``
      buf[off:off+count] = X OP message, where X is own[own_off:own_off+count] when ``own`` names
      a buffer, else buf[off:off+count] itself; ``first``: message OP X instead. The order
      matters bitwise (max of -0.0 and 0.0, sums of NaNs that differ in sign or payload keep
      their first operand's), so two ranks that each reduce the other's message into their own
      data (recursive doubling) put the lower rank's operand first on both.
- ``Copy(off, count, buf, src, src_off)``        buf[off:off+count] = src[src_off:src_off+count],
      locally, when its step is posted and before any of the step's transfers.

Within a step all transfers are posted at once (receives first), receives complete and reduce in
op order (so the order of reduction never depends on timing), and the step ends when every op has
completed. Sends read memory as it was when the step began: if a RecvReduce writes a range that a
Send of the same step reads (recursive doubling exchanges whole vectors), the executor finishes
the sends before it reduces. ``channel`` separates independent message streams between the same
pair of ranks.

Because programs are data, ``verify`` can check them for every world size without running them:
that sends and receives pair up with equal counts, that no step reads and writes the same range,
that nothing writes IN, and that the job cannot deadlock even when every send waits for its
receive (MPI rendezvous).
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, Optional, Sequence

IN, OUT, TMP = 0, 1, 2
BUFFER_NAMES = ("in", "out", "tmp")


class Send(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0
    buf: int = OUT


class Recv(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0
    buf: int = OUT


class RecvReduce(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0
    buf: int = OUT
    own: Optional[int] = None   # buffer holding this rank's operand; None: buf itself
    own_off: int = 0
    first: bool = False         # the message is the first operand (the module docstring)


class Copy(NamedTuple):
    off: int
    count: int
    buf: int
    src: int
    src_off: int


Op = Send | Recv | RecvReduce | Copy
Step = tuple  # of Op
Program = list  # of Step

DEFAULT_SEGMENT_BYTES = 1 << 20  # big enough to amortise a message, small enough to pipeline
# Device memory: each message costs a stream synchronisation on both sides (about 20 us on an
# H200 to itself, 270 us when two processes share it), so 1 MiB messages ran at 2 GB/s. A 64 MiB
# ring all_reduce on 2 ranks of one H200 took 33.7 ms with 1 MiB segments, 8.6 ms with 4 MiB and
# 3.2 ms with 16 MiB (docs/gpu.md). transport/cuda_ipc.py sizes its pool shares to hold four.
DEVICE_SEGMENT_BYTES = 16 << 20
CHANNELS = 4  # distinct channels an algorithm may use; the executor folds them into tags
CONFIRM_CHANNEL = CHANNELS - 1   # reserved for the confirmation barrier of rooted collectives


class Shape(NamedTuple):
    """What a rank's program depends on besides its rank (hashable: programs are cached by it).

    ``count`` is the element count of the collective's vector (each collective's file says which);
    ``counts`` the per-rank element counts of uneven collectives (all_gather, reduce_scatter), or
    for all_to_all this rank's send counts per peer, with ``recv_counts`` its receive counts;
    ``seg`` the most elements one message carries; ``nodes`` the node of every rank, for
    topology-aware algorithms; ``in_place`` whether IN and OUT are the same memory.
    """
    size: int
    count: int
    root: int = 0
    seg: int = 1 << 18
    counts: Optional[tuple] = None
    recv_counts: Optional[tuple] = None
    nodes: Optional[tuple] = None
    in_place: bool = True


def chunk(count: int, parts: int, i: int) -> tuple[int, int]:
    """(offset, length) of part i when ``count`` elements are split as evenly as possible."""
    lo, hi = i * count // parts, (i + 1) * count // parts
    return lo, hi - lo


def layout(shape: Shape) -> list:
    """(offset, length) of every rank's part of the vector: ``counts`` when given, else even."""
    if shape.counts is None:
        return [chunk(shape.count, shape.size, i) for i in range(shape.size)]
    offs, at = [], 0
    for c in shape.counts:
        offs.append((at, c))
        at += c
    return offs


def largest(shape: Shape) -> int:
    """The longest part of ``layout(shape)``, without building it."""
    return max(shape.counts) if shape.counts else -(-shape.count // shape.size)


def segments(off: int, count: int, seg: int) -> list[tuple[int, int]]:
    """Split [off, off+count) into pieces of at most ``seg`` elements (none if count is 0)."""
    return [(o, min(seg, off + count - o)) for o in range(off, off + count, max(seg, 1))]


def send_segments(peer: int, off: int, count: int, seg: int, channel: int = 0, buf: int = OUT) -> list:
    return [Send(peer, o, c, channel, buf) for o, c in segments(off, count, seg)]


def recv_segments(peer: int, off: int, count: int, seg: int, channel: int = 0, reduce: bool = False,
                  buf: int = OUT, own: Optional[int] = None, own_off: Optional[int] = None,
                  first: bool = False) -> list:
    """Receives of [off, off+count) in segments; with ``reduce``, RecvReduce ops whose own operand
    is ``own`` at ``own_off`` (default: the same offsets) when given, the message first if
    ``first``."""
    if not reduce:
        return [Recv(peer, o, c, channel, buf) for o, c in segments(off, count, seg)]
    shift = 0 if own_off is None else own_off - off
    return [RecvReduce(peer, o, c, channel, buf, own, o + shift if own is not None else 0, first)
            for o, c in segments(off, count, seg)]


class Lanes(tuple):
    """Independent programs of one rank that progress separately, each on its own channels.

    Lock-stepping two pipelines (say, the two trees of a double binary tree) couples them: under
    rendezvous a step of one waits on the other and the job can deadlock. Lanes do not wait on
    each other; the executor advances whichever lane can move."""


class Prologued(NamedTuple):
    """A program preceded by local copies that every lane needs done first (an out-of-place call
    of an algorithm written in place: IN is copied to OUT, then the algorithm runs on OUT)."""
    copies: tuple
    program: object


def lanes_of(program) -> tuple:
    if isinstance(program, Prologued):
        program = program.program
    return tuple(program) if isinstance(program, Lanes) else (program,)


def prologue_of(program) -> tuple:
    return program.copies if isinstance(program, Prologued) else ()


def compact(program: Sequence[Sequence]) -> Program:
    """Drop empty steps; each step becomes a tuple."""
    return [tuple(step) for step in program if step]


def transfers(step) -> list:
    return [op for op in step if not isinstance(op, Copy)]


class ScheduleError(AssertionError):
    pass


def verify(programs: Sequence, *, in_place: Optional[Sequence[bool]] = None) -> int:
    """Check a whole job's programs; return the number of rounds it takes under rendezvous.

    Simulates synchronous sends: a send completes only once its receive has been posted, and a
    receive only once its send has been posted. ``in_place[r]`` (default all True) says whether
    rank r's IN and OUT are one memory; where they are not, nothing may write IN. Raises
    ScheduleError on any defect.
    """
    size = len(programs)
    lanes = [lanes_of(p) for p in programs]
    # For each (src, dst, channel): the sends of src and the receives of dst, in posting order,
    # as (lane, step, count).
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank in range(size):
        owner = {}
        separate = in_place is not None and not in_place[rank]
        _check_step(rank, -1, prologue_of(programs[rank]), size, separate)
        for lane, steps in enumerate(lanes[rank]):
            for k, step in enumerate(steps):
                _check_step(rank, k, step, size, separate)
                for op in transfers(step):
                    if owner.setdefault(op.channel, lane) != lane:
                        raise ScheduleError(f"rank {rank}: channel {op.channel} used by two lanes")
                    if isinstance(op, Send):
                        sends[(rank, op.peer, op.channel)].append((lane, k, op.count))
                    else:
                        recvs[(op.peer, rank, op.channel)].append((lane, k, op.count))
    for key in set(sends) | set(recvs):
        s, r = [c for *_, c in sends.get(key, [])], [c for *_, c in recvs.get(key, [])]
        if s != r:
            raise ScheduleError(f"stream {key} (src, dst, channel): send counts {s} != receive counts {r}")
    first = {(key, True): _first_index(e) for key, e in sends.items()}
    first.update({(key, False): _first_index(e) for key, e in recvs.items()})
    # For every (rank, lane, step): the (peer, peer lane, peer step) its ops are matched by.
    needs = {}
    for rank in range(size):
        for lane, steps in enumerate(lanes[rank]):
            for k, step in enumerate(steps):
                seen = defaultdict(int)
                wanted = set()
                for op in transfers(step):
                    side = isinstance(op, Send)
                    key = (rank, op.peer, op.channel) if side else (op.peer, rank, op.channel)
                    index = first[(key, side)][(lane, k)] + seen[(key, side)]
                    seen[(key, side)] += 1
                    peer_lane, peer_step, _ = (recvs if side else sends)[key][index]
                    wanted.add((op.peer, peer_lane, peer_step))
                needs[(rank, lane, k)] = tuple(wanted)
    at = {(rank, lane): 0 for rank in range(size) for lane in range(len(lanes[rank]))}
    active = [rl for rl in at if len(lanes[rl[0]][rl[1]])]
    rounds = 0
    while active:
        done = [(r, l) for r, l in active
                if all(ps <= at[(p, pl)] for p, pl, ps in needs[(r, l, at[(r, l)])])]
        if not done:
            raise ScheduleError(f"deadlock under rendezvous: (rank, lane) stuck at steps "
                                f"{ {rl: at[rl] for rl in active} }")
        for rl in done:
            at[rl] += 1
        active = [rl for rl in active if at[rl] < len(lanes[rl[0]][rl[1]])]
        rounds += 1
    return rounds


def _where(buf: int, separate: bool) -> int:
    """The memory a buffer id lands in: IN and OUT are one memory in an in-place call."""
    return buf if separate or buf == TMP else OUT


def _check_step(rank, k, step, size, separate: bool):
    """A Recv overwrites its range as bytes arrive, so that range may not touch any other
    transfer's range in the same memory. RecvReduce writes only when it completes (after
    overlapping sends, see ``sends_first``), and two RecvReduce into one range are applied one
    after the other, in op order. Copies run before the step's transfers."""
    for op in step:
        if isinstance(op, Copy):
            if op.count < 0 or op.off < 0 or op.src_off < 0:
                raise ScheduleError(f"rank {rank} step {k}: bad range in {op}")
            if separate and op.buf == IN:
                raise ScheduleError(f"rank {rank} step {k}: {op} writes the input buffer")
            continue
        if not 0 <= op.peer < size or op.peer == rank:
            raise ScheduleError(f"rank {rank} step {k}: bad peer in {op}")
        if op.count < 0 or op.off < 0:
            raise ScheduleError(f"rank {rank} step {k}: bad range in {op}")
        if separate and op.buf == IN and not isinstance(op, Send):
            raise ScheduleError(f"rank {rank} step {k}: {op} writes the input buffer")
    moves = transfers(step)
    for i, a in enumerate(moves):
        for b in moves[i + 1:]:
            clash = isinstance(a, Recv) or isinstance(b, Recv)
            same = _where(a.buf, separate) == _where(b.buf, separate)
            if clash and same and a.count and b.count and a.off < b.off + b.count and b.off < a.off + a.count:
                raise ScheduleError(f"rank {rank} step {k}: {a} and {b} touch the same elements")


def _first_index(entries) -> dict:
    """(lane, step) -> position of that step's first op in the stream (they are consecutive)."""
    first = {}
    for i, (lane, step, _) in enumerate(entries):
        first.setdefault((lane, step), i)
    return first


def sends_first(step, separate: bool = False) -> bool:
    """True if some RecvReduce of the step writes a range a Send of it reads: then the sends must
    finish before the reductions."""
    sends = [op for op in step if isinstance(op, Send) and op.count]
    return any(isinstance(op, RecvReduce) and op.count and any(
        _where(op.buf, separate) == _where(s.buf, separate)
        and op.off < s.off + s.count and s.off < op.off + op.count for s in sends) for op in step)


def scratch_elements(program) -> int:
    """Elements of TMP a program touches (its scratch size)."""
    top = 0
    for lane in lanes_of(program) + ((prologue_of(program),) if prologue_of(program) else ()):
        for step in (lane if lane is not prologue_of(program) else (lane,)):
            for op in step:
                if op.buf == TMP:
                    top = max(top, op.off + op.count)
                if isinstance(op, RecvReduce) and op.own == TMP:
                    top = max(top, op.own_off + op.count)
                if isinstance(op, Copy) and op.src == TMP:
                    top = max(top, op.src_off + op.count)
    return top


def confirmation(rank: int, size: int) -> list:
    """A dissemination barrier on the reserved channel: appended to rooted collectives so that a
    rank whose own messages all matched still waits until every rank got through (a rank that
    disagreed never sends its part, and the others then learn why instead of returning normally)."""
    steps, dist = [], 1
    while dist < size:
        steps.append((Send((rank + dist) % size, 0, 0, CONFIRM_CHANNEL), Recv((rank - dist) % size, 0, 0, CONFIRM_CHANNEL)))
        dist <<= 1
    return steps
