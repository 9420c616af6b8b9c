"""The checks gpu_check.py runs on every rank of its mpirun job (what each means: gpu_check_lib.RANK_CHECKS).

Each check raises on failure (AssertionError with what differed), Skip where this machine cannot
run it, Environment where CUDA IPC itself does not work; it returns a one-line detail.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from gpu_check_lib import Environment, Skip

FACTOR = 0.375   # premul_sum's factor: exact in every float dtype
HOST_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
FLOATS = ("float16", "bfloat16", "float32", "float64")
BIG = 262147     # > 1 MiB of float32 (several schedule segments), prime


# ---- inputs ------------------------------------------------------------------------------------
def ops_for(dtype: str) -> list:
    if dtype in FLOATS:
        return ["sum", "avg", "prod", "min", "max", "premul_sum"]
    return ["sum", "prod", "min", "max", "band", "bor", "bxor"]


def values(dtype: str, op: str, rank: int, count: int, seed: int) -> np.ndarray:
    """Rank's input (float64 values; ``as_dtype`` rounds them)."""
    rng = np.random.default_rng([seed, rank, count, len(dtype), len(op)])
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.float64)
    if dtype in FLOATS:
        return rng.uniform(0.8, 1.25, count) if op == "prod" else rng.standard_normal(count)
    if op == "prod":
        return rng.integers(1, 4, count).astype(np.float64)
    info = np.iinfo(dtype)
    wide = op in ("band", "bor", "bxor")
    return rng.integers(info.min if wide else max(info.min, -100), info.max if wide else min(info.max, 100),
                        count, endpoint=True).astype(np.float64)


class Arrays:
    """Makes a case's arrays on the host path or the device path: numpy/cupy, or for bf16 torch
    CPU/CUDA tensors (cupy has no bf16, so that dtype needs a CUDA build of torch)."""

    def __init__(self, ctx, dtype: str, device: bool):
        self.ctx, self.dtype, self.device = ctx, dtype, device

    def of(self, v: np.ndarray):
        if self.dtype == "bfloat16":
            torch = self.ctx.torch
            t = torch.tensor(v, dtype=torch.float64).to(torch.bfloat16)
            return t.cuda() if self.device else t
        host = v.astype(self.dtype)
        return self.ctx.on_device(host) if self.device else host

    def zeros(self, n: int):
        return self.of(np.zeros(n))

    def raw(self, a) -> bytes:
        if a is None:
            return b""
        if self.dtype == "bfloat16":
            return a.cpu().view(self.ctx.torch.int16).numpy().tobytes()
        return a.get().tobytes() if self.device else a.tobytes()


def _op(op: str):
    import ringcomm
    return ringcomm.premul_sum(FACTOR) if op == "premul_sum" else op


# ---- one case of each collective: the arrays whose bytes must match between the two paths ------
# (the first is the result; all_reduce, broadcast and all_gather give every rank the same one)
def _run(comm, make: Arrays, name: str, algorithm, op: str, count: int, seed: int) -> list:
    r, n = comm.rank, comm.size
    v = lambda c, s=0: make.of(values(make.dtype, op, r, c, seed + s))   # noqa: E731
    root = seed % n
    if name == "all_reduce":
        x = v(count)
        out = make.zeros(count) if seed % 2 else None
        comm.all_reduce(x, _op(op), out=out, algorithm=algorithm)
        return [x] if out is None else [out, x]   # the result first; an out-of-place call keeps x
    if name == "reduce":
        x = v(count)
        out = make.zeros(count) if seed % 2 and r == root else None
        comm.reduce(x, root, _op(op), out=out, algorithm=algorithm)
        return [x, out]
    if name == "broadcast":
        x = v(count)
        comm.broadcast(x, root, algorithm=algorithm)
        return [x]
    if name == "all_gather":
        out = make.zeros(n * count)
        comm.all_gather(out, v(count), algorithm=algorithm)
        return [out]
    if name == "reduce_scatter":
        out = make.zeros(count)
        comm.reduce_scatter(out, v(n * count), _op(op), algorithm=algorithm)
        return [out]
    if name == "all_to_all":
        out = make.zeros(n * count)
        comm.all_to_all(out, v(n * count), algorithm=algorithm)
        return [out]
    if name == "gather":
        out = make.zeros(n * count) if r == root else None
        comm.gather(out, v(count), root, algorithm=algorithm)
        return [out]
    if name == "scatter":
        out = make.zeros(count)
        comm.scatter(out, v(n * count) if r == root else None, root, algorithm=algorithm)
        return [out]
    if name == "send_recv":
        if n == 1:
            return []
        x, out = v(count), make.zeros(count)
        work = comm.send(x, (r + 1) % n, tag=seed % 1000, async_op=True)
        comm.recv(out, (r - 1) % n, tag=seed % 1000)
        work.wait(60)
        return [out]
    raise ValueError(name)


