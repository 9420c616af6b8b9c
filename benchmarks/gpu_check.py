"""Device check: every collective on CUDA tensors over CUDA IPC, then NCCL, with busbw.

    python benchmarks/gpu_check.py [--mib 64] [--iters 20]

On a machine with a GPU it launches 2 ranks with mpirun (on one GPU they share it, as CUDA IPC
allows), checks every collective and algorithm on CUDA tensors against a float64 reference and,
bitwise, across ranks, checks that CUDA IPC carried them, then runs the NCCL reference backend
when NCCL allows it (NCCL refuses two ranks on one GPU: that is detected and reported), and prints
all-reduce busbw against a device-local ``x += y`` of the same size. It finishes in under 5
minutes. Without a GPU (or cupy) it prints a SKIP line and exits 0.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 280


def gpu_missing() -> str | None:
    """Why this machine cannot run the check, or None."""
    try:
        import cupy
    except ImportError as err:
        return f"cupy is not installed ({err}); pip install cupy-cuda12x"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:
        return f"no usable CUDA driver/device ({type(err).__name__}: {err})"
    if n < 1:
        return "no CUDA device found"
    try:
        import torch
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA support here"
    except ImportError:
        return "torch is not installed"
    return None


def launch(args) -> int:
    reason = gpu_missing()
    if reason:
        print(f"SKIP gpu_check: no GPU: {reason}")
        return 0
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun) if mpirun.exists() else "mpirun", "-n", "2", sys.executable, __file__,
           "--worker", "--mib", str(args.mib), "--iters", str(args.iters)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("RINGCOMM_TIMEOUT", "60")
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        print(f"FAIL gpu_check: did not finish in {LIMIT_S} s")
        return 1
    print(f"gpu_check: {'PASS' if proc.returncode == 0 else 'FAIL'} in {time.monotonic() - start:.1f} s")
    return proc.returncode


# ---- the worker: one rank of the mpirun job --------------------------------------------------
def worker(args) -> None:
    import cupy
    import numpy as np
    import torch
    from mpi4py import MPI

    import ringcomm
    from ringcomm.transport import factory

    world = MPI.COMM_WORLD

    def abort_job(kind, value, tb):   # one failing rank must not leave the other blocked
        import traceback
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        world.Abort(1)
    sys.excepthook = abort_job
    comm = ringcomm.init()
    rank, size = comm.rank, comm.size
    dev = comm.local_rank % cupy.cuda.runtime.getDeviceCount()
    torch.cuda.set_device(dev)
    cupy.cuda.Device(dev).use()
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    log(f"{size} ranks, devices {world.allgather(dev)}, "
        f"{torch.cuda.get_device_name(dev)}")

    def inputs(r, count, dtype):
        g = torch.Generator().manual_seed(100 * r + count)
        return torch.randn(count, generator=g, dtype=torch.float64).to(dtype)

    def check(got, want64, what, tol):
        host = got.float().cpu().double() if got.dtype == torch.bfloat16 else got.cpu().double()
        err = (host - want64).abs().max().item() if want64.numel() else 0.0
        assert err <= tol * max(1.0, want64.abs().max().item() if want64.numel() else 1.0), \
            f"{what}: max error {err}"
        blobs = world.allgather(got.cpu().view(torch.uint8).numpy().tobytes() if got.dtype != torch.bfloat16
                                else got.cpu().view(torch.int16).numpy().tobytes())
        assert all(b == blobs[0] for b in blobs), f"{what}: ranks differ"

    checked = 0
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for count in (1, 1000, 262_147):
            every = [inputs(r, count, dtype) for r in range(size)]
            ref = sum(e.double() for e in every)
            for algorithm in ringcomm.algorithms.names("all_reduce"):
                if ringcomm.algorithms.needs_window("all_reduce", algorithm):
                    continue   # one-shot rounds run in host shared memory only
                x = every[rank].cuda()
                comm.all_reduce(x, algorithm=algorithm)
                check(x, ref, f"all_reduce {algorithm} {count} {dtype}", tol * size)
                checked += 1
            for algorithm in ringcomm.algorithms.names("broadcast"):
                x = every[rank].cuda()
                comm.broadcast(x, root=size - 1, algorithm=algorithm)
                check(x, every[size - 1].double(), f"broadcast {algorithm}", 0)
                checked += 1
            x = every[rank].cuda()
            comm.reduce(x, root=0)
            if rank == 0:
                assert (x.cpu().double() - ref).abs().max().item() <= tol * size * max(1, ref.abs().max().item())
            out = torch.empty(count * size, dtype=dtype, device="cuda")
            comm.all_gather(out, every[rank].cuda())
            check(out, torch.cat([e.double() for e in every]), "all_gather", 0)
            full = [inputs(r + 50, count * size, dtype) for r in range(size)]
            out = torch.empty(count, dtype=dtype, device="cuda")
            comm.reduce_scatter(out, full[rank].cuda())
            want = sum(f.double() for f in full)[rank * count:(rank + 1) * count]
            assert (out.cpu().double() - want).abs().max().item() <= tol * size * max(1, want.abs().max().item())
            checked += 3
    comm.barrier()
    routes = factory.describe(comm.transport)
    cuda_routes = comm.transport.describe(device="cuda") if hasattr(comm.transport, "describe") else {}
    assert set(cuda_routes.values()) == {"cuda_ipc"}, cuda_routes
    log(f"PASS ringcomm over CUDA IPC: {checked} collective checks (host routes {routes}, CUDA {cuda_routes})")

    # busbw of a big all-reduce against a local add of the same size on the device
    count = int(args.mib * (1 << 20)) // 4
    x = torch.full((count,), float(rank + 1), device="cuda")
    y = torch.ones_like(x)

    def timed(fn):
        times = []
        for _ in range(args.iters):
            world.Barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    local = timed(lambda: x.add_(y))
    factor = 2 * (size - 1) / size
    log(f"{'what':<28}{'median ms':>12}{'busbw GB/s':>12}   ({args.mib:g} MiB float32)")
    log(f"{'local x += y':<28}{local * 1e3:>12.3f}{'':>12}")
    for algorithm in ("ring", "rabenseifner"):
        t = timed(lambda: comm.all_reduce(x, algorithm=algorithm))
        log(f"{'ringcomm ' + algorithm:<28}{t * 1e3:>12.3f}{factor * x.nbytes / t / 1e9:>12.2f}"
            f"   {t / local:.1f}x local add")
    comm.close()

    # NCCL: one GPU per rank is a hard rule of NCCL ("Duplicate GPU detected")
    bus = world.allgather((os.uname().nodename, torch.cuda.get_device_properties(dev).uuid
                           if hasattr(torch.cuda.get_device_properties(dev), "uuid") else dev))
    if len(set(bus)) < len(bus):
        log("SKIP NCCL reference: the ranks share one GPU and NCCL requires a distinct GPU per rank "
            "(it fails with 'Duplicate GPU detected'); run with one GPU per rank to compare")
        return
    try:
        nccl = ringcomm.init(backend="nccl")
    except Exception as err:
        log(f"SKIP NCCL reference: ringcomm.init(backend='nccl') failed: {type(err).__name__}: {err}")
        return
    z = torch.full((1000,), float(rank + 1), device="cuda")
    nccl.all_reduce(z)
    assert (z == size * (size + 1) / 2).all(), z[:4]
    t = timed(lambda: nccl.all_reduce(x))
    log(f"{'nccl':<28}{t * 1e3:>12.3f}{factor * x.nbytes / t / 1e9:>12.2f}   {t / local:.1f}x local add")
    log("PASS NCCL reference")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=64.0, help="all-reduce size for busbw (float32)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
