"""ringcomm's all_reduce timed the way allreduce_perf.py times it, under whichever launcher started
the job: the same numbers under mpirun and torchrun say the store bootstrap gives the same
shared-memory path as MPI's.

    mpirun -n 2 python benchmarks/launch_perf.py
    torchrun --nproc_per_node=2 benchmarks/launch_perf.py

allreduce_perf.py itself needs MPI (its reference rows call mpi4py); this needs only
``ringcomm.init()``. Per size: ``-n`` back-to-back in-place sums of float32 after ``-w``
warm-ups, the mean time taken as the maximum over ranks (an all_reduce max), median of
``--rounds`` rounds; busbw = algbw x 2(n-1)/n as in nccl-tests. Each result is checked.
"""
import argparse
import os
import statistics
import time

import numpy as np

import ringcomm


def nbytes(text: str) -> int:
    """'8', '64K', '16M', '1G' as nccl-tests spell sizes."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in bytes like 8, 64K or 16M, got {text!r}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--min-bytes", type=nbytes, default=8)
    p.add_argument("-e", "--max-bytes", type=nbytes, default=64 << 20)
    p.add_argument("-f", "--factor", type=int, default=8)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-r", "--rounds", type=int, default=3)
    args = p.parse_args()
    comm = ringcomm.init()
    rank, n = comm.rank, comm.size
    launcher = "mpirun" if any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_SIZE")) else "torchrun"
    if rank == 0:
        print(f"# all_reduce float32 sum, {n} ranks, launched by {launcher}")
        print(f"# {'bytes':>10} {'time_us':>10} {'busbw_GB/s':>11}  check")
    size = args.min_bytes
    while size <= args.max_bytes:
        x = np.ones(max(1, size // 4), np.float32)
        rounds = []
        for _ in range(args.rounds):
            for _ in range(args.warmup):
                comm.all_reduce(x)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                comm.all_reduce(x)
            took = np.array([(time.perf_counter() - t0) / args.iters])
            comm.all_reduce(took, op="max")
            rounds.append(float(took[0]))
        # every element doubled n-fold per call, from 1: n ** calls, exact while it fits float32
        calls = args.rounds * (args.warmup + args.iters)
        ok = bool(np.all(x == np.float32(n) ** calls)) if calls * np.log2(n) < 127 else bool(np.all(np.isinf(x)))
        t = statistics.median(rounds)
        busbw = x.nbytes / t * 2 * (n - 1) / n / 1e9
        if rank == 0:
            print(f"  {x.nbytes:>10} {t * 1e6:>10.1f} {busbw:>11.2f}  {'ok' if ok else 'WRONG'}", flush=True)
        size *= args.factor
    comm.close()


if __name__ == "__main__":
    main()
