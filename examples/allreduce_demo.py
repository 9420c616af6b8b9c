"""A real all-reduce job: every rank contributes, every rank checks, rank 0 reports timings.

    mpirun -n 2 python examples/allreduce_demo.py
"""
import argparse
import time

import numpy as np

import ringcomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=float, default=16.0, help="message size in MiB (float32)")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    comm = ringcomm.init()
    count = int(args.mib * (1 << 20) // 4)
    rows = []
    for algorithm in ringcomm.algorithms.names("all_reduce", comm.transport):
        x = np.full(count, comm.rank + 1, dtype=np.float32)
        comm.all_reduce(x, algorithm=algorithm)   # warm-up, and the correctness check
        expected = comm.size * (comm.size + 1) / 2
        wrong = int(np.count_nonzero(x != expected))
        times = []
        for _ in range(args.iters):
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x, algorithm=algorithm)
            times.append(time.perf_counter() - t0)
        worst = np.array([max(times)], dtype=np.float64)
        comm.all_reduce(worst, op="max")
        median = float(np.median(times))
        busbw = 2 * (comm.size - 1) / comm.size * x.nbytes / median / 1e9
        rows.append((algorithm, median * 1e3, busbw, wrong))
    if comm.rank == 0:
        print(f"all_reduce of {args.mib:g} MiB float32 on {comm.size} ranks ({args.iters} iterations)")
        print(f"{'algorithm':<20}{'median ms':>12}{'busbw GB/s':>12}{'#wrong':>8}")
        for name, ms, bw, wrong in rows:
            print(f"{name:<20}{ms:>12.2f}{bw:>12.2f}{wrong:>8}")


if __name__ == "__main__":
    main()
