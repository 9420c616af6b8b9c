"""Soak through torch.distributed: many random dist.* calls on backend "ringcomm", every result
checked against a reference each rank computes itself.

    mpirun -n N python soak_torch.py COUNT SEED [BACKEND]

BACKEND is "ringcomm" (the default) or "gloo": the same script on torch's own backend shows that
the script's references are right. Every call is drawn from the shared seed: the call (every c10d
collective torch offers a CPU backend, batch_isend_irecv and isend/irecv rings included), the
group (the world, a second group of every rank, even ranks and odd ranks at once, each made with
dist.new_group), dtype, op, root, size (mostly small, up to 1 MiB; even and uneven
all_to_all_single splits, zeros included), async or not (async ones waited up to eight calls
later), and whether its tensors are ones an earlier call used, refilled (now and then the next
few calls repeat one call's arguments, as a training loop does). Inputs are small integers from
(seed, call, global rank), so sums, products of 1s and 2s, min, max and bitwise ops are exact in
every dtype.

A wrong result raises; at the end each rank prints "rank R: COUNT calls checked, 0 wrong".
"""
import collections
import math
import os
import socket
import sys
import warnings
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the torch.distributed backend "ringcomm"
from soak_reference import reduce_rows

total, seed = int(sys.argv[1]), int(sys.argv[2])
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "ringcomm"
if BACKEND == "gloo":
    from mpi4py import MPI  # the rendezvous: rank 0's address for gloo's store
    world_mpi = MPI.COMM_WORLD
    port = None
    if world_mpi.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world_mpi.bcast(port)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(world_mpi.rank),
                      WORLD_SIZE=str(world_mpi.size))
dist.init_process_group(BACKEND, timeout=timedelta(seconds=120))
me, n = dist.get_rank(), dist.get_world_size()
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)
plan = np.random.default_rng(seed)

CALLS = ["all_reduce"] * 3 + ["broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                              "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "gather", "scatter",
                              "barrier", "p2p_ring", "batch_p2p"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]
INTEGER = {torch.int8, torch.uint8, torch.int32, torch.int64}
R = dist.ReduceOp
# GROUPS: name -> members (global ranks, in group rank order: torch sorts them); made on every
# rank, in this order.
MEMBERS = {"world": list(range(n)), "again": list(range(n)),
           "evens": list(range(0, n, 2)), "odds": list(range(1, n, 2))}
GROUPS = {"world": dist.group.WORLD}
for name in ("again", "evens", "odds"):
    GROUPS[name] = dist.new_group(MEMBERS[name]) if MEMBERS[name] else None
PERIOD = 509


def pattern(k, r, dtype, op):
    rng = np.random.default_rng([seed, k, r])
    if dtype == torch.bool:
        return rng.integers(0, 2, PERIOD).astype(np.float64)
    hi = 2 if op == "prod" else 8
    lo = 1 if op == "prod" or dtype == torch.uint8 else -hi
    return rng.integers(lo, hi + 1, PERIOD).astype(np.float64)


def values(k, r, count, dtype, op):
    return np.resize(pattern(k, r, dtype, op), count)


def reduced(k, count, dtype, op, members):
    stack = np.stack([pattern(k, r, dtype, op) for r in members])
    return np.resize(reduce_rows(stack, op, dtype == torch.bool), count)


kept: collections.OrderedDict = collections.OrderedDict()
REUSED = [0, 1, 3, 64, 1000, 4099, 65536, 262144]


def tensor(role, vals, dtype, reuse):
    """``vals`` in a new tensor, or (``reuse``) in the one kept for this role, dtype and count."""
    src = torch.from_numpy(vals).to(dtype)
    if not reuse:
        return src.clone()
    key = (role, dtype, vals.size)
    t = kept.get(key)
    if t is None:
        t = kept[key] = src.clone()
        if len(kept) > 64:
            kept.popitem(last=False)
    else:
        kept.move_to_end(key)
        t.copy_(src)
    return t


def check(got, ref, what):
    got = got.double().numpy()
    if got.shape != ref.shape or not np.array_equal(got, ref):
        bad = np.flatnonzero(got != ref) if got.shape == ref.shape else [0]
        raise AssertionError(f"rank {me}: wrong result for {what}: first at {bad[0] if len(bad) else '?'}: "
                             f"got {got[:8]}, expected {ref[:8]} (sizes {got.size}, {ref.size})")