def _cases(ctx, comm):
    """(collective, algorithm, dtype, op, count) of the grid: every collective x algorithm x
    dtype at 0, 1 and 13 elements (every op at 13 on the first algorithm of a collective, one op
    on the others), and > 1 MiB of float32 (several schedule segments) for every algorithm."""
    from ringcomm import algorithms
    dtypes = HOST_DTYPES + (("bfloat16",) if ctx.torch is not None else ())
    reduces = ("all_reduce", "reduce", "reduce_scatter")
    for name in algorithms.COLLECTIVES + ("send_recv",):
        if name == "barrier":
            continue
        names = [None] if name == "send_recv" else \
            [a for a in algorithms.names(name) if not algorithms.is_window(name, a)]
        for i, algorithm in enumerate(names):
            for dtype in dtypes:
                ops = ops_for(dtype) if name in reduces else ["sum"]
                for count in (0, 1, 13):
                    for op in (ops if count == 13 and i == 0 else ops[(i + count) % len(ops):][:1]):
                        yield name, algorithm, dtype, op, count
            split = name in ("all_to_all", "reduce_scatter", "all_gather", "gather", "scatter")
            yield name, algorithm, "float32", "sum", BIG // ctx.size if split else BIG


def check_grid(ctx) -> str:
    comm = ctx.comm
    checked, digest = 0, 0
    for seed, (name, algorithm, dtype, op, count) in enumerate(_cases(ctx, comm)):
        host = _run(comm, Arrays(ctx, dtype, False), name, algorithm, op, count, seed)
        dev_make = Arrays(ctx, dtype, True)
        device = _run(comm, dev_make, name, algorithm, op, count, seed)
        for i, (h, d) in enumerate(zip(host, device)):
            hb = Arrays(ctx, dtype, False).raw(h)
            db = dev_make.raw(d)
            assert hb == db, (f"{name}({algorithm}) {count} x {dtype} op {op}: the device result differs from "
                              f"the host path's ({_first_difference(hb, db)})")
            if i == 0 and name in ("all_reduce", "broadcast", "all_gather"):
                digest = zlib.crc32(db, digest)
        checked += 1
    comm.barrier()
    every = ctx.world.allgather(digest)
    assert len(set(every)) == 1, f"ranks' device results differ in their bits (crc32 per rank: {every})"
    bf16 = "" if ctx.torch is not None else "; bfloat16 not compared (cupy has no bf16: it needs torch CUDA tensors)"
    return f"{checked} cases, each bitwise equal to the host path's, on {ctx.size} ranks{bf16}"


def _first_difference(a: bytes, b: bytes) -> str:
    if len(a) != len(b):
        return f"{len(a)} bytes against {len(b)}"
    i = next(i for i in range(len(a)) if a[i] != b[i])
    return f"first at byte {i} of {len(a)}"


# ---- the device route ------------------------------------------------------------------------
def check_device_only(ctx) -> str:
    comm, cp = ctx.comm, ctx.cupy
    if ctx.size == 1:
        raise Skip("one rank: nothing travels")
    n = 18 << 20   # 72 MiB of float32: every all_reduce algorithm's messages, in several 16 MiB segments
    x = ctx.on_device(np.full(n, ctx.rank + 1.0, np.float32))
    comm.all_reduce(x, algorithm="ring")   # sets CUDA IPC up
    before = comm.transport.carried()
    if ctx.stand_in:
        cp.stand_in.reset_host_copies()
    from ringcomm import algorithms
    ran = [a for a in algorithms.names("all_reduce") if not algorithms.is_window("all_reduce", a)]
    for algorithm in ran:
        comm.all_reduce(x, op="avg", algorithm=algorithm)
    copies = cp.stand_in.host_copies() if ctx.stand_in else None
    after = comm.transport.carried()
    expected = ctx.size * (ctx.size + 1) / 2   # the sum, then averages of equal values
    assert bool((x == expected).all()), f"x holds {float(x[0])}, expected {expected}"
    routes = comm.transport.describe(device="cuda")
    assert set(routes.values()) == {"cuda_ipc"}, f"device routes {routes}"
    device, host = after["device"] - before["device"], after["host"] - before["host"]
    assert device > 0 and host == 0, f"received {device} bytes from peers' device memory and {host} through host"
    detail = (f"{len(ran)} algorithms x {x.nbytes >> 20} MiB: {device >> 20} MiB read from peers' device memory, 0 through "
              f"host; routes {routes}")
    if copies is not None:
        assert copies["to_host_calls"] == copies["to_device_calls"] == 0, f"host copies: {copies}"
        detail += "; stand-in host copies: 0"
    return detail


