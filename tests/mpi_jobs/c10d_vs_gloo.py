"""Every c10d collective on "ringcomm" against torch's gloo on the same inputs, through dist.*.

    torchrun --nproc_per_node=N c10d_vs_gloo.py        (or)   mpirun -n N python c10d_vs_gloo.py

Plain ``import ringcomm`` then ``dist.init_process_group("ringcomm")``: the launcher decides how
the ranks meet (torchrun's store, or MPI). A gloo group over the same ranks runs each call too;
results must be equal bit for bit (inputs are small integers, exact in every dtype). Prints
"check NAME ok" per check on every rank; a wrong result prints "check NAME FAILED" and the job
exits non-zero. At 4 ranks it adds a 2-D DeviceMesh whose two dimensions run at once.
"""
import sys
import threading
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the torch.distributed backend "ringcomm"

dist.init_process_group("ringcomm", timeout=timedelta(seconds=60))
RANK, SIZE = dist.get_rank(), dist.get_world_size()
warnings.filterwarnings("ignore", category=FutureWarning)   # torch deprecating the names tested here
warnings.filterwarnings("ignore", message="Sparse invariant")
GLOO = dist.new_group(backend="gloo")
RING = dist.group.WORLD
failed = []

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
BITWISE = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]


def data(n, dtype, salt=0, rank=RANK):
    base = (torch.arange(n) * 7 + rank * 3 + salt) % 5 + 1
    return base.to(dtype) if dtype != torch.bool else (base % 2).bool()


def check(name, fn, expect=None):
    """fn(group) -> list of tensors (or objects); equal on ringcomm and on gloo, bitwise. Where
    gloo refuses the call (uneven sizes, int16), ``expect()`` computes the result locally instead
    (every rank's input is a function of its rank)."""
    try:
        ours, theirs = fn(RING), (fn(GLOO) if expect is None else expect())
        same = len(ours) == len(theirs) and all(
            (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype == torch.bool
                                                                        else a, b))
            if isinstance(a, torch.Tensor) else a == b for a, b in zip(ours, theirs))
        if not same:
            raise AssertionError(f"ringcomm {ours} != gloo {theirs}")
        print(f"check {name} ok", flush=True)
    except Exception as err:   # noqa: BLE001 - reported, and the job fails at the end
        failed.append(name)
        print(f"check {name} FAILED on rank {RANK}: {type(err).__name__}: {err}", flush=True)


def all_reduce(dtype, op):
    def run(group):
        t = data(5, dtype)
        dist.all_reduce(t, op=op, group=group)
        return [t]
    return run


for dtype in DTYPES:
    for op in OPS + (BITWISE if not dtype.is_floating_point else []):
        check(f"all_reduce {dtype} {op.name}", all_reduce(dtype, op))
check("all_reduce bool max", all_reduce(torch.bool, dist.ReduceOp.MAX))


def avg(group):
    t = data(6, torch.float32) * SIZE
    if group is GLOO:   # gloo has no AVG: its sum, divided
        dist.all_reduce(t, group=group)
        return [t / SIZE]
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
    return [t]


def premul(group):
    t = data(6, torch.float64)
    if group is GLOO:
        t *= 2.0
        dist.all_reduce(t, group=group)
        return [t]
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0), group=group)
    return [t]


def async_and_timeout(group):
    works = [dist.all_reduce(t, group=group, async_op=True) for t in (data(9, torch.float32, s) for s in range(4))]
    futures = [w.get_future() for w in works]
    return [f.wait()[0] for f in futures]


def broadcast(group):
    out = [torch.complex(data(4, torch.float32), data(4, torch.float32, 1)), data(7, torch.bool)]
    for t in out:
        dist.broadcast(t, src=SIZE - 1, group=group)
    return out


def reduce(group):
    t = data(8, torch.int64)
    dist.reduce(t, dst=1 % SIZE, op=dist.ReduceOp.MAX, group=group)
    return [t] if RANK == 1 % SIZE else []


def all_gather_uneven(group):
    outs = [torch.zeros(r + 2, 3, dtype=torch.float16) for r in range(SIZE)]
    dist.all_gather(outs, data(3 * (RANK + 2), torch.float16).view(RANK + 2, 3), group=group)
    return outs