def draw_count():
    if plan.random() < 0.05:
        return 0
    return int(2 ** (plan.random() ** 2 * math.log2(1 << 18)))


pending = []   # (work or None, [(tensor, reference)], what)
checked = 0
loop, loop_left = None, 0
for k in range(total):
    call = str(plan.choice(CALLS))
    gname = str(plan.choice(["world", "world", "again", "halves"]))
    dtype = DTYPES[int(plan.integers(0, len(DTYPES)))]
    opname = str(plan.choice(["sum", "prod", "min", "max", "band", "bor", "bxor"]))
    if opname in ("band", "bor", "bxor") and dtype not in INTEGER | {torch.bool}:
        opname = "sum"
    async_op = bool(plan.random() < 0.3)
    reuse = bool(plan.random() < 0.4) and not async_op
    drawn = draw_count()
    count = REUSED[int(plan.integers(0, len(REUSED)))] if reuse else drawn
    root_draw = int(plan.integers(0, 1 << 30))
    splits_draw = plan.random((n, n))
    uneven = bool(plan.random() < 0.5)
    # Loops, as training runs them: the next few calls repeat this one's arguments on the same
    # kept tensors with new contents.
    loop_starts, loop_length = plan.random() < 0.15, int(plan.integers(2, 9))
    if loop is not None:
        call, gname, dtype, opname, count, root_draw, splits_draw, uneven = loop
        async_op, reuse, loop_left = False, True, loop_left - 1
        loop = loop if loop_left else None
    elif loop_starts and not async_op:
        reuse, loop_left = True, loop_length
        loop = (call, gname, dtype, opname, count, root_draw, splits_draw, uneven)
    if gname == "halves":
        gname = "evens" if me % 2 == 0 else "odds"
    group, members = GROUPS[gname], MEMBERS[gname]
    m, gr = len(members), members.index(me)
    root = members[root_draw % m]   # a global rank, as torch takes it
    op = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "band": R.BAND, "bor": R.BOR,
          "bxor": R.BXOR}[opname]
    what = f"call {k}: {call} on {gname} {count} x {dtype} {opname} root={root} async={async_op} reuse={reuse}"
    mine = values(k, me, count, dtype, opname)
    expect = []
    work = None
    if call == "all_reduce":
        t = tensor("x", mine, dtype, reuse)
        work = dist.all_reduce(t, op, group=group, async_op=async_op)
        expect = [(t, reduced(k, count, dtype, opname, members))]
    elif call == "broadcast":
        t = tensor("x", mine, dtype, reuse)
        work = dist.broadcast(t, root, group=group, async_op=async_op)
        expect = [(t, values(k, root, count, dtype, opname))]
    elif call == "reduce":
        t = tensor("x", mine, dtype, reuse)
        work = dist.reduce(t, root, op, group=group, async_op=async_op)
        if me == root:
            expect = [(t, reduced(k, count, dtype, opname, members))]
    elif call == "all_gather":
        t = tensor("x", mine, dtype, reuse)
        outs = [torch.zeros(count, dtype=dtype) for _ in range(m)]
        work = dist.all_gather(outs, t, group=group, async_op=async_op)
        expect = [(o, values(k, r, count, dtype, opname)) for o, r in zip(outs, members)] + [(t, mine)]
    elif call == "all_gather_into_tensor":
        t = tensor("x", mine, dtype, reuse)
        out = tensor("out", np.zeros(count * m), dtype, reuse)
        work = dist.all_gather_into_tensor(out, t, group=group, async_op=async_op)
        expect = [(out, np.concatenate([values(k, r, count, dtype, opname) for r in members])), (t, mine)]
    elif call == "reduce_scatter":
        whole = values(k, me, count * m, dtype, opname)
        ins = [torch.from_numpy(whole[j * count:(j + 1) * count]).to(dtype) for j in range(m)]
        out = tensor("out", np.zeros(count), dtype, reuse)
        work = dist.reduce_scatter(out, ins, op, group=group, async_op=async_op)
        expect = [(out, reduced(k, count * m, dtype, opname, members)[gr * count:(gr + 1) * count])]
    elif call == "reduce_scatter_tensor":
        t = tensor("x", values(k, me, count * m, dtype, opname), dtype, reuse)
        out = tensor("out", np.zeros(count), dtype, reuse)
        work = dist.reduce_scatter_tensor(out, t, op, group=group, async_op=async_op)
        expect = [(out, reduced(k, count * m, dtype, opname, members)[gr * count:(gr + 1) * count])]
    elif call == "all_to_all_single":
        block = max(1, count // max(m, 1))
        # matrix[i][j]: what group rank i sends group rank j (uneven: zeros included)
        matrix = [[int(splits_draw[i][j] * (block + 1)) if uneven else block for j in range(m)] for i in range(m)]
        send = sum(matrix[gr])
        t = tensor("x", values(k, me, send, dtype, opname), dtype, reuse and not uneven)
        out = torch.zeros(sum(matrix[i][gr] for i in range(m)), dtype=dtype)
        work = dist.all_to_all_single(out, t, [matrix[i][gr] for i in range(m)] if uneven else None,
                                      matrix[gr] if uneven else None, group=group, async_op=async_op)
        parts = [values(k, r, sum(matrix[i]), dtype, opname)[sum(matrix[i][:gr]):sum(matrix[i][:gr + 1])]
                 for i, r in enumerate(members)]
        expect = [(out, np.concatenate(parts)), (t, values(k, me, send, dtype, opname))]
    elif call == "all_to_all":
        block = max(1, count // max(m, 1))
        whole = values(k, me, block * m, dtype, opname)
        ins = [torch.from_numpy(whole[j * block:(j + 1) * block]).to(dtype) for j in range(m)]
        outs = [torch.zeros(block, dtype=dtype) for _ in range(m)]
        work = dist.all_to_all(outs, ins, group=group, async_op=async_op)
        expect = [(o, values(k, r, block * m, dtype, opname)[gr * block:(gr + 1) * block])
                  for o, r in zip(outs, members)]
    elif call == "gather":
        t = tensor("x", mine, dtype, reuse)
        outs = [torch.zeros(count, dtype=dtype) for _ in range(m)] if me == root else None
        work = dist.gather(t, outs, dst=root, group=group, async_op=async_op)
        if me == root:
            expect = [(o, values(k, r, count, dtype, opname)) for o, r in zip(outs, members)]
    elif call == "scatter":
        out = tensor("out", np.zeros(count), dtype, reuse)
        ins = [torch.from_numpy(values(k, root, count * m, dtype, opname)[j * count:(j + 1) * count]).to(dtype)
               for j in range(m)] if me == root else None
        work = dist.scatter(out, ins, src=root, group=group, async_op=async_op)
        expect = [(out, values(k, root, count * m, dtype, opname)[gr * count:(gr + 1) * count])]
    elif call == "barrier":
        work = dist.barrier(group=group, async_op=async_op)
    elif m > 1:   # point to point on the group's ring (global ranks, as torch takes them)
        right, left = members[(gr + 1) % m], members[(gr - 1) % m]
        t = tensor("x", mine, dtype, reuse)
        out = torch.zeros(count, dtype=dtype)
        tag = int(root_draw % 1000)
        if call == "p2p_ring":
            sent = dist.isend(t, right, group=group, tag=tag)
            got = dist.irecv(out, left, group=group, tag=tag)
            works = [sent, got]
        else:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, right, group, tag),
                                            dist.P2POp(dist.irecv, out, left, group, tag)])
        for w in works:
            w.wait()
        expect = [(out, values(k, left, count, dtype, opname)), (t, mine)]
    pending.append((work if async_op else None, expect, what))
    if not async_op or len(pending) > 8 or k == total - 1:
        for work_, expect_, what_ in pending:
            if work_ is not None:
                work_.wait()
            for got, ref in expect_:
                check(got, ref, what_)
            checked += 1
        pending.clear()
dist.barrier()
print(f"rank {me}: {checked} calls checked, 0 wrong ({BACKEND})", flush=True)
if BACKEND == "gloo":
    # torch's gloo, run only to prove the references, once died at interpreter exit with
    # "terminate called without an active exception" after every check had passed: its exit is
    # not what this soak tests.
    sys.stderr.flush()
    os._exit(0)
dist.destroy_process_group()