def check_async(ctx) -> str:
    comm = ctx.comm
    n, total = ctx.size, ctx.size * (ctx.size + 1) / 2
    sizes = (1, 1000, 300_007, 17, 65_536)
    xs = [ctx.on_device(np.full(s, (ctx.rank + 1.0) * (i + 1), np.float32)) for i, s in enumerate(sizes)]
    b = ctx.on_device(np.full(4096, float(ctx.rank), np.float64))
    g_in, g_out = ctx.on_device(np.full(777, ctx.rank, np.int32)), ctx.cupy.zeros(777 * n, np.int32)
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    works.append(comm.broadcast(b, root=n - 1, async_op=True))
    works.append(comm.all_gather(g_out, g_in, async_op=True))
    for w in reversed(works):   # waited out of issue order: each completes in issue order anyway
        w.wait(60)
    for i, x in enumerate(xs):
        assert bool((x == total * (i + 1)).all()), f"async all_reduce {i}: {float(x[0])} != {total * (i + 1)}"
    assert bool((b == n - 1).all()), "async broadcast"
    assert g_out.get().tolist() == [r for r in range(n) for _ in range(777)], "async all_gather"
    return f"{len(works)} collectives in flight on the progress thread (device {ctx.device}), waited in reverse"


def check_split(ctx) -> str:
    comm, n = ctx.comm, ctx.size
    half = comm.split(ctx.rank % 2)
    dup = comm.dup()
    mine = [r for r in range(n) if r % 2 == ctx.rank % 2]
    x, y, z = (ctx.on_device(np.full(70_001, ctx.rank + 1.0, np.float32)) for _ in range(3))
    work = dup.all_reduce(y, async_op=True)   # in flight on the dup while the others run
    half.all_reduce(x)
    comm.all_reduce(z)
    work.wait(60)
    assert bool((x == sum(r + 1 for r in mine)).all()), f"half {mine}: {float(x[0])}"
    assert bool((y == n * (n + 1) / 2).all()) and bool((z == n * (n + 1) / 2).all()), "dup or parent"
    routes = half.transport.describe(device="cuda")
    half.close()
    dup.close()
    return f"half of ranks {mine} (device routes {routes}), a dup with a call in flight, the parent"


def check_streams(ctx) -> str:
    comm, cp = ctx.comm, ctx.cupy
    side, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    total = ctx.size * (ctx.size + 1) / 2
    n = 1 << 20
    with side:
        busy = cp.ones(1 << 22, cp.float32)   # keeps a GPU's side stream busy: a collective not ordered
        for _ in range(8):                    # after it would read x before the fill below
            busy *= 1.0
        x = cp.empty(n, cp.float32)
        x.fill(ctx.rank + 1)
        work = comm.all_reduce(x, async_op=True)
        y = cp.empty(n, cp.float32)
        y.fill(ctx.rank + 1)
        comm.all_reduce(y)                    # synchronous, from the side stream
    work.wait(60)
    with other:                               # results read on another stream
        ok_x, ok_y = bool((x == total).all()), bool((y == total).all())
    assert ok_x and ok_y, f"on another stream after the call: x {float(x[0])}, y {float(y[0])}, expected {total}"
    detail = "cupy side stream (async and sync), results read on another stream"
    torch = ctx.torch
    if torch is not None:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.empty(n, device="cuda")
            t.fill_(ctx.rank + 1)
            comm.all_reduce(t)
        assert bool((t == total).all()), "torch side stream"
        detail += "; torch side stream"
    return detail


