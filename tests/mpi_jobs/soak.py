"""Soak: thousands of random collectives (size, op, dtype, algorithm, sync/async), every result
checked against a float64 reference that each rank recomputes from the shared seed.

    mpirun -n N python soak.py COUNT SEED
"""
import sys
import time

import numpy as np
import torch

import ringcomm
from ringcomm import algorithms

total, seed = int(sys.argv[1]), int(sys.argv[2])
comm = ringcomm.init()
n, me = comm.size, comm.rank
plan = np.random.default_rng(seed)     # identical on every rank: the sequence of calls
DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16", "uint8"]
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-5, "float64": 1e-12}


def make(values, dtype):
    if dtype in TORCH:
        return torch.tensor(values).to(TORCH[dtype])
    return values.astype(dtype)


def as64(x):
    return x.double().numpy() if isinstance(x, torch.Tensor) else x.astype(np.float64)


def inputs(k, count, dtype, op):
    """Every rank's input for call k: small integers, so sums and products are exact in every dtype."""
    rng = np.random.default_rng([seed, k])
    hi = 2 if op == "prod" else (8 if dtype in ("uint8", "float16", "bfloat16") else 100)
    lo = 1 if op == "prod" or dtype == "uint8" else -hi
    return [rng.integers(lo, hi + 1, count).astype(np.float64) for _ in range(n)]


def reduce_ref(per_rank, op):
    stack = np.stack(per_rank)
    return {"sum": stack.sum(0), "avg": stack.sum(0) / n, "prod": stack.prod(0),
            "min": stack.min(0), "max": stack.max(0)}[op]


def check(got, ref, dtype, what):
    got = as64(got)
    if dtype in TOL:
        ok = np.allclose(got, ref, rtol=TOL[dtype], atol=TOL[dtype])
    else:
        ok = np.array_equal(got, ref.astype(dtype).astype(np.float64))
    assert ok, f"rank {me}: wrong result for {what}"


pending = []
start = time.monotonic()
for k in range(total):
    collective = plan.choice(["all_reduce", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"])
    dtype = str(plan.choice(DTYPES))
    op = str(plan.choice(["sum", "prod", "min", "max"] + (["avg"] if dtype.startswith(("float", "bfloat")) else [])))
    count = int(plan.choice([0, 1, n - 1, 7, 61, 1000, 4099]))
    algorithm = plan.choice(algorithms.names(collective, comm.transport) + [None])
    root = int(plan.integers(0, n))
    async_op = bool(plan.random() < 0.3)
    what = f"call {k}: {collective} {count} x {dtype} {op} {algorithm} root={root} async={async_op}"
    if collective in ("all_gather", "reduce_scatter"):
        per_rank = inputs(k, count * (n if collective == "reduce_scatter" else 1), dtype, op)
    else:
        per_rank = inputs(k, count, dtype, op)
    x = make(per_rank[me], dtype)
    if collective == "all_reduce":
        result = comm.all_reduce(x, op=op, algorithm=algorithm, async_op=async_op)
        ref = reduce_ref(per_rank, op)
    elif collective == "broadcast":
        result = comm.broadcast(x, root=root, algorithm=algorithm, async_op=async_op)
        ref = per_rank[root]
    elif collective == "reduce":
        result = comm.reduce(x, root=root, op=op, algorithm=algorithm, async_op=async_op)
        ref = reduce_ref(per_rank, op) if me == root else per_rank[me]
    elif collective == "all_gather":
        out = make(np.zeros(count * n), dtype)
        result = comm.all_gather(out, x, algorithm=algorithm, async_op=async_op)
        ref = np.concatenate(per_rank)
    else:
        out = make(np.zeros(count), dtype)
        result = comm.reduce_scatter(out, x, op=op, algorithm=algorithm, async_op=async_op)
        ref = reduce_ref(per_rank, op)[me * count:(me + 1) * count]
    if async_op:
        pending.append((result, ref, dtype, what))
    else:
        check(result, ref, dtype, what)
    if len(pending) > 8 or k == total - 1:
        for work, ref_, dtype_, what_ in pending:
            check(work.wait(timeout=60), ref_, dtype_, what_)
        pending.clear()
comm.barrier()
print(f"rank {me}: {total} collectives checked in {time.monotonic() - start:.1f}s", flush=True)
