"""Soak: many random calls, every result checked, bitwise equality across ranks.

    mpirun -n N python soak.py COUNT SEED [MAX_BYTES]

Every call is drawn from the shared seed (identical on every rank): the collective (every one,
barrier and a send/recv ring included), the communicator it runs on (the world, a dup, halves by
parity, the world in reverse order, each rank alone, a half reversed again: a split of a split;
ranks in different groups run their call at the same time on sibling communicators), the
algorithm (``ringcomm.algorithms.names(collective, comm.transport)`` or the selector's choice),
dtype (numpy or torch, every dtype the library takes), op (bitwise ops and premul_sum where the
dtype allows them), root, size (skewed towards small, up to MAX_BYTES, default 64 MiB), even or
uneven counts (all_gather, reduce_scatter, all_to_all; zeros included: a rank contributing
nothing), in or out of place (all_reduce, reduce), whether it runs async, whether its input lives
in an array from ``comm.transport.allocate``, and whether its buffers are ones an earlier call
used (the same objects, refilled: the remembered fast roads run then; a torch tensor among them
is sometimes resized and so moved to new memory, which those roads must notice).

Inputs are small integers drawn from the seed, call number and world rank (repeating with a prime
period, so a reference costs one pass), and every rank computes the exact reference for every
result itself (sums, products of 1s and 2s, min, max, bitwise ops and premul_sum by 2, 1/2 or -1
are exact in every dtype; avg is checked to rounding). Inputs an out-of-place call must not
change are checked too. Results every rank of a group holds (all_reduce, broadcast, all_gather)
must also be bitwise identical across the group: each rank keeps a crc32 per call and the ranks
compare them every 100 calls.

A wrong result raises (shm_guard then ends the job); at the end each rank prints
"rank R: COUNT collectives checked, 0 wrong, ..." with the time taken.
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import collections
import math
import sys
import time
import zlib

import numpy as np
import torch
from mpi4py import MPI

import ringcomm
from ringcomm import algorithms
from soak_reference import reduce_rows

total, seed = int(sys.argv[1]), int(sys.argv[2])
max_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 64 << 20
comm = ringcomm.init()
n, me = comm.size, comm.rank
world = MPI.COMM_WORLD
plan = np.random.default_rng(seed)
COLLECTIVES = (["all_reduce"] * 4 + ["broadcast", "reduce", "all_gather", "reduce_scatter", "barrier",
                                     "all_to_all", "gather", "scatter", "sendrecv"])
DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "uint8": 1,
          "int8": 1, "int16": 2, "bool": 1}
TORCH = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64,
         "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8, "int8": torch.int8,
         "int16": torch.int16, "bool": torch.bool}
FLOAT = ("float32", "float64", "float16", "bfloat16")
SAME_EVERYWHERE = ("all_reduce", "broadcast", "all_gather")
ARENA_BYTES = 1 << 20
allocate = getattr(comm.transport, "allocate", None) or (lambda nbytes: np.zeros(nbytes, np.uint8))
arenas = [allocate(ARENA_BYTES) for _ in range(2)]   # inputs that peers read in place

# The communicators, each with its members (world ranks in its rank order), made once.
halves = comm.split(me % 2, me)
COMMS = {
    "world": (comm, list(range(n))),
    "dup": (comm.dup(), list(range(n))),
    "halves": (halves, [r for r in range(n) if r % 2 == me % 2]),
    "reversed": (comm.split(0, n - me), list(reversed(range(n)))),
    "alone": (comm.split(me), [me]),
    "halves reversed": (halves.split(7, -halves.rank), [r for r in reversed(range(n)) if r % 2 == me % 2]),
}
SHAPES = list(COMMS)
SHAPE_WEIGHTS = np.array([5, 1, 1, 1, 1, 1]) / 10
for shape, (c, members) in COMMS.items():
    assert c.size == len(members) and members[c.rank] == me, (shape, c.size, c.rank, members)


def draw_bytes() -> int:
    """Skewed towards small: 2**(u**3 * log2(max)) bytes, and now and then nothing at all."""
    if plan.random() < 0.03:
        return 0
    return int(2 ** (plan.random() ** 3 * math.log2(max_bytes)))


def draw_op(dtype: str):
    """(what the call is passed, its name, premul_sum's factor or None)."""
    if dtype == "bool":
        names = ["sum", "prod", "min", "max", "band", "bor", "bxor"]
    elif dtype in FLOAT:
        names = ["sum", "prod", "min", "max", "avg", "premul_sum"]
    else:
        names = ["sum", "prod", "min", "max", "band", "bor", "bxor"]
    name = str(plan.choice(names))
    factor = float(plan.choice([2.0, 0.5, -1.0]))   # drawn always: the plan stays in step
    if name == "premul_sum":
        return ringcomm.premul_sum(factor), name, factor
    return name, name, None


PERIOD = 1021   # inputs repeat with this (prime) period: each call's reference costs one pass


def pattern(k: int, r: int, dtype: str, op: str) -> np.ndarray:
    """One period of world rank r's input of call k: small integers as float64."""
    if dtype == "bool":
        return np.random.default_rng([seed, k, r]).integers(0, 2, PERIOD).astype(np.float64)
    hi = 2 if op == "prod" else (8 if dtype in ("uint8", "int8", "float16", "bfloat16") else 100)
    lo = 1 if op == "prod" or dtype == "uint8" else -hi
    return np.random.default_rng([seed, k, r]).integers(lo, hi + 1, PERIOD).astype(np.float64)


def values(k: int, r: int, count: int, dtype: str, op: str) -> np.ndarray:
    """World rank r's input of call k."""
    return np.resize(pattern(k, r, dtype, op), count)


def reduce_ref(k: int, count: int, dtype: str, op: str, group: list, factor) -> np.ndarray:
    """The group's inputs of call k reduced with ``op``, computed on one period, then tiled."""
    stack = np.stack([pattern(k, r, dtype, op) for r in group])
    return np.resize(reduce_rows(stack, op, dtype == "bool", factor), count)


def fresh(vals: np.ndarray, dtype: str, use_torch: bool, arena=None):
    """A new buffer holding ``vals`` (torch: torch's own memory, which resize_ may move)."""
    if use_torch or dtype == "bfloat16":
        t = torch.empty(vals.size, dtype=TORCH[dtype])
        t.copy_(torch.from_numpy(vals))
        return t
    if arena is not None:
        x = arena[:vals.size * DTYPES[dtype]].view(dtype)
        x[...] = vals
        return x
    return vals.astype(dtype)


# Buffers earlier calls used, by (role, dtype, count, torch), refilled and passed again; the
# least recently used go once they hold more than KEPT_BYTES. A call that reuses takes its count
# from REUSED_BYTES, so that counts come again.
kept: collections.OrderedDict = collections.OrderedDict()
KEPT_BYTES = 48 << 20
REUSED_BYTES = [0, 4, 100, 1024, 4096 + 8, 65536, 262144 - 24, 1 << 20, 4 << 20]
resized = 0


def buffer(role: str, vals: np.ndarray, dtype: str, use_torch: bool, reuse: bool, move: bool, arena=None):
    """``vals`` in a fresh buffer, or (``reuse``) in the one kept for this role, dtype and count,
    refilled in place; ``move``: a kept torch tensor is resized away and back first, which gives
    it new memory under the same object."""
    global resized
    if not reuse or arena is not None:
        return fresh(vals, dtype, use_torch, arena)
    key = (role, dtype, vals.size, use_torch or dtype == "bfloat16")
    buf = kept.get(key)
    if buf is None:
        buf = kept[key] = fresh(vals, dtype, use_torch)
        while sum(nbytes(b) for b in kept.values()) > KEPT_BYTES:
            kept.popitem(last=False)
        return buf
    kept.move_to_end(key)
    if isinstance(buf, torch.Tensor):
        if move:
            before = buf.data_ptr()
            buf.resize_(vals.size + 1 + (4 << 20) // buf.element_size())
            buf.resize_(vals.size)
            resized += buf.data_ptr() != before
        buf.copy_(torch.from_numpy(vals))
    else:
        buf[...] = vals
    return buf


def nbytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else x.nbytes


def as64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):   # a copy: Tensor.numpy() would pin a kept tensor's storage for good
        return x.double().clone().numpy()
    return np.asarray(x, np.float64)


# avg's error bound: an average of half floats scales each input by 1/n first (ringcomm/core/ops.py),
# inexact unless n is a power of two, and each of the n - 1 sums rounds to half an ulp of inputs
# up to 8 (bfloat16's ulp there is 1/16, float16's 1/128).
AVG_ATOL = {"bfloat16": 1 / 8, "float16": 1 / 64}


def check(got, ref: np.ndarray, op: str, what: str, dtype: str = "") -> None:
    got = as64(got)
    atol = AVG_ATOL.get(dtype, 1e-2)
    ok = np.allclose(got, ref, rtol=1e-2, atol=atol) if op == "avg" else np.array_equal(got, ref)
    if not ok:
        bad = np.flatnonzero(~np.isclose(got, ref, rtol=1e-2, atol=atol) if op == "avg" else got != ref)
        bad = bad if bad.size else np.array([0])
        raise AssertionError(f"rank {me}: wrong result for {what}: {bad.size} elements, first at "
                             f"{bad[0]}: got {got[bad[0]] if got.size else got}, expected "
                             f"{ref[bad[0]] if ref.size else ref} (sizes {got.size}, {ref.size})")


def digest(x) -> int:
    if isinstance(x, torch.Tensor):
        x = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        x = x.clone().numpy()
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8))


