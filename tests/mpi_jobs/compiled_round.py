"""Ranks in separate processes, some running the compiled window rounds and some the Python
rounds (RINGCOMM_COMPILED set per rank by an MPMD launch): every result must be the same bits on
every rank and equal the rank-order fold computed here with numpy, and every rank must choose
the same algorithm for every size (the job prices the Python rounds if one rank runs them).

    mpirun -n 1 -env RINGCOMM_COMPILED 0 python compiled_round.py : -n 2 python compiled_round.py

Prints "rank R ok CHECKS compiled=BOOL" per rank; an assertion names the first wrong case.
"""
import os
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.core.ops import DTYPES, check_op, round_code

world = MPI.COMM_WORLD
comm = ringcomm.init()
rank, size = comm.rank, comm.size
window = comm.transport.window
assert window is not None, "no shared window: the job must run on one node over shm"
wants = os.environ.get("RINGCOMM_COMPILED", "1") != "0"
assert (window.core is not None) == wants, f"rank {rank}: RINGCOMM_COMPILED={wants} but core={window.core}"

checks = 0
for op in ringcomm.ReduceOp:
    for name, dtype in DTYPES.items():
        if op is ringcomm.ReduceOp.PREMUL_SUM or round_code(op, dtype) < 0:
            continue
        try:
            check_op("all_reduce", op, dtype)
        except ringcomm.UsageError:
            continue
        for count in (1, 255, 4097, 16384):
            def inputs(r):
                rng = np.random.default_rng(r * 131 + count)
                if dtype.is_float:
                    return (rng.standard_normal(count) * 1e3).astype(dtype.storage)
                info = np.iinfo(dtype.storage)
                return rng.integers(info.min, info.max, count, dtype=dtype.storage, endpoint=True)
            x = inputs(rank)
            with np.errstate(all="ignore"):
                comm.all_reduce(x, op=op.value, algorithm="one_shot")
                expected = inputs(0)
                ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                         "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op.value]
                for r in range(1, size):
                    expected = ufunc(expected, inputs(r))
                if op is ringcomm.ReduceOp.AVG:
                    expected = expected / expected.dtype.type(size)
            crcs = world.allgather(zlib.crc32(x.view(np.uint8)))
            assert len(set(crcs)) == 1, f"{op.value} {name} x {count}: ranks differ {crcs}"
            assert x.tobytes() == expected.tobytes(), f"{op.value} {name} x {count}: not the rank-order fold"
            checks += 1

# The rounds the core runs from a plan (algorithms/_planned.py): broadcast, all-gather, all-to-all,
# gather, scatter, reduce-scatter, one round each, against what numpy says every rank must hold.
for name in ("float32", "float64", "int8", "int64"):
    storage = DTYPES[name].storage
    for count in (1, 255, 4097):
        def block(r, salt=0):
            return (np.arange(count * size) * (r + 3) + 7 * salt).astype(storage)
        for root in range(size):
            x = block(rank) if rank == root else np.zeros(count, storage)
            x = x[:count].copy()
            comm.broadcast(x, root=root, algorithm="one_shot")
            assert x.tobytes() == block(root)[:count].tobytes(), f"broadcast {name} x {count} from {root}"
        out = np.zeros(count * size, storage)
        comm.all_gather(out, block(rank)[:count], algorithm="one_shot")
        assert out.tobytes() == np.concatenate([block(r)[:count] for r in range(size)]).tobytes(), \
            f"all_gather {name} x {count}"
        comm.all_to_all(out, block(rank, 1), algorithm="one_shot")
        mine = np.concatenate([block(r, 1)[rank * count:(rank + 1) * count] for r in range(size)])
        assert out.tobytes() == mine.tobytes(), f"all_to_all {name} x {count}"
        for root in range(size):
            whole = np.zeros(count * size, storage) if rank == root else None
            comm.gather(whole, block(rank, 3)[:count], root=root, algorithm="one_shot")
            if rank == root:
                assert whole.tobytes() == np.concatenate([block(r, 3)[:count] for r in range(size)]).tobytes(), \
                    f"gather {name} x {count} to {root}"
            part = np.zeros(count, storage)
            comm.scatter(part, block(root, 4) if rank == root else None, root=root, algorithm="one_shot")
            assert part.tobytes() == block(root, 4)[rank * count:(rank + 1) * count].tobytes(), \
                f"scatter {name} x {count} from {root}"
        for op, ufunc in (("sum", np.add), ("max", np.maximum)):
            part = np.zeros(count, storage)
            with np.errstate(all="ignore"):
                comm.reduce_scatter(part, block(rank, 2), op=op, algorithm="one_shot")
                expected = block(0, 2)
                for r in range(1, size):
                    expected = ufunc(expected, block(r, 2))
            assert part.tobytes() == expected[rank * count:(rank + 1) * count].tobytes(), \
                f"reduce_scatter {op} {name} x {count}"
        checks += 1 + 3 * size + 3