def all_gather_uneven_expected():
    return [data(3 * (r + 2), torch.float16, rank=r).view(r + 2, 3) for r in range(SIZE)]


def all_gather_into_tensor(group):
    out = torch.zeros(SIZE * 6, dtype=torch.int32)
    dist.all_gather_into_tensor(out, data(6, torch.int32), group=group)
    return [out]


def all_gather_coalesced(group):
    ins = [data(3, torch.float32), data(5, torch.float32, 2)]
    outs = [[torch.zeros(3), torch.zeros(5)] for _ in range(SIZE)]
    dist.all_gather_coalesced(outs, ins, group=group)
    return [t for row in outs for t in row]


def reduce_scatter_uneven(group):
    ins = [data(r + 1, torch.float64, r) for r in range(SIZE)]
    out = torch.zeros(RANK + 1, dtype=torch.float64)
    dist.reduce_scatter(out, ins, group=group)
    return [out]


def reduce_scatter_tensor(group):
    out = torch.zeros(4, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, data(4 * SIZE, torch.int64), op=dist.ReduceOp.MIN, group=group)
    return [out]


def all_to_all_uneven(group):
    ins = [data(RANK + j + 1, torch.float32, j) for j in range(SIZE)]
    outs = [torch.zeros(r + RANK + 1) for r in range(SIZE)]
    dist.all_to_all(outs, ins, group=group)
    return outs


def all_to_all_uneven_expected():
    return [data(r + RANK + 1, torch.float32, RANK, rank=r) for r in range(SIZE)]


def all_to_all_single_uneven(group):
    in_splits = [RANK + j for j in range(SIZE)]
    out_splits = [r + RANK for r in range(SIZE)]
    x = data(2 * sum(in_splits), torch.int16).view(-1, 2)
    out = torch.zeros(sum(out_splits), 2, dtype=torch.int16)
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return [out]


def all_to_all_single_expected():
    """Rank r's rows for this rank: block RANK of its input, split by its in_splits."""
    parts = []
    for r in range(SIZE):
        splits = [r + j for j in range(SIZE)]
        rows = data(2 * sum(splits), torch.int16, rank=r).view(-1, 2)
        parts.append(rows[sum(splits[:RANK]):sum(splits[:RANK + 1])])
    return [torch.cat(parts)]


def gather(group):
    outs = [torch.zeros(5, dtype=torch.uint8) for _ in range(SIZE)] if RANK == 0 else None
    dist.gather(data(5, torch.uint8), outs, dst=0, group=group)
    return outs or []


def scatter(group):
    ins = [data(4, torch.float32, r) for r in range(SIZE)] if RANK == SIZE - 1 else None
    out = torch.zeros(4)
    dist.scatter(out, ins, src=SIZE - 1, group=group)
    return [out]


def send_recv_tags(group):
    """Two tags out of order: the receive of tag 2 is posted first and must get tag 2's data."""
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    a, b = torch.zeros(3), torch.zeros(4)
    works = [dist.irecv(b, prv, group=group, tag=2), dist.irecv(a, prv, group=group, tag=1),
             dist.isend(data(3, torch.float32, 1), nxt, group=group, tag=1),
             dist.isend(data(4, torch.float32, 2), nxt, group=group, tag=2)]
    for w in works:
        w.wait()
    return [a, b]


def large_send_recv(group):
    """6 MiB: more than a shared-memory pool share (4 MiB), so the payload goes beside the pool,
    over MPI under mpirun and over gloo point-to-point on the store under torchrun."""
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    out = torch.zeros(3 << 19, dtype=torch.float32)
    works = [dist.irecv(out, prv, group=group), dist.isend(data(3 << 19, torch.float32, 4), nxt, group=group)]
    for w in works:
        w.wait()
    return [out]