def split_counts(total_: int, parts: int) -> list:
    """``total_`` elements cut at random places into ``parts`` counts (zeros likely)."""
    cuts = np.sort(plan.integers(0, total_ + 1, max(parts - 1, 0)))
    return np.diff(np.concatenate([[0], cuts, [total_]])).astype(int).tolist()


pending, digests, moved, checked = [], [], 0, 0
loop, loop_left = None, 0
start = time.monotonic()
for k in range(total):
    collective = str(plan.choice(COLLECTIVES))
    shape = str(plan.choice(SHAPES, p=SHAPE_WEIGHTS))
    c, group = COMMS[shape]
    m, sr = len(group), group.index(me)
    dtype = str(plan.choice(list(DTYPES)))
    if comm.backend == "gloo" and dtype == "int16":   # torch's gloo refuses it (backends/gloo.py)
        dtype = "int32"
    op_arg, op, factor = draw_op(dtype)
    names = algorithms.names(collective, comm.transport) if collective != "sendrecv" else []
    algorithm = plan.choice(names + [None])
    if comm.backend != "ringcomm":   # a reference backend runs its library's own algorithms
        algorithm = None
    # Drawn from the world's list on every rank (the plan stays in step); a group without a
    # window slot of its own offers fewer, and runs the selector's choice instead.
    if algorithm is not None and str(algorithm) not in algorithms.names(collective, c.transport):
        algorithm = None
    algorithm = None if algorithm is None else str(algorithm)
    uneven = bool(plan.random() < 0.4)
    if algorithm is not None and uneven and getattr(algorithms.get(collective, algorithm), "even_only", False):
        algorithm = None   # it refuses uneven counts (a UsageError before anything moves)
    root_draw = int(plan.integers(0, 1 << 30))
    root = root_draw % m
    async_op = bool(plan.random() < 0.3)
    use_torch = bool(plan.random() < 0.5)
    reuse = bool(plan.random() < 0.4) and not async_op   # an async call's buffers stay its own
    move = bool(plan.random() < 0.1)
    out_of_place = bool(plan.random() < 0.3)
    drawn = draw_bytes()
    menu = REUSED_BYTES[int(plan.integers(0, len(REUSED_BYTES)))]
    per = (min(menu, max_bytes) if reuse else drawn) // DTYPES[dtype]
    # Per-world-rank counts (uneven all_gather, reduce_scatter) and a world matrix of all_to_all
    # block counts, drawn whole on every rank: each group takes its own rows.
    world_counts = split_counts(per, n)
    block = max(1, per // (n * n))
    matrix = plan.integers(0, block + 1, (n, n)) * (plan.random((n, n)) < 0.85)
    tag = int(plan.integers(0, 1 << 20))
    in_arena_draw = plan.random() < 0.3
    # Loops, as training runs them: now and then the next few calls repeat one call's arguments
    # on the same (kept) buffers with new contents, which is when the remembered roads run.
    loop_starts, loop_length = plan.random() < 0.15, int(plan.integers(2, 9))
    if loop is not None:
        (collective, shape, c, group, m, sr, dtype, op_arg, op, factor, algorithm, uneven, root, use_torch,
         out_of_place, per, world_counts, block, matrix, tag) = loop
        async_op, reuse, loop_left = False, True, loop_left - 1
        loop = loop if loop_left else None
    elif loop_starts and not async_op:
        reuse, loop_left = True, loop_length
        loop = (collective, shape, c, group, m, sr, dtype, op_arg, op, factor, algorithm, uneven, root, use_torch,
                out_of_place, per, world_counts, block, matrix, tag)
    what = (f"call {k}: {collective} on {shape} ({m} ranks) {per} x {dtype} {op} algorithm={algorithm} "
            f"root={root} async={async_op} torch={use_torch} reuse={reuse} out_of_place={out_of_place} "
            f"uneven={uneven}")
    untouched = []   # (buffer, its values): inputs the call must leave as they were
    ref = None
    if collective == "barrier" or (collective == "sendrecv" and m == 1):   # no sends to oneself (as torch)
        result = c.barrier(algorithm=algorithm if collective == "barrier" else None, async_op=async_op)
        collective = "barrier"
    elif collective == "sendrecv":
        x = buffer("x", values(k, me, per, dtype, op), dtype, use_torch, reuse, move)
        out = buffer("out", np.zeros(per), dtype, use_torch, reuse, move)
        sent = c.send(x, (sr + 1) % m, tag, async_op=True)
        got = c.recv(out, (sr - 1) % m, tag, async_op=async_op)
        result = (got, sent) if async_op else out
        if not async_op:
            sent.wait(timeout=120)
        ref = values(k, group[(sr - 1) % m], per, dtype, op)
        untouched.append((x, values(k, me, per, dtype, op)))
        moved += per * DTYPES[dtype]
    else:
        if collective in ("all_reduce", "broadcast", "reduce", "gather", "scatter"):
            count = per // m if collective in ("gather", "scatter") else per
            in_count = count * m if collective == "scatter" else count
        elif collective == "all_gather":
            counts = [world_counts[w] for w in group] if uneven else [per // m] * m
            in_count = counts[sr]
        elif collective == "reduce_scatter":
            counts = [world_counts[w] for w in group] if uneven else [per // m] * m
            in_count = sum(counts)
        else:   # all_to_all
            if uneven:
                in_splits = [int(matrix[me][j]) for j in group]
                out_splits = [int(matrix[i][me]) for i in group]
            else:
                in_splits = out_splits = [block] * m
            in_count = sum(in_splits)
        in_arena = in_arena_draw and not async_op and in_count * DTYPES[dtype] <= ARENA_BYTES
        arena = arenas[k % 2] if in_arena else None
        mine = values(k, me, in_count, dtype, op)
        x = buffer("x", mine, dtype, use_torch, reuse, move, arena)
        moved += in_count * DTYPES[dtype]
        if collective == "all_reduce":
            out = buffer("out", np.zeros(count), dtype, use_torch, reuse, move) if out_of_place else None
            result = c.all_reduce(x, op=op_arg, out=out, algorithm=algorithm, async_op=async_op)
            ref = reduce_ref(k, count, dtype, op, group, factor)
            if out is not None:
                untouched.append((x, mine))
        elif collective == "broadcast":
            result = c.broadcast(x, root=root, algorithm=algorithm, async_op=async_op)
            ref = values(k, group[root], count, dtype, op)
        elif collective == "reduce":
            out = buffer("out", np.zeros(count), dtype, use_torch, reuse, move) if out_of_place and sr == root \
                else None   # only the root takes an out
            result = c.reduce(x, root=root, op=op_arg, out=out, algorithm=algorithm, async_op=async_op)
            if sr == root:
                ref = reduce_ref(k, count, dtype, op, group, factor)
            if out is not None or sr != root:
                untouched.append((x, mine))
        elif collective == "all_gather":
            out = buffer("out", np.zeros(sum(counts)), dtype, use_torch, reuse, move)
            result = c.all_gather(out, x, counts=counts if uneven else None, algorithm=algorithm,
                                  async_op=async_op)
            ref = np.concatenate([values(k, w, cnt, dtype, op) for w, cnt in zip(group, counts)])
            untouched.append((x, mine))
        elif collective == "reduce_scatter":
            out = buffer("out", np.zeros(counts[sr]), dtype, use_torch, reuse, move)
            result = c.reduce_scatter(out, x, op=op_arg, counts=counts if uneven else None,
                                      algorithm=algorithm, async_op=async_op)
            first = sum(counts[:sr])
            ref = reduce_ref(k, in_count, dtype, op, group, factor)[first:first + counts[sr]]
            untouched.append((x, mine))
        elif collective == "all_to_all":
            out = buffer("out", np.zeros(sum(out_splits)), dtype, use_torch, reuse, move)
            result = c.all_to_all(out, x, out_splits if uneven else None, in_splits if uneven else None,
                                  algorithm=algorithm, async_op=async_op)
            parts = []
            for i, w in enumerate(group):   # rank w's block for this rank: after its blocks for ranks before
                theirs = [int(matrix[w][j]) for j in group] if uneven else [block] * m
                start_ = sum(theirs[:sr])
                parts.append(values(k, w, sum(theirs), dtype, op)[start_:start_ + theirs[sr]])
            ref = np.concatenate(parts)
            untouched.append((x, mine))
        elif collective == "gather":
            out = buffer("out", np.zeros(count * m), dtype, use_torch, reuse, move) if sr == root else None
            result = c.gather(out, x, root=root, algorithm=algorithm, async_op=async_op)
            if sr == root:
                ref = np.concatenate([values(k, w, count, dtype, op) for w in group])
            untouched.append((x, mine))
        else:   # scatter: root's x, a block per rank
            if sr != root:
                x = None
                mine = values(k, group[root], count * m, dtype, op)
            out = buffer("out", np.zeros(count), dtype, use_torch, reuse, move)
            result = c.scatter(out, x, root=root, algorithm=algorithm, async_op=async_op)
            ref = mine[sr * count:(sr + 1) * count]
            if x is not None:
                untouched.append((x, mine))
    pending.append((k, collective, shape, result, ref, op, what, async_op, untouched, dtype))
    if not async_op or len(pending) > 8 or k == total - 1:
        for k_, coll_, shape_, res_, ref_, op_, what_, async_, untouched_, dtype_ in pending:
            if coll_ == "sendrecv" and async_:
                got_work, sent_work = res_
                got = got_work.wait(timeout=120)
                sent_work.wait(timeout=120)
            else:
                got = res_.wait(timeout=120) if async_ else res_
            if ref_ is not None:
                check(got, ref_, op_, what_, dtype_)
                if coll_ in SAME_EVERYWHERE:
                    digests.append((k_, COMMS[shape_][1], digest(got)))
            for buf, vals in untouched_:
                check(buf, vals, "sum", what_ + " (an input it must not change)")
            checked += 1
        pending.clear()
    if len(digests) >= 100 or k == total - 1:
        every = world.allgather(digests)
        for calls in zip(*every):
            for group_ in {tuple(g) for _, g, _ in calls}:
                crcs = {calls[r][2] for r in group_}
                if len(crcs) != 1:
                    raise AssertionError(f"rank {me}: call {calls[0][0]}: results differ across ranks "
                                         f"{list(group_)} (crc32 per rank {[hex(calls[r][2]) for r in group_]})")
        digests = []
    if me == 0 and (k + 1) % 1000 == 0:
        print(f"soak: {k + 1} collectives, {time.monotonic() - start:.0f} s", flush=True)
comm.barrier()
print(f"rank {me}: {checked} collectives checked, 0 wrong, {moved / 2**30:.2f} GiB in, "
      f"{resized} tensors moved under a kept road, {time.monotonic() - start:.1f} s", flush=True)