class Recorder:
    """Stands in for the window's direct core and keeps what each compiled direct call did."""

    def __init__(self, core):
        self.core, self.statuses, self.moved = core, [], []

    def direct(self, *args):
        status = self.core.direct(*args)
        self.statuses.append(status)
        return status

    def moves(self, *args):
        status = self.core.moves(*args)
        self.moved.append(status)
        return status


# The direct all-to-all, whose two rounds and reads run compiled where this rank reads peers by
# CMA itself (core/_round.c, ``direct``): even and uneven calls, ranks sending or receiving
# nothing, a peer late in the first round (one rank sleeps) and in the second (rank 0 reads a
# 64 MiB block while the others read a few bytes), against the blocks computed here.
recorder = None
if window.direct_core is not None:
    recorder = window.direct_core = Recorder(window.direct_core)
# Where this host copies slowly between buffers a few bytes apart modulo a page (cma.py), a call
# whose reads lie so is left to the Python road (2): the small arrays here come from malloc's heap.
STOPS = {0, 1, 2, 3} if comm.transport.node._memory.bounce else {0, 1, 3}


def sent(src, dst, n, storage):
    return ((np.arange(n) + 1000 * src + 100 * dst) % 120).astype(storage)


def direct_case(storage, case, late=None):
    rng = np.random.default_rng(case)
    table = rng.integers(0, 40, (size, size))   # table[i][j]: elements rank i sends rank j
    if case == 1:
        table[case % size] = 0                  # a rank that sends nothing
    if case == 2:
        table[:, case % size] = 0               # a rank that receives nothing
    if case == 3 and storage is np.float32:
        table[1 % size][0] = 16 << 20           # 64 MiB to rank 0: its peers wait in round 2
    even = case == 4
    if even:
        table[:] = 33
    if case == 5 and rank == 1 % size:
        time.sleep(0.02)                        # its peers wait in round 1
    x = np.concatenate([sent(rank, j, table[rank][j], storage) for j in range(size)])
    out = np.full(table[:, rank].sum(), -1, storage)
    splits = () if even else (list(table[:, rank]), list(table[rank]))
    if late is not None:   # everyone ready (64 MiB take a while to make), then rank ``late`` comes last
        world.Barrier()
        if rank == late:
            time.sleep(0.02)
    comm.all_to_all(out, x, *splits, algorithm="direct")
    expected = np.concatenate([sent(j, rank, table[j][rank], storage) for j in range(size)])
    assert out.tobytes() == expected.tobytes(), f"direct all_to_all {storage.__name__} case {case}"


def waited_in_round_two():
    return recorder is None or rank == 0 or 3 in recorder.statuses


for storage in (np.float32, np.int16, np.float64):
    for case in range(7):
        direct_case(storage, case)
        checks += 1
# Case 3 again until every compiled peer has waited in round 2 once, each time with a peer that
# has not yet done so coming last to round 1: the others wait for it there, and it waits in round
# 2 while rank 0 reads its 64 MiB. Left to chance, a peer that came early (the rank making the 64 MiB comes
# late) waited in round 1 and the Python road did the rest: 9 tries in a row once, 3 ranks on 2
# cores. One descheduled while rank 0 reads may still find the read done when it looks.
for _ in range(8):
    waited = world.allgather(waited_in_round_two())
    if all(waited):
        break
    direct_case(np.float32, 3, late=waited.index(False))
    checks += 1
if recorder is not None:
    seen = set(recorder.statuses)
    # 0 (done) where every rank has a core; ranks sharing cores poll briefly and stop for Python
    assert 1 in seen and seen <= STOPS, f"rank {rank}: the compiled direct calls did {recorder.statuses}"
    assert waited_in_round_two(), f"rank {rank}: no call waited in round 2 in 9 tries: {recorder.statuses}"

# The memo's road (persistent.WindowCall): blocking calls on the same buffers run, from the third
# on, the compiled direct call straight from the road built once; a peer late in the fifth stops
# it where the Python waits take over; every call moves its own data.
comm.selector.forced["all_to_all"] = "direct"
x, out = np.empty(size * 4096, np.float32), np.empty(size * 4096, np.float32)
before = len(recorder.statuses) if recorder is not None else 0
for i in range(6):
    x[...] = np.concatenate([sent(rank, j, 4096, np.float32) + i for j in range(size)])
    if i == 4 and rank == 1 % size:
        time.sleep(0.02)
    comm.all_to_all(out, x)
    expected = np.concatenate([sent(j, rank, 4096, np.float32) + i for j in range(size)])
    assert out.tobytes() == expected.tobytes(), f"remembered direct all_to_all, call {i}"
    checks += 1