def recv_anysource(group):
    """Ends with a barrier: a rank that went on to batch_isend_irecv sent rank 0 a message under
    the same tag, which rank 0's last receive from any rank took on gloo (48 bytes into 8)."""
    got = []
    if RANK == 0:
        for _ in range(SIZE - 1):
            t = torch.zeros(2)
            src = dist.recv(t, group=group)
            got.append((src, t.tolist()))
    else:
        dist.send(data(2, torch.float32, 5), 0, group=group)
    dist.barrier(group=group)
    return sorted(got)


def batch_isend_irecv(group):
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    out = torch.zeros(6, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, data(6, torch.int64, 3), nxt, group), dist.P2POp(dist.irecv, out, prv, group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return [out]


def coalescing_manager(group):
    ts = [data(3, torch.float32, i) for i in range(3)]
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, group=group)
    cm.wait()
    return ts


def all_reduce_coalesced(group):
    ts = [data(4, torch.float64, i) for i in range(3)]
    dist.all_reduce_coalesced(ts, group=group)
    return ts


def objects(group):
    objs = [{"rank": RANK}, "x" * RANK] if RANK == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0, group=group)
    gathered = [None] * SIZE
    dist.all_gather_object(gathered, ("r", RANK), group=group)
    return objs + gathered


def sparse(group):
    i = torch.tensor([[RANK, 0], [1, RANK]])
    t = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (4, 4))
    dist.all_reduce(t, group=group)
    return [t.to_dense()]


def barrier(group):
    dist.barrier(group=group)
    return []


EXPECTED = {"all_gather uneven": all_gather_uneven_expected, "all_to_all uneven": all_to_all_uneven_expected,
            "all_to_all_single uneven": all_to_all_single_expected}
for name, fn in [("all_reduce avg", avg), ("all_reduce premul_sum", premul), ("async futures", async_and_timeout),
                 ("broadcast complex bool", broadcast), ("reduce", reduce), ("all_gather uneven", all_gather_uneven),
                 ("all_gather_into_tensor", all_gather_into_tensor), ("all_gather_coalesced", all_gather_coalesced),
                 ("reduce_scatter uneven", reduce_scatter_uneven), ("reduce_scatter_tensor", reduce_scatter_tensor),
                 ("all_to_all uneven", all_to_all_uneven), ("all_to_all_single uneven", all_to_all_single_uneven),
                 ("gather", gather), ("scatter", scatter), ("send_recv tags", send_recv_tags),
                 ("large send_recv", large_send_recv), ("recv anysource", recv_anysource), ("batch_isend_irecv", batch_isend_irecv),
                 ("coalescing_manager", coalescing_manager), ("all_reduce_coalesced", all_reduce_coalesced),
                 ("objects", objects), ("sparse all_reduce", sparse), ("barrier", barrier)]:
    check(name, fn, EXPECTED.get(name))


