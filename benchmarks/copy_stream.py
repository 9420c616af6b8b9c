"""Long copies with streaming stores or through the cache (core/_copy.h, "A copy at least as long
as the last-level cache").

One process copies ``--sizes`` from a private array into another, three ways, interleaved round
by round: numpy's (glibc memcpy), ringcomm's with streaming stores (``copying.stream_from`` set
below the size) and ringcomm's without them (256 KiB pieces, each one rep movsb). Prints the
median milliseconds of each over ``-r`` rounds, and the host's last-level cache, from which
ringcomm streams.

    python benchmarks/copy_stream.py [--sizes 8M,16M,32M,64M] [-r 7]
    mpirun -n 2 python benchmarks/copy_stream.py   # both ranks copy at once, as in a collective

On this VM the same copy can take twice as long from one launch to the next: compare the three
columns of one launch, and run several.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ringcomm.core import copying
from ringcomm.env import parse_size


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8M,16M,32M,64M", help="comma list of sizes in bytes (K, M suffixes)")
    parser.add_argument("-r", "--rounds", type=int, default=7)
    args = parser.parse_args()
    if copying.copy_bytes is None:
        raise SystemExit("ringcomm's compiled copy is not built (pip install -e . builds it)")
    try:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
    except ImportError:
        world = None
    rank = 0 if world is None else world.rank
    llc = copying.last_level_cache()
    if rank == 0:
        print(f"# last-level cache {llc >> 20} MiB ({'sysfs' if llc else 'unknown'}); ringcomm streams from "
              f"{copying.STREAM_FROM >> 20} MiB; {1 if world is None else world.size} process(es) copying at once")
        print(f"{'size':>10} {'memcpy ms':>10} {'streamed ms':>12} {'pieces ms':>10}")
    try:
        for size in (parse_size(s) for s in args.sizes.split(",")):
            src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
            reps = max(3, (512 << 20) // size)
            ways = {"memcpy": lambda: np.copyto(dst, src), "streamed": lambda: copying.copy(dst, src),
                    "pieces": lambda: copying.copy(dst, src)}
            spent: dict = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    copying.stream_from(1 if name == "streamed" else 1 << 62)
                    if world is not None:
                        world.Barrier()
                    spent[name].append(timed(fn, reps))
            if rank == 0:
                ms = [statistics.median(spent[name]) * 1e3 for name in ways]
                print(f"{size:>10} {ms[0]:>10.2f} {ms[1]:>12.2f} {ms[2]:>10.2f}")
    finally:
        copying.stream_from(copying.STREAM_FROM)


if __name__ == "__main__":
    main()