road = comm._fast.calls[("all_to_all", id(out), id(x))][1]
assert type(road).__name__ == "WindowCall" and (road.road is not None) == (recorder is not None), road
if recorder is not None:
    statuses = recorder.statuses[before:]
    assert len(statuses) == 6 and set(statuses) <= STOPS, f"rank {rank}: {statuses}"
    assert rank == 1 % size or statuses[4] == 1, f"rank {rank}: the late peer's call did {statuses[4]}"
del comm.selector.forced["all_to_all"]

# The direct gather, scatter, all-gather and broadcast, whose rounds and moves run compiled where
# this rank reaches peers by CMA itself (core/_round.c, ``moves``), beside ranks that run them in
# Python: every root, uneven all-gathers (a rank with nothing), in place, 4 MiB parts, a peer late
# in the first round, against the values computed here.
for case in range(4):
    count = (1 << 20) if case == 3 else 37 + case
    late = case == 2 and rank == 1 % size
    for root in range(size):
        if late:
            time.sleep(0.02)
        whole = np.full(size * count, -1, np.float32) if rank == root else None
        comm.gather(whole, sent(rank, root, count, np.float32), root=root, algorithm="direct")
        if rank == root:
            expected = np.concatenate([sent(j, root, count, np.float32) for j in range(size)])
            assert whole.tobytes() == expected.tobytes(), f"direct gather case {case} root {root}"
        part = np.full(count, -1, np.int16)
        x = np.concatenate([sent(root, j, count, np.int16) for j in range(size)]) if rank == root else None
        comm.scatter(part, x, root=root, algorithm="direct")
        assert part.tobytes() == sent(root, rank, count, np.int16).tobytes(), f"direct scatter case {case} root {root}"
        vector = sent(root, size, size * count, np.float64) if rank == root else np.full(size * count, -1.0)
        comm.broadcast(vector, root=root, algorithm="direct")
        assert vector.tobytes() == sent(root, size, size * count, np.float64).tobytes(), f"direct broadcast {case}"
        checks += 3
    counts = [0 if (case == 1 and r == 0) else count + r for r in range(size)]
    out = np.full(sum(counts), -1, np.float32)
    expected = np.concatenate([sent(r, size, counts[r], np.float32) for r in range(size)])
    comm.all_gather(out, sent(rank, size, counts[rank], np.float32), counts=counts, algorithm="direct")
    assert out.tobytes() == expected.tobytes(), f"direct all_gather case {case}"
    out[:] = -1
    mine = out[sum(counts[:rank]):sum(counts[:rank + 1])]
    mine[...] = sent(rank, size, counts[rank], np.float32)
    comm.all_gather(out, mine, counts=counts, algorithm="direct")   # in place
    assert out.tobytes() == expected.tobytes(), f"direct all_gather in place case {case}"
    checks += 2
if recorder is not None:
    assert set(recorder.moved) <= STOPS, f"rank {rank}: the compiled moves calls did {recorder.moved}"
    assert len(recorder.moved) == 4 * (3 * size + 2), f"rank {rank}: {len(recorder.moved)} compiled moves calls"

# The rounds cost differently, so the job prices the Python rounds wherever one rank runs them
# (agreement.py): every rank then chooses the same algorithm for every call, with or without a
# tuning file that prices the compiled round (with one, a rank without it chose otherwise, and
# read its peer's window data as an address).
assert comm.selector.compiled_everywhere == all(world.allgather(wants)), comm.selector.compiled_everywhere
sizes = [1 << k for k in range(2, 27)]
for collective in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"):
    mine = [comm.selector.choose(collective, n, size, nodes=comm.topology.node_of, transport=comm.transport)
            for n in sizes]
    assert all(theirs == mine for theirs in world.allgather(mine)), f"{collective}: ranks choose differently"
    checks += 1
# Last, as it leaves the communicator failed: the last rank (compiled in every layout the tests
# launch) expects one element more from rank 0 than rank 0 sends, and comes last, so that its
# compiled call finds every peer's round posted and stops at the check. It says so; the others
# learn it from it or find it themselves.
sends = [2] * size
recvs = [2] * size
last = size - 1
if rank == last:
    recvs[0] += 1
    time.sleep(0.05)
try:
    comm.all_to_all(np.zeros(sum(recvs), np.float32), np.ones(sum(sends), np.float32), recvs, sends,
                    algorithm="direct")
    raise AssertionError(f"rank {rank}: a block of another length went unnoticed")
except (ringcomm.MismatchError, ringcomm.PeerAbortedError) as err:
    assert rank != last or "rank 0 sends 2 elements to this rank, which expects 3" in str(err), err
if recorder is not None and rank == last:
    assert recorder.statuses[-1] == 2, f"the compiled call did {recorder.statuses[-1]}, not stopped at the check"
checks += 1
print(f"rank {rank} ok {checks} compiled={window.core is not None}", flush=True)
comm.close()
sys.exit(0)