# ---- memory --------------------------------------------------------------------------------
def _used(ctx) -> int:
    """Device memory in use (device-wide on a GPU: every rank measures between barriers)."""
    cp = ctx.cupy
    if not ctx.stand_in:   # cupy's pool keeps freed blocks; the stand-in frees them at once
        cp.get_default_memory_pool().free_all_blocks()
    ctx.world.Barrier()
    free, total = cp.cuda.runtime.memGetInfo()
    ctx.world.Barrier()
    return total - free


def check_memory(ctx) -> str:
    if ctx.size == 1:
        raise Skip("one rank: no CUDA IPC transport")
    ctx.close()   # the other checks' communicator and its device memory: gone before the baseline
    warm = ctx.fresh()   # kernels loaded, so that the baseline holds what they cost
    x = ctx.on_device(np.ones(1 << 16, np.float32))
    warm.all_reduce(x)
    warm.close()
    del x
    base = _used(ctx)
    comm = ctx.fresh()
    n = 20 << 20   # 80 MiB: more than one pool share (64 MiB)
    x = ctx.on_device(np.full(n, ctx.rank + 1.0, np.float32))
    comm.all_reduce(x, algorithm="ring")
    device = comm.transport._device
    pool = device.pool_share * len(device.others)
    p2p = ctx.on_device(np.full(n, float(ctx.rank), np.float32))   # one message larger than a share
    assert p2p.nbytes > device.pool_share, f"the send ({p2p.nbytes} B) fits a pool share ({device.pool_share} B)"
    got = ctx.cupy.zeros(n, np.float32)
    work = comm.send(p2p, (ctx.rank + 1) % ctx.size, async_op=True)
    comm.recv(got, (ctx.rank - 1) % ctx.size)
    work.wait(60)
    assert bool((got == (ctx.rank - 1) % ctx.size).all()), "80 MiB send/recv"
    assert bool((x == ctx.size * (ctx.size + 1) / 2).all()), "80 MiB all_reduce"
    carried = comm.transport.carried()
    during = _used(ctx)
    comm.close()
    del x, p2p, got
    after = _used(ctx)
    slack = 0 if ctx.stand_in else 8 << 20
    assert after <= base + slack, (f"device memory in use: {base >> 20} MiB before, {during >> 20} MiB with the "
                                   f"transport, {after >> 20} MiB after close")
    detail = (f"pool {pool >> 20} MiB per rank; a {n * 4 >> 20} MiB send bounced through host ({carried['host'] >> 20} MiB); "
              f"in use {base >> 20} -> {during >> 20} -> {after >> 20} MiB after close")
    if ctx.stand_in:
        left = ctx.cupy.stand_in.live_allocations("malloc") + ctx.cupy.stand_in.live_allocations("ipc")
        assert not left, f"left after close: {left}"
        detail += "; stand-in: no malloc or IPC mapping left"
    return detail


# ---- refusals --------------------------------------------------------------------------------
def _refused(call, *needles) -> str:
    import ringcomm
    try:
        call()
    except ringcomm.UsageError as err:
        text = str(err)
        missing = [n for n in needles if n not in text]
        assert not missing, f"the refusal does not say {missing}: {text}"
        return text
    raise AssertionError("accepted")


def check_p2p_first(ctx) -> str:
    """The CUDA IPC transport is set up by a handshake of every rank of the node, so only a
    collective (which every rank joins) may create it; a send before it exists bounces through
    host memory (transport/routed.py). One rank sends, one receives, the rest do neither: a
    handshake started by the send would wait for ranks that never come."""
    if ctx.size == 1:
        raise Skip("one rank: nobody to send to")
    import ringcomm
    comm = ringcomm.init(timeout=30)
    n = 1 << 20   # 4 MiB: a host send this large is read in place, a device one is not
    x = ctx.on_device(np.full(n, 7.0, np.float32))
    got = ctx.cupy.zeros(n, np.float32)
    start = time.monotonic()
    if ctx.rank == 0:
        comm.send(x, 1)
    elif ctx.rank == 1:
        comm.recv(got, 0)
        assert bool((got == 7.0).all()), "4 MiB device send before any collective"
    took = time.monotonic() - start
    assert comm.transport._device is None, "a send set up the CUDA IPC transport"
    comm.barrier()
    comm.close()
    return f"rank 0 -> 1, 4 MiB in {took:.2f} s through host memory, no CUDA IPC transport set up"