def profiler_ranges():
    """Each collective shows in torch.profiler as "ringcomm:<name>", as gloo's show as "gloo:<name>"."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for group in (RING, GLOO):
            t = data(4, torch.float32)
            dist.all_reduce(t, group=group)
            dist.all_gather_into_tensor(torch.zeros(4 * SIZE), t, group=group)
            dist.barrier(group=group)
    names = {e.key for e in prof.key_averages()}
    want = {"ringcomm:all_reduce", "ringcomm:all_gather_into_tensor", "ringcomm:barrier"}
    if not want <= names or "gloo:all_reduce" not in names:
        failed.append("profiler ranges")
        print(f"check profiler ranges FAILED on rank {RANK}: missing {sorted(want - names)} in "
              f"{sorted(n for n in names if ':' in n)}", flush=True)
    else:
        print("check profiler ranges ok", flush=True)


profiler_ranges()


# ---- sub-groups: made by their members, running at once with the world and with each other ----
def subgroup_checks():
    evens = [r for r in range(SIZE) if r % 2 == 0]
    pairs = [[r, r + 1] for r in range(0, SIZE - 1, 2)]
    ring_evens, gloo_evens = dist.new_group(evens), dist.new_group(evens, backend="gloo")
    ring_tail, gloo_tail = dist.new_group([SIZE - 1, 0]), dist.new_group([SIZE - 1, 0], backend="gloo")
    mine_ring, _ = dist.new_subgroups_by_enumeration(pairs) if pairs else (None, None)
    mine_gloo, _ = dist.new_subgroups_by_enumeration(pairs, backend="gloo") if pairs else (None, None)
    pair = {RING: mine_ring, GLOO: mine_gloo}
    evens_of = {RING: ring_evens, GLOO: gloo_evens}
    tail_of = {RING: ring_tail, GLOO: gloo_tail}

    def concurrent(group):
        """One async all-reduce on each group this rank is in, and the world's, all in flight at once."""
        calls = []
        for sub, salt in ((group, 0), (evens_of[group], 1), (tail_of[group], 2), (pair[group], 3)):
            if sub is not None and RANK in dist.get_process_group_ranks(sub):
                t = data(1000, torch.float32, salt)
                calls.append((t, dist.all_reduce(t, group=sub, async_op=True)))
        for _, w in calls:
            w.wait()
        return [t for t, _ in calls]
    check("sub-groups concurrent", concurrent)

    def from_threads(group):
        """Each sub-group driven by a thread of its own while the main thread uses the world."""
        results, errors = {}, []

        def run(key, sub):
            try:
                for i in range(5):
                    t = data(50, torch.float64, i)
                    dist.all_reduce(t, group=sub)
                    results[(key, i)] = t
            except Exception as err:   # noqa: BLE001
                errors.append(err)
        threads = [threading.Thread(target=run, args=(k, s)) for k, s in (("evens", evens_of[group]),
                                                                          ("pair", pair[group]))
                   if s is not None and RANK in dist.get_process_group_ranks(s)]
        for th in threads:
            th.start()
        t = data(10, torch.float32)
        dist.all_reduce(t, group=group)
        for th in threads:
            th.join(60)
        if errors:
            raise errors[0]
        return [t] + [results[k] for k in sorted(results)]
    check("sub-groups from threads", from_threads)

    if RANK in evens:
        def sub_collectives(group):
            g = evens_of[group]
            n = len(evens)
            outs = [torch.zeros(3) for _ in range(n)]
            dist.all_gather(outs, data(3, torch.float32), group=g)
            x = torch.zeros(2, dtype=torch.int64)
            dist.broadcast(x if RANK != evens[-1] else data(2, torch.int64), src=evens[-1], group=g)
            return outs + [x]
        print(f"on evens {evens}", flush=True)
        check("sub-group collectives", sub_collectives)


subgroup_checks()

if hasattr(dist, "split_group") and SIZE >= 2:
    def split(group):
        halves = [[r for r in range(SIZE) if r < SIZE // 2], [r for r in range(SIZE) if r >= SIZE // 2]]
        t = data(7, torch.float32)
        if group is RING:
            # dist.split_group refuses before any backend on a CPU build of torch ("No device
            # associated with the default pg"): ProcessGroup.split_group is the backend's part.
            pg = dist.distributed_c10d._get_default_group()
            sub = pg.split_group(next(h for h in halves if RANK in h), group_name=f"halves{SIZE}")
            sub.allreduce([t]).wait()
        else:
            sub, _ = dist.new_subgroups_by_enumeration(halves, backend="gloo")
            dist.all_reduce(t, group=sub)
        return [t]
    check("split_group", split)

if SIZE == 4:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    def mesh_dims(group):
        if group is GLOO:   # gloo's groups of the same shapes
            dp_ranks = [[0, 2], [1, 3]]
            tp_ranks = [[0, 1], [2, 3]]
            dp, _ = dist.new_subgroups_by_enumeration(dp_ranks, backend="gloo")
            tp, _ = dist.new_subgroups_by_enumeration(tp_ranks, backend="gloo")
        else:
            dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
        a, b = data(300, torch.float32, 1), data(300, torch.float32, 2)
        works = [dist.all_reduce(a, group=dp, async_op=True), dist.all_reduce(b, group=tp, async_op=True)]
        for w in works:
            w.wait()
        return [a, b]
    check("device mesh 2-D", mesh_dims)

dist.barrier()
dist.destroy_process_group()
print(f"rank {RANK} done, {len(failed)} failed", flush=True)
sys.exit(1 if failed else 0)
