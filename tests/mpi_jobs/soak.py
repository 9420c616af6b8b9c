"""Soak: many random collectives, every result checked, bitwise equality across ranks.

    mpirun -n N python soak.py COUNT SEED [MAX_BYTES]

Every call is drawn from the shared seed (identical on every rank): the collective (all of them,
barrier included), the algorithm (``ringcomm.algorithms.names(collective, comm.transport)`` or
the selector's choice), dtype (numpy, or torch for float16/bfloat16), op, root, size (skewed
towards small, up to MAX_BYTES, default 64 MiB), whether it runs async, and whether its input
lives in an array from ``comm.transport.allocate``. Inputs are small integers drawn from the
seed, call number and rank (repeating with a prime period, so a reference costs one pass), and
every rank computes the exact reference for every result itself (sums, products of 1s and 2s,
min and max are exact in every dtype; avg is checked to rounding).
Results of all_reduce, broadcast and all_gather must also be bitwise identical on every rank:
each rank keeps a crc32 per call and the ranks compare them every 100 calls.

A wrong result raises (shm_guard then ends the job); at the end each rank prints
"rank R: COUNT collectives checked, 0 wrong, ..." with the time taken.
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import math
import sys
import time
import zlib

import numpy as np
import torch
from mpi4py import MPI

import ringcomm
from ringcomm import algorithms

total, seed = int(sys.argv[1]), int(sys.argv[2])
max_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 64 << 20
comm = ringcomm.init()
n, me = comm.size, comm.rank
world = MPI.COMM_WORLD
plan = np.random.default_rng(seed)
COLLECTIVES = ["all_reduce"] * 4 + ["broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"]
DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "uint8": 1}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
SAME_EVERYWHERE = ("all_reduce", "broadcast", "all_gather")
ARENA_BYTES = 1 << 20
allocate = getattr(comm.transport, "allocate", None) or (lambda nbytes: np.zeros(nbytes, np.uint8))
arenas = [allocate(ARENA_BYTES) for _ in range(2)]   # inputs that peers read in place


def draw_bytes() -> int:
    """Skewed towards small: 2**(u**3 * log2(max)) bytes, and now and then nothing at all."""
    if plan.random() < 0.03:
        return 0
    return int(2 ** (plan.random() ** 3 * math.log2(max_bytes)))


PERIOD = 1021   # inputs repeat with this (prime) period: each call's reference costs one pass


def pattern(k: int, r: int, dtype: str, op: str) -> np.ndarray:
    """One period of rank r's input of call k: small integers as float64."""
    hi = 2 if op == "prod" else (8 if dtype in ("uint8", "float16", "bfloat16") else 100)
    lo = 1 if op == "prod" or dtype == "uint8" else -hi
    return np.random.default_rng([seed, k, r]).integers(lo, hi + 1, PERIOD).astype(np.float64)


def values(k: int, r: int, count: int, dtype: str, op: str) -> np.ndarray:
    """Rank r's input of call k."""
    return np.resize(pattern(k, r, dtype, op), count)


def as_input(vals: np.ndarray, dtype: str, use_torch: bool, arena):
    if dtype in TORCH and (use_torch or dtype == "bfloat16"):
        return torch.from_numpy(vals).to(TORCH[dtype])
    if arena is not None:
        x = arena[:vals.size * DTYPES[dtype]].view(dtype)
        x[...] = vals
        return x
    return vals.astype(dtype)


def as64(x) -> np.ndarray:
    return x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)


def reduce_ref(k: int, count: int, dtype: str, op: str) -> np.ndarray:
    """Every rank's input of call k reduced with ``op``, computed on one period, then tiled."""
    stack = np.stack([pattern(k, r, dtype, op) for r in range(n)])
    one = {"sum": stack.sum(0), "avg": stack.sum(0) / n, "prod": stack.prod(0),
           "min": stack.min(0), "max": stack.max(0)}[op]
    return np.resize(one, count)