def check_validation(ctx) -> str:
    import ringcomm
    comm, cp = ctx.comm, ctx.cupy
    x = ctx.on_device(np.ones(8, np.float32))
    seq, done = comm._seq, []
    _refused(lambda: comm.all_reduce(x, out=np.zeros(8, np.float32)), f"cuda:{ctx.device}", "cpu")
    done.append("numpy out for a cupy x")
    if ctx.devices > 1:
        with cp.cuda.Device((ctx.device + 1) % ctx.devices):
            y = cp.zeros(8, cp.float32)
        _refused(lambda: comm.all_reduce(x, out=y), f"cuda:{ctx.device}", f"cuda:{(ctx.device + 1) % ctx.devices}")
        done.append("out on another device")
    torch = ctx.torch
    if torch is not None:
        _refused(lambda: comm.all_reduce(torch.ones(8, device="cuda"), out=torch.zeros(8)), "cpu", "cuda")
        done.append("CPU tensor out for a CUDA tensor")
    _refused(lambda: comm.all_reduce(x, algorithm="one_shot"), "one_shot")
    saved = comm.selector
    comm.selector = ringcomm.selection.selector.Selector(forced={"all_reduce": "one_shot"})
    try:
        if ctx.size > 1:
            _refused(lambda: comm.all_reduce(x), "RINGCOMM_ALGO", "one_shot")
            done.append("RINGCOMM_ALGO forcing one_shot")
    finally:
        comm.selector = saved
    assert comm._seq == seq, f"a refused call took sequence numbers {seq}..{comm._seq - 1}"
    single = "" if ctx.devices > 1 else "; cuda:0 against cuda:1 needs 2 devices"
    return f"refused before any sequence number: {', '.join(done)}, algorithm=one_shot{single}"


def check_mpi_refusal(ctx) -> str:
    m = ctx.fresh("mpi")
    x = ctx.on_device(np.ones(4, np.float32))
    try:
        _refused(lambda: m.all_reduce(x), "'ringcomm'", "'nccl'", f"cuda:{ctx.device}")
        if ctx.size > 1:
            _refused(lambda: m.send(x, (ctx.rank + 1) % ctx.size), "'ringcomm'", "'nccl'")
            _refused(lambda: m.recv(x, (ctx.rank - 1) % ctx.size), "'ringcomm'", "'nccl'")
        assert (m._seq, m._seq_p2p) == (0, 0), "a refused call took a sequence number"
    finally:
        m.close()
    return "all_reduce, send and recv of device memory: UsageError naming 'ringcomm' and 'nccl'"


# ---- faults ------------------------------------------------------------------------------------
def _fails(call, kind, *needles):
    """(seconds until ``call`` raised ``kind`` with every needle in its text, or what went wrong
    instead). Never raises: every rank must go on to the next case together."""
    t0 = time.monotonic()
    try:
        call()
    except kind as err:
        text = str(err)
        missing = [n for n in needles if n not in text]
        return time.monotonic() - t0, (f"{type(err).__name__} without {missing}: {text}" if missing else None)
    except Exception as err:
        return time.monotonic() - t0, f"{type(err).__name__} instead of {kind.__name__}: {err}"
    return time.monotonic() - t0, f"no {kind.__name__}"


def check_fault(ctx) -> str:
    import ringcomm
    if ctx.size == 1:
        raise Skip("one rank: no peer to disagree with")
    last = ctx.rank == ctx.size - 1
    said = f"gpu_check: rank {ctx.size - 1} gives up on purpose"
    outcomes = []
    # 1. a count mismatch on a device all_reduce: every rank raises (a MismatchError, or the
    # PeerAbortedError of a peer that found it first)
    c = ctx.fresh()
    x = ctx.on_device(np.ones(1000 + last, np.float32))
    outcomes.append(("count mismatch", *_fails(lambda: c.all_reduce(x, algorithm="ring"), ringcomm.CommError)))
    c.close()
    # 2. and 3. a peer aborts, before CUDA IPC exists (the others wait in its setup) and during a
    # device collective: the others raise PeerAbortedError carrying the peer's reason
    for case, ready in (("abort during CUDA IPC setup", False), ("abort during a device all_reduce", True)):
        c = ctx.fresh()
        x = ctx.on_device(np.ones(4096, np.float32))
        if ready:
            c.all_reduce(x)
        if last:
            time.sleep(0.2)
            c.abort(said)
        else:
            outcomes.append((case, *_fails(lambda: c.all_reduce(x), ringcomm.PeerAbortedError, said)))
        c.close()
    wrong = [f"{case}: {why}" for case, _, why in outcomes if why]
    slowest = max(ctx.world.allgather(max(took for _, took, _ in outcomes)))
    assert not wrong, "; ".join(wrong)
    assert slowest < 10, f"a rank took {slowest:.1f} s to fail"
    return (f"count mismatch, a peer's abort during CUDA IPC setup and during a device all_reduce: "
            f"every rank raised within {slowest:.2f} s, with the peer's reason")


