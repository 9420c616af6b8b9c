"""What a copy into shared memory costs when the peer read the same lines a moment ago: the
staging pool's round trip (core/_copy.h, "Longer copies").

Two ranks on one node, each with a segment in /dev/shm that the other maps. Every iteration
both ranks copy ``--bytes`` from a private array into their own segment, meet in a barrier, and
copy the peer's segment into a private array: a pooled send and its receive in both directions,
as a send/recv exchange does it. The copy in is timed three ways: numpy's (glibc memcpy whole,
its vector loop from 512 KiB here), ringcomm's (core/_copy.h: 256 KiB pieces from 1 MiB, each
one rep movsb) and, for comparison, copying in with no peer reading between (the same lines
stay this core's). Rank 0's median microseconds over ``-n`` iterations, for the copy in and for
the whole iteration.

    mpirun -n 2 python benchmarks/copy_shared.py [--bytes 1M] [-n 300]

On this VM's EPYC host the price of taking a line back from the peer's cache changes with the
period (the hypervisor places the vCPUs): run it several times, a few seconds apart.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from ringcomm.core import copying
from ringcomm.env import parse_size


def segment(path: str, nbytes: int, create: bool) -> np.ndarray:
    with open(path, "w+b" if create else "r+b") as f:
        if create:
            f.truncate(nbytes)
        return np.frombuffer(mmap.mmap(f.fileno(), nbytes), np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="1M", type=parse_size)
    parser.add_argument("-n", type=int, default=300)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run it on two ranks: mpirun -n 2 python benchmarks/copy_shared.py")
    if copying.copy_bytes is None:
        raise SystemExit("ringcomm's compiled copy is not built (pip install -e . builds it)")
    rank, n = world.rank, args.bytes
    tag = world.bcast(f"/dev/shm/ringcomm_copy_shared_{os.getpid()}" if rank == 0 else None)
    mine = segment(f"{tag}_{rank}", n, create=True)
    world.Barrier()
    peer = segment(f"{tag}_{1 - rank}", n, create=False)
    world.Barrier()
    os.unlink(f"{tag}_{rank}")
    src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)

    def exchange(copy_in, read_back: bool) -> tuple:
        copy_in(mine, src)   # warm
        ins, whole = [], []
        for _ in range(args.n):
            world.Barrier()
            t0 = time.perf_counter()
            copy_in(mine, src)
            t1 = time.perf_counter()
            if read_back:
                world.Barrier()
                np.copyto(dst, peer)
            whole.append(time.perf_counter() - t0)
            ins.append(t1 - t0)
        return statistics.median(ins) * 1e6, statistics.median(whole) * 1e6

    rows = [("numpy copy (memcpy)", copying.numpy_copy, True), ("ringcomm copy", copying.copy_bytes, True),
            ("numpy copy, no reader", copying.numpy_copy, False)]
    results = [(label, *exchange(fn, back)) for label, fn, back in rows]
    if not np.array_equal(dst, src):   # the last copy out read what the peer's copy in wrote
        raise SystemExit(f"rank {rank}: the bytes read back from the peer's segment are not what it copied in")
    if rank == 0:
        print(f"# {n} bytes, median us over {args.n} iterations (rank 0); the whole iteration includes "
              f"a barrier and the copy out of the peer's segment")
        print(f"{'copy in':<24}{'copy in':>10}{'iteration':>12}")
        for label, t_in, t_all in results:
            print(f"{label:<24}{t_in:>10.1f}{t_all:>12.1f}")


if __name__ == "__main__":
    main()
