"""Collectives interleaved across communicators: random calls on the world, on splits (by parity,
reversed, nested) and on a dup, even and uneven, blocking and async with their waits taken in
random order, on fresh buffers and on buffers used again (the memo road, persistent.py), forced
algorithms or the selector's, and sends between them. Every result is checked exactly.

    mpirun -n N python interleaved.py CALLS SEED [nodes]

``nodes``: ranks pretend to sit on two nodes (even ranks on one, odd on the other), set before
ringcomm starts. The soak (soak.py) hammers one communicator with every algorithm and size; this
job is about what several communicators, outstanding Works and reused buffers do to each other.
Every rank draws the same call sequence from the seed, and inputs from (seed, call, rank), so
each computes the exact reference of every rank's result itself: sums, products of 1s and 2s,
min, max and the bitwise ops are exact in every dtype; avg is checked to rounding. A forced
algorithm a communicator refuses on every rank (a UsageError before any message) is skipped.
Prints "interleaved: CALLS calls checked, W wrong" on rank 0; exits 1 if any was wrong.
"""
import os
import sys

CALLS, SEED = int(sys.argv[1]), int(sys.argv[2])
if "nodes" in sys.argv[3:]:
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{int(os.environ.get('PMI_RANK', 0)) % 2}"

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ringcomm  # noqa: E402
from ringcomm import algorithms  # noqa: E402

world = ringcomm.init()
RANK, SIZE = world.rank, world.size
parity = world.split(RANK % 2)
COMMS = [(world, list(range(SIZE))),
         (parity, [r for r in range(SIZE) if r % 2 == RANK % 2]),
         (world.split(0, key=-RANK), list(range(SIZE - 1, -1, -1))),
         (world.dup(), list(range(SIZE))),
         (parity.split(0).dup(), [r for r in range(SIZE) if r % 2 == RANK % 2])]
DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8")
OPS = {"f": ("sum", "min", "max", "prod", "avg"), "i": ("sum", "min", "max", "prod", "band", "bor", "bxor")}
COUNTS = (0, 1, 2, 3, 5, 7, 16, 100, 1023, 4099, 65537, 300001)
CALLS_OF = ("all_reduce", "all_reduce_out", "reduce", "broadcast", "all_gather", "all_gather_v", "reduce_scatter",
            "reduce_scatter_v", "all_to_all", "all_to_all_v", "gather", "scatter", "send_recv", "barrier")
# raised alike on every member, before any message: skipped
REFUSALS = ("uneven counts", "offers no window", "cannot read peers", "does not support dtype")
kept: dict = {}   # buffers used again by later calls of the same shape: the memo road


def values(call, rank, dtype, count, op):
    g = np.random.default_rng((SEED, call, rank))
    if op == "prod":
        v = g.choice([1, 1, 1, 2], count)
    elif op in ("band", "bor", "bxor"):
        v = g.integers(0, 120, count)
    else:
        v = g.integers(-20 if np.dtype(dtype).kind != "u" else 0, 50, count)
    return v.astype(dtype)


def reduced(arrays, op, dtype):
    a = np.stack(arrays)
    if op == "avg":
        return (a.astype(np.float64).sum(0) / len(arrays)).astype(dtype)
    if op in ("band", "bor", "bxor"):
        return {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op].reduce(a, 0)
    return {"sum": lambda: a.sum(0, dtype=dtype), "prod": lambda: a.prod(0, dtype=dtype),
            "min": lambda: a.min(0), "max": lambda: a.max(0)}[op]()


def buffer(name, count, dtype, fresh):
    if fresh:
        return np.empty(count, dtype)
    return kept.setdefault((name, count, dtype), np.empty(count, dtype))


def splits(g, n):
    s = [int(v) for v in g.integers(0, 40, n)]
    s[int(g.integers(0, n))] = 0   # a rank that contributes nothing
    return s