# ---- DDP -------------------------------------------------------------------------------------
def check_ddp(ctx) -> str:
    from ddp import comm_hooks
    from ddp.reducer import GradBucket
    comm, cp = ctx.comm, ctx.cupy
    assert "cuda" in comm.devices, f"comm.devices is {comm.devices}: CUDA buckets would go through host"
    total = sum(range(1, ctx.size + 1)) / ctx.size
    buf = ctx.on_device(np.full(100_003, ctx.rank + 1.0, np.float32))
    if ctx.stand_in:
        cp.stand_in.reset_host_copies()
    fut = comm_hooks.allreduce_hook(comm_hooks.CommState(comm), GradBucket(0, buf, [], [], True))
    got = fut.wait()
    copies = cp.stand_in.host_copies() if ctx.stand_in else None
    assert got is buf and bool((buf == total).all()), "the bucket was not averaged in place"
    detail = "allreduce_hook on a device bucket: averaged in place"
    if copies is not None:
        assert copies["to_host_calls"] == copies["to_device_calls"] == 0, f"host copies: {copies}"
        detail += ", no host copy (stand-in)"
    if ctx.torch is None:
        return detail + "; a CUDA model needs torch with CUDA (this torch has none)"
    return detail + "; " + _ddp_model(ctx, ringcomm_ddp=True)


def check_torch_ddp(ctx) -> str:
    if ctx.torch is None:
        raise Skip("torch here has no CUDA: torch's DDP cannot hold a CUDA model")
    return _ddp_model(ctx, ringcomm_ddp=False)


def _ddp_model(ctx, ringcomm_ddp: bool) -> str:
    """A small CUDA model trained 3 steps data-parallel; gradients against one process's full
    batch, and equal in their bits on every rank."""
    torch = ctx.torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    ref.load_state_dict(net.state_dict())
    if ringcomm_ddp:
        import ddp
        model = ddp.DistributedDataParallel(net, ctx.comm, bucket_cap_mb=0.01, first_bucket_mb=0.005)
        on_device = all(b.flat.is_cuda for b in model.reducer.buckets)
        assert on_device, "a bucket is not on the device"
    else:
        import torch.distributed as dist
        import ringcomm
        if not dist.is_initialized():
            ringcomm.init_process_group(comm=ctx.comm)
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[ctx.device], bucket_cap_mb=0.01)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        data = torch.randn(ctx.size * 4, 32, generator=g).cuda()
        mine = data[ctx.rank * 4:(ctx.rank + 1) * 4]
        model.zero_grad()
        model(mine).square().mean().backward()
        ref.zero_grad()
        ref(data).square().mean().backward()
        for p, q in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), "gradients differ from the full batch's"
    blob = b"".join(p.grad.cpu().numpy().tobytes() for p in net.parameters())
    assert len(set(ctx.world.allgather(zlib.crc32(blob)))) == 1, "ranks' gradients differ in their bits"
    which = "ringcomm DDP" if ringcomm_ddp else "torch DDP over 'ringcomm'"
    return f"{which} on a CUDA model: 3 steps, gradients equal to the full batch's, identical on every rank"


