"""Device all-reduce timings: what the CUDA IPC transport costs, beside torch's gloo on the same
CUDA tensors, in one run.

    mpirun -n 2 python benchmarks/gpu_perf.py [--sizes 4,1K,64K,1M,4M,16M,64M] [--big 64M] [--iters 10]

Each rank takes GPU ``local rank % device count``, so on a one-GPU machine the ranks share it.
Rank 0 prints one line per row, in five sections:

- ``floor``: a one-element kernel and a stream synchronisation, on rank 0 alone and on every rank
  at once. Every device message pays one on each side (transport/cuda_ipc.py); processes that
  share a GPU take turns on it, which the second figure shows.
- ``sizes``: all_reduce of float32 cupy arrays, the selector's choice and ring.
- ``segments``: the --big ring at device segment sizes 1, 4 and 16 MiB (core/schedule.py's
  DEVICE_SEGMENT_BYTES, the evidence for its value).
- ``algorithms``: every schedule all_reduce at --big with its bus bandwidth and the bytes that
  went through host memory (0 when the pool holds every segment), then reduce_scatter,
  all_gather and broadcast of the same input.
- ``torch``: float32 CUDA tensors, ringcomm's choice against torch's gloo (which copies through
  host memory) on the same tensors; skipped where torch has no CUDA.

Times are medians of --iters, each between a barrier and a device synchronisation. With
tests/stand_ins on PYTHONPATH it runs on the CPU stand-in for cupy (how CI keeps it working);
those times mean nothing. docs/gpu.md has the figures of the H200 runs.
"""
from __future__ import annotations

import argparse
import statistics
import time

from ringcomm.env import parse_size


class Bench:
    def __init__(self, args):
        from mpi4py import MPI
        import cupy
        import ringcomm
        self.args, self.cp, self.world = args, cupy, MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        local = self.world.Split_type(MPI.COMM_TYPE_SHARED)
        cupy.cuda.Device(local.Get_rank() % cupy.cuda.runtime.getDeviceCount()).use()
        local.Free()
        self.comm = ringcomm.init()

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def timed(self, fn, iters=None) -> float:
        """Median seconds of ``fn`` over ``iters`` runs, each complete on the device."""
        times = []
        for _ in range(iters or self.args.iters):
            self.world.Barrier()
            self.cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            self.cp.cuda.Device().synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def floor(self) -> None:
        x = self.cp.zeros(1, self.cp.float32)
        stream = self.cp.cuda.get_current_stream()

        def kernels(mine: bool):
            for _ in range(200 if mine else 0):
                x.__iadd__(1)
                stream.synchronize()
        alone = self.timed(lambda: kernels(self.rank == 0), 5)
        together = self.timed(lambda: kernels(True), 5)
        self.say(f"floor: kernel + stream sync {alone / 200 * 1e6:.1f} us on rank 0 alone, "
                 f"{together / 200 * 1e6:.1f} us with every rank at once")

    def sizes(self) -> None:
        for nbytes in self.args.sizes:
            x = self.cp.ones(max(1, nbytes // 4), self.cp.float32)
            self.comm.all_reduce(x)
            auto = self.timed(lambda: self.comm.all_reduce(x))
            ring = self.timed(lambda: self.comm.all_reduce(x, algorithm="ring"))
            self.say(f"sizes: {_size(nbytes)} auto {_us(auto)}, ring {_us(ring)}")

    def segments(self) -> None:
        from ringcomm import communicator
        kept = communicator.DEVICE_SEGMENT_BYTES
        x = self.cp.ones(self.args.big // 4, self.cp.float32)
        try:
            for seg in (1 << 20, 4 << 20, 16 << 20):
                communicator.DEVICE_SEGMENT_BYTES = seg   # read when a call is planned
                self.comm._plans.clear()
                self.comm.all_reduce(x, algorithm="ring")
                t = self.timed(lambda: self.comm.all_reduce(x, algorithm="ring"))
                self.say(f"segments: {_size(self.args.big)} ring, {seg >> 20} MiB segments: {_us(t)}")
        finally:
            communicator.DEVICE_SEGMENT_BYTES = kept
            self.comm._plans.clear()

    def algorithms(self) -> None:
        from ringcomm import algorithms
        comm, cp, n = self.comm, self.cp, self.world.Get_size()
        x = cp.ones(self.args.big // 4, cp.float32)
        factor = 2 * (n - 1) / n
        for name in (a for a in algorithms.names("all_reduce") if not algorithms.is_window("all_reduce", a)):
            comm.all_reduce(x, algorithm=name)
            host = comm.transport.carried()["host"]
            t = self.timed(lambda: comm.all_reduce(x, algorithm=name))
            self.say(f"algorithms: {_size(x.nbytes)} {name} {_us(t)}, {factor * x.nbytes / t / 1e9:.1f} GB/s busbw, "
                     f"{comm.transport.carried()['host'] - host} B through host")
        part = cp.empty(x.size // n, cp.float32)
        whole = cp.empty(x.size * n, cp.float32)
        for name, fn in (("reduce_scatter", lambda: comm.reduce_scatter(part, x[:part.size * n])),
                         ("all_gather", lambda: comm.all_gather(whole, x)),
                         ("broadcast", lambda: comm.broadcast(x, root=0))):
            fn()
            self.say(f"algorithms: {_size(x.nbytes)} {name} {_us(self.timed(fn))}")

    def torch(self) -> None:
        import torch
        if not torch.cuda.is_available():
            self.say("torch: SKIP (this torch has no CUDA)")
            return
        import ringcomm
        gloo = ringcomm.init("gloo")
        try:
            for nbytes in self.args.sizes:
                t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=f"cuda:{self.cp.cuda.Device().id}")
                self.comm.all_reduce(t)
                gloo.all_reduce(t)
                ours = self.timed(lambda: self.comm.all_reduce(t))
                theirs = self.timed(lambda: gloo.all_reduce(t))
                self.say(f"torch: {_size(nbytes)} CUDA tensor ringcomm {_us(ours)}, gloo {_us(theirs)}, "
                         f"ratio {ours / theirs:.2f}")
        finally:
            gloo.close()


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


SECTIONS = ("floor", "sizes", "segments", "algorithms", "torch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4,1K,64K,1M,4M,16M,64M", help="all_reduce sizes in bytes (K, M suffixes)")
    p.add_argument("--big", default="64M", help="the size of the segment and algorithm sections")
    p.add_argument("--iters", type=int, default=10, help="timed runs per row (median printed)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.big = parse_size(args.big)
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown sections {sorted(unknown)} (expected some of {', '.join(SECTIONS)})")
    bench = Bench(args)
    for name in SECTIONS:
        if name in args.only.split(","):
            getattr(bench, name)()
    bench.comm.close()


if __name__ == "__main__":
    main()