def issue(call, g, comm, members, pending):
    """Issue one random call; returns (Work or None, result array or None, expected, label)."""
    n, me = len(members), members.index(RANK)
    what = CALLS_OF[int(g.integers(0, len(CALLS_OF)))]
    dtype = DTYPES[int(g.integers(0, len(DTYPES)))]
    kind = "f" if np.dtype(dtype).kind == "f" else "i"
    op = OPS[kind][int(g.integers(0, len(OPS[kind])))]
    count = COUNTS[int(g.integers(0, len(COUNTS)))]
    if dtype == "float16":   # exact integers only up to 2048
        op, count = ("sum" if op in ("prod", "avg") else op), min(count, 1023)
    async_op = bool(g.random() < 0.3)
    fresh = bool(g.random() < 0.5) or async_op or bool(pending)   # a kept buffer is never in flight twice
    root = int(g.integers(0, n))
    collective = "send" if what == "send_recv" else what.removesuffix("_out").removesuffix("_v")
    forced = None
    if g.random() < 0.3 and what != "send_recv" and getattr(world, "backend", "ringcomm") == "ringcomm":
        names = algorithms.names(collective)
        forced = names[int(g.integers(0, len(names)))]
    kw = {"async_op": async_op} if forced is None else {"async_op": async_op, "algorithm": forced}
    label = f"call {call} on {members}: {what} {count} x {dtype} {op} root {root} algorithm {forced} async {async_op}"
    mine = [values(call, r, dtype, count, op) for r in members]
    if what in ("all_reduce", "all_reduce_out", "reduce", "broadcast"):
        x = buffer(what, count, dtype, fresh)
        x[:] = mine[me]
        out = buffer(what + "-out", count, dtype, fresh) if what == "all_reduce_out" else None
        if what == "broadcast":
            return comm.broadcast(x, root, **kw), x, mine[root], label
        if what == "reduce":
            return comm.reduce(x, root, op, **kw), x, reduced(mine, op, dtype) if me == root else mine[me], label
        return comm.all_reduce(x, op, out=out, **kw), x if out is None else out, reduced(mine, op, dtype), label
    if what in ("all_gather", "gather"):
        x = buffer(what, count, dtype, fresh)
        x[:] = mine[me]
        out = buffer(what + "-out", count * n, dtype, fresh) if what == "all_gather" or me == root else None
        work = comm.all_gather(out, x, **kw) if what == "all_gather" else comm.gather(out, x, root, **kw)
        return work, out, None if out is None else np.concatenate(mine), label
    if what == "all_gather_v":
        c = splits(g, n)
        parts = [values(call, r, dtype, c[i], op) for i, r in enumerate(members)]
        out = np.empty(sum(c), dtype)
        return comm.all_gather(out, parts[me].copy(), counts=c, **kw), out, np.concatenate(parts), label
    if what in ("reduce_scatter", "all_to_all", "scatter"):
        whole = [values(call, r, dtype, count * n, op) for r in members]
        x = None if what == "scatter" and me != root else buffer(what, count * n, dtype, fresh)
        if x is not None:
            x[:] = whole[me]
        block = slice(me * count, (me + 1) * count)
        if what == "reduce_scatter":
            out = buffer(what + "-out", count, dtype, fresh)
            return comm.reduce_scatter(out, x, op, **kw), out, reduced(whole, op, dtype)[block], label
        if what == "scatter":
            out = buffer(what + "-out", count, dtype, fresh)
            return comm.scatter(out, x, root, **kw), out, whole[root][block], label
        out = buffer(what + "-out", count * n, dtype, fresh)
        return comm.all_to_all(out, x, **kw), out, np.concatenate([w[block] for w in whole]), label
    if what == "reduce_scatter_v":
        c = splits(g, n)
        whole = [values(call, r, dtype, sum(c), op) for r in members]
        out, at = np.empty(c[me], dtype), sum(c[:me])
        return (comm.reduce_scatter(out, whole[me].copy(), op, counts=c, **kw), out,
                reduced(whole, op, dtype)[at:at + c[me]], label)
    if what == "all_to_all_v":
        table = [splits(np.random.default_rng((SEED, call, i)), n) for i in range(n)]   # table[i][j]: i to j
        sent = [values(call, r, dtype, sum(table[i]), op) for i, r in enumerate(members)]
        into = [table[i][me] for i in range(n)]
        out = np.empty(sum(into), dtype)
        expect = np.concatenate([sent[i][sum(table[i][:me]):sum(table[i][:me]) + into[i]] for i in range(n)])
        return comm.all_to_all(out, sent[me].copy(), out_splits=into, in_splits=table[me], **kw), out, expect, label
    if what == "send_recv":
        if n == 1:
            return None, None, None, label
        tag = int(g.integers(0, 5))
        pending.append((comm.send(mine[me].copy(), (me + 1) % n, tag, async_op=True), None, None, label + " (send)"))
        out = np.empty(count, dtype)
        return comm.recv(out, (me - 1) % n, tag, async_op=async_op), out, mine[(me - 1) % n], label
    return comm.barrier(**kw), None, None, label


def check(work, out, expect, label) -> bool:
    if work is not None and hasattr(work, "wait"):
        work.wait()
    if expect is None:
        return True
    if " avg " in label:
        return out.shape == expect.shape and np.allclose(out.astype(np.float64), expect, rtol=2e-3, atol=1e-2)
    return out.shape == expect.shape and out.tobytes() == expect.astype(out.dtype).tobytes()


wrong = 0
pending: list = []
for call in range(CALLS):
    g = np.random.default_rng((SEED, call, 1 << 20))   # the same on every rank
    comm, members = COMMS[int(g.integers(0, len(COMMS)))]
    try:
        work, out, expect, label = issue(call, g, comm, members, pending)
    except ringcomm.UsageError as err:
        if any(words in str(err) for words in REFUSALS):
            continue
        raise
    pending.append((work if isinstance(work, ringcomm.Work) else None, out, expect, label))
    keep = int(g.integers(0, 4))   # up to three calls left outstanding, then waited in random order
    while len(pending) > keep:
        work, out, expect, label = pending.pop(int(g.integers(0, len(pending))))
        if not check(work, out, expect, label):
            wrong += 1
            print(f"rank {RANK}: WRONG {label}", flush=True)
for work, out, expect, label in pending:
    wrong += not check(work, out, expect, label)
wrong = MPI.COMM_WORLD.allreduce(wrong)
if RANK == 0:
    print(f"interleaved: {CALLS} calls checked, {wrong} wrong", flush=True)
sys.exit(1 if wrong else 0)
