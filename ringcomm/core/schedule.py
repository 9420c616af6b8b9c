"""Algorithms as schedules: each rank's program is a list of steps, each step a set of ops.

An algorithm is a pure function ``program(rank, size, count, root, seg) -> [Step, ...]`` over one
flat work array W of ``count`` elements. Ops name a peer and an element range of W:

- ``Send(peer, off, count)``       send W[off:off+count]
- ``Recv(peer, off, count)``       overwrite W[off:off+count] with the peer's message
- ``RecvReduce(peer, off, count)`` W[off:off+count] = W[off:off+count] OP message

Within a step all ops are posted at once (receives first), receives complete and reduce in op
order (so the order of reduction never depends on timing), and the step ends when every op has
completed. Sends read W as it was when the step began: if a RecvReduce overlaps a Send of the
same step (recursive doubling exchanges whole vectors), the executor finishes the sends before it
reduces. ``channel`` separates independent message streams between the same pair of ranks.

Because programs are data, ``verify`` can check them for every world size without running them:
that sends and receives pair up with equal counts, that no step reads and writes the same range,
and that the job cannot deadlock even when every send waits for its receive (MPI rendezvous).
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, Sequence


class Send(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0


class Recv(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0


class RecvReduce(NamedTuple):
    peer: int
    off: int
    count: int
    channel: int = 0


Op = Send | Recv | RecvReduce
Step = tuple  # of Op
Program = list  # of Step

DEFAULT_SEGMENT_BYTES = 1 << 20  # big enough to amortise a message, small enough to pipeline
CHANNELS = 4  # distinct channels an algorithm may use; the executor folds them into MPI tags


def chunk(count: int, parts: int, i: int) -> tuple[int, int]:
    """(offset, length) of part i when ``count`` elements are split as evenly as possible."""
    lo, hi = i * count // parts, (i + 1) * count // parts
    return lo, hi - lo


def segments(off: int, count: int, seg: int) -> list[tuple[int, int]]:
    """Split [off, off+count) into pieces of at most ``seg`` elements (none if count is 0)."""
    return [(o, min(seg, off + count - o)) for o in range(off, off + count, max(seg, 1))]


def send_segments(peer: int, off: int, count: int, seg: int, channel: int = 0) -> list:
    return [Send(peer, o, c, channel) for o, c in segments(off, count, seg)]


def recv_segments(peer: int, off: int, count: int, seg: int, channel: int = 0, reduce: bool = False) -> list:
    kind = RecvReduce if reduce else Recv
    return [kind(peer, o, c, channel) for o, c in segments(off, count, seg)]


class Lanes(tuple):
    """Independent programs of one rank that progress separately, each on its own channels.

    Lock-stepping two pipelines (say, the two trees of a double binary tree) couples them: under
    rendezvous a step of one waits on the other and the job can deadlock. Lanes do not wait on
    each other; the executor advances whichever lane can move."""


def lanes_of(program) -> tuple:
    return tuple(program) if isinstance(program, Lanes) else (program,)


def compact(program: Sequence[Sequence]) -> Program:
    """Drop empty steps; each step becomes a tuple."""
    return [tuple(step) for step in program if step]


class ScheduleError(AssertionError):
    pass


def verify(programs: Sequence) -> int:
    """Check a whole job's programs; return the number of rounds it takes under rendezvous.

    Simulates synchronous sends: a send completes only once its receive has been posted, and a
    receive only once its send has been posted. Raises ScheduleError on any defect.
    """
    size = len(programs)
    lanes = [lanes_of(p) for p in programs]
    # For each (src, dst, channel): the sends of src and the receives of dst, in posting order,
    # as (lane, step, count).
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank in range(size):
        owner = {}
        for lane, steps in enumerate(lanes[rank]):
            for k, step in enumerate(steps):
                _check_step(rank, k, step, size)
                for op in step:
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
    at = {(rank, lane): 0 for rank in range(size) for lane in range(len(lanes[rank]))}
    rounds = 0
    while any(at[(r, l)] < len(lanes[r][l]) for r, l in at):
        done = [(r, l) for r, l in at if at[(r, l)] < len(lanes[r][l])
                and _step_matched(r, l, at, sends, recvs, first, lanes)]
        if not done:
            stuck = {rl: at[rl] for rl in at if at[rl] < len(lanes[rl[0]][rl[1]])}
            raise ScheduleError(f"deadlock under rendezvous: (rank, lane) stuck at steps {stuck}")
        for rl in done:
            at[rl] += 1
        rounds += 1
    return rounds


def _check_step(rank, k, step, size):
    """A Recv overwrites W as bytes arrive, so its range may not touch any other op's range.
    RecvReduce writes only when it completes (after overlapping sends, see ``sends_first``), and
    two RecvReduce into one range are applied one after the other, in op order."""
    for op in step:
        if not 0 <= op.peer < size or op.peer == rank:
            raise ScheduleError(f"rank {rank} step {k}: bad peer in {op}")
        if op.count < 0 or op.off < 0:
            raise ScheduleError(f"rank {rank} step {k}: bad range in {op}")
    for i, a in enumerate(step):
        for b in step[i + 1:]:
            clash = isinstance(a, Recv) or isinstance(b, Recv)
            if clash and a.count and b.count and a.off < b.off + b.count and b.off < a.off + a.count:
                raise ScheduleError(f"rank {rank} step {k}: {a} and {b} touch the same elements")


def _step_matched(rank, lane, at, sends, recvs, first, lanes) -> bool:
    """Is every op of this lane's current step matched by an op its peer has already posted?"""
    k = at[(rank, lane)]
    seen = defaultdict(int)
    for op in lanes[rank][lane][k]:
        side = isinstance(op, Send)
        key = (rank, op.peer, op.channel) if side else (op.peer, rank, op.channel)
        index = first[(key, side)][(lane, k)] + seen[(key, side)]
        seen[(key, side)] += 1
        peer_lane, peer_step, _ = (recvs if side else sends)[key][index]
        if peer_step > at[(op.peer, peer_lane)]:
            return False
    return True


def _first_index(entries) -> dict:
    """(lane, step) -> position of that step's first op in the stream (they are consecutive)."""
    first = {}
    for i, (lane, step, _) in enumerate(entries):
        first.setdefault((lane, step), i)
    return first


def sends_first(step) -> bool:
    """True if some RecvReduce of the step overlaps a Send of it: then sends must finish first."""
    sends = [op for op in step if isinstance(op, Send) and op.count]
    return any(isinstance(op, RecvReduce) and op.count and any(
        op.off < s.off + s.count and s.off < op.off + op.count for s in sends) for op in step)