def check(got, ref: np.ndarray, op: str, what: str) -> None:
    got = as64(got)
    ok = np.allclose(got, ref, rtol=1e-2, atol=1e-2) if op == "avg" else np.array_equal(got, ref)
    if not ok:
        bad = np.flatnonzero(~np.isclose(got, ref, rtol=1e-2, atol=1e-2) if op == "avg" else got != ref)
        raise AssertionError(f"rank {me}: wrong result for {what}: {bad.size} elements, first at "
                             f"{bad[0]}: got {got[bad[0]]}, expected {ref[bad[0]]}")


def digest(x) -> int:
    if isinstance(x, torch.Tensor):
        x = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        x = x.numpy()
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8))


pending, digests, moved, checked = [], [], 0, 0
start = time.monotonic()
for k in range(total):
    collective = str(plan.choice(COLLECTIVES))
    dtype = str(plan.choice(list(DTYPES)))
    ops = ["sum", "prod", "min", "max"] + (["avg"] if dtype.startswith(("float", "bfloat")) else [])
    op = str(plan.choice(ops))
    algorithm = plan.choice(algorithms.names(collective, comm.transport) + [None])
    algorithm = None if algorithm is None else str(algorithm)
    root = int(plan.integers(0, n))
    async_op = bool(plan.random() < 0.3)
    use_torch = bool(plan.random() < 0.5)
    per = draw_bytes() // DTYPES[dtype]
    count = per // n if collective == "all_gather" else per
    in_count = count * n if collective == "reduce_scatter" else count
    in_arena = plan.random() < 0.3 and not async_op and in_count * DTYPES[dtype] <= ARENA_BYTES
    arena = arenas[k % 2] if in_arena else None
    what = (f"call {k}: {collective} {in_count} x {dtype} {op} algorithm={algorithm} root={root} "
            f"async={async_op} torch={use_torch} arena={arena is not None}")
    if collective == "barrier":
        result, ref = comm.barrier(algorithm=algorithm, async_op=async_op), None
    else:
        x = as_input(values(k, me, in_count, dtype, op), dtype, use_torch, arena)
        moved += in_count * DTYPES[dtype]
        if collective == "all_reduce":
            result = comm.all_reduce(x, op=op, algorithm=algorithm, async_op=async_op)
            ref = reduce_ref(k, count, dtype, op)
        elif collective == "broadcast":
            result = comm.broadcast(x, root=root, algorithm=algorithm, async_op=async_op)
            ref = values(k, root, count, dtype, op)
        elif collective == "reduce":
            result = comm.reduce(x, root=root, op=op, algorithm=algorithm, async_op=async_op)
            ref = reduce_ref(k, count, dtype, op) if me == root else values(k, me, count, dtype, op)
        elif collective == "all_gather":
            out = as_input(np.zeros(count * n), dtype, use_torch, None)
            result = comm.all_gather(out, x, algorithm=algorithm, async_op=async_op)
            ref = np.concatenate([values(k, r, count, dtype, op) for r in range(n)])
        else:
            out = as_input(np.zeros(count), dtype, use_torch, None)
            result = comm.reduce_scatter(out, x, op=op, algorithm=algorithm, async_op=async_op)
            ref = reduce_ref(k, in_count, dtype, op)[me * count:(me + 1) * count]
    pending.append((k, collective, result, ref, op, what, async_op))
    if not async_op or len(pending) > 8 or k == total - 1:
        for k_, coll_, res_, ref_, op_, what_, async_ in pending:
            got = res_.wait(timeout=120) if async_ else res_
            if ref_ is not None:
                check(got, ref_, op_, what_)
                if coll_ in SAME_EVERYWHERE:
                    digests.append((k_, digest(got)))
            checked += 1
        pending.clear()
    if len(digests) >= 100 or k == total - 1:
        every = world.allgather(digests)
        for calls in zip(*every):
            if len({d for _, d in calls}) != 1:
                raise AssertionError(f"rank {me}: call {calls[0][0]}: results differ across ranks "
                                     f"(crc32 per rank {[hex(d) for _, d in calls]})")
        digests = []
    if me == 0 and (k + 1) % 1000 == 0:
        print(f"soak: {k + 1} collectives, {time.monotonic() - start:.0f} s", flush=True)
comm.barrier()
print(f"rank {me}: {checked} collectives checked, 0 wrong, {moved / 2**30:.2f} GiB in, "
      f"{time.monotonic() - start:.1f} s", flush=True)