# ---- time --------------------------------------------------------------------------------------
def check_time(ctx) -> str:
    if ctx.stand_in:
        raise Skip("times over the cupy stand-in mean nothing")
    if ctx.size == 1:
        raise Skip("one rank: nothing travels")
    comm, cp = ctx.comm, ctx.cupy
    count = int(ctx.args.mib * (1 << 20)) // 4
    x = ctx.on_device(np.full(count, 1.0, np.float32))
    y = ctx.on_device(np.ones(count, np.float32))

    def timed(fn) -> float:
        times = []
        for _ in range(ctx.args.iters):
            ctx.world.Barrier()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            cp.cuda.Device().synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))
    local = timed(lambda: x.__iadd__(y))
    comm.all_reduce(x)   # CUDA IPC set up
    parts = [f"local add {local * 1e3:.2f} ms"]
    factor = 2 * (ctx.size - 1) / ctx.size
    for algorithm in ("ring", "rabenseifner", None):
        t = timed(lambda: comm.all_reduce(x, algorithm=algorithm))
        parts.append(f"{algorithm or 'auto'} {t * 1e3:.2f} ms ({factor * x.nbytes / t / 1e9:.1f} GB/s busbw, "
                     f"{t / local:.0f}x the add)")
    return f"{ctx.args.mib:g} MiB float32, median of {ctx.args.iters}: " + "; ".join(parts)


# ---- raw CUDA IPC, without ringcomm --------------------------------------------------------------
def check_cupy_ipc(ctx) -> str:
    """Each rank exports 1 MiB, its right neighbour maps it and writes a pattern, the owner reads
    it back. Anything failing here is the machine's CUDA IPC, not ringcomm."""
    if ctx.size == 1:
        raise Skip("one rank: no peer process")
    cp = ctx.cupy
    rt = cp.cuda.runtime
    nbytes, step, ptr, peer = 1 << 20, "malloc", 0, 0
    ok = True
    try:
        ptr = rt.malloc(nbytes)
        step = "ipcGetMemHandle"
        handle = bytes(rt.ipcGetMemHandle(ptr))
    except Exception as err:
        handle, ok, why = b"", False, f"{step} on rank {ctx.rank}: {type(err).__name__}: {err}"
    handles = ctx.world.allgather(handle)
    left = (ctx.rank - 1) % ctx.size
    if ok and all(handles):
        try:
            step = "ipcOpenMemHandle"
            peer = rt.ipcOpenMemHandle(handles[(ctx.rank + 1) % ctx.size], 1)
            mem = cp.cuda.UnownedMemory(peer, nbytes, None)
            view = cp.ndarray((nbytes // 4,), cp.int32, memptr=cp.cuda.MemoryPointer(mem, 0))
            view.fill(ctx.rank + 1)
            cp.cuda.Device().synchronize()
        except Exception as err:
            ok, why = False, f"{step} on rank {ctx.rank}: {type(err).__name__}: {err}"
    ctx.world.Barrier()
    if ok and all(handles):
        mem = cp.cuda.UnownedMemory(ptr, nbytes, None)
        got = int(cp.ndarray((1,), cp.int32, memptr=cp.cuda.MemoryPointer(mem, 0)).get()[0])
        if got != left + 1:
            ok, why = False, f"rank {ctx.rank} read {got} from its memory, rank {left} wrote {left + 1}"
    if peer:
        rt.ipcCloseMemHandle(peer)
    ctx.world.Barrier()   # every mapping closed before any owner frees (CUDA's rule)
    if ptr:
        rt.free(ptr)
    failures = [w for w in ctx.world.allgather(None if ok else why) if w]
    if failures:
        ctx.ipc_ok = False
        raise Environment(f"CUDA IPC between processes does not work here: {failures[0]}")
    return f"{ctx.size} processes exported, mapped, wrote and read each other's device memory"


def needs_ipc(check):
    """Checks that need CUDA IPC between the ranks: skipped where the raw check failed."""
    def guarded(ctx):
        if not ctx.ipc_ok:
            raise Skip("CUDA IPC between processes does not work here (see cupy-ipc)")
        return check(ctx)
    return guarded


CHECKS = {
    "cupy-ipc": check_cupy_ipc,
    "grid": needs_ipc(check_grid),
    "device-only": needs_ipc(check_device_only),
    "async": needs_ipc(check_async),
    "split": needs_ipc(check_split),
    "streams": needs_ipc(check_streams),
    "memory": needs_ipc(check_memory),
    "p2p-first": check_p2p_first,
    "validation": check_validation,
    "mpi-refusal": check_mpi_refusal,
    "fault": needs_ipc(check_fault),
    "ddp": needs_ipc(check_ddp),
    "torch-ddp": needs_ipc(check_torch_ddp),
    "time-64MiB": needs_ipc(check_time),
}
