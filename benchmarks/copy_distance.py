"""What a copy costs when its two buffers lie a few bytes apart modulo a page (core/copying.py).

One process, no MPI. For each size, the destination at the source's page offset (distance 0)
and 16 bytes past it (numpy's large arrays start 16 bytes into a page, the staging pool's
messages at a page): numpy's copy (glibc memcpy), ringcomm's copy (core/_copy.h), a CMA read of
this process's own memory (process_vm_readv, the kernel's copy) and ringcomm's CMA read
(cma.PeerMemory.pull, which goes through a buffer at the source's page offset where the distance
is slow and this host's kernel copies such distances slowly: ``cma.distance_cost``, printed). Microseconds per copy, the median of ``--rounds`` means of ``-n`` copies.

    python benchmarks/copy_distance.py [--sizes 16K,256K,1M,4M,16M] [-n 200] [--rounds 5] [--distance 16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ringcomm.core import copying
from ringcomm.env import parse_size
from ringcomm.transport.shm import cma

SIZES = "16K,256K,1M,4M,16M"


def timed(fn, n: int, rounds: int) -> float:
    fn()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        means.append((time.perf_counter() - t0) / n)
    return statistics.median(means) * 1e6


def at(raw: np.ndarray, start: int, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of ``raw`` from the first page boundary at or after ``start``, plus ``offset``."""
    base = start + (-(raw.ctypes.data + start)) % 4096 + offset
    return raw[base:base + nbytes]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES, help=f"a comma list of sizes (default {SIZES})")
    parser.add_argument("-n", type=int, default=200, help="copies per round (fewer for large sizes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--distance", type=int, default=16, help="bytes the destination lies past the source")
    args = parser.parse_args(argv)
    copy = copying.copier()
    cma_ok = cma.blocked() is None
    bounce = not cma_ok or cma.slow_distances()   # what the shm transport decides (transport.py)
    memory = cma.PeerMemory(0, [0, 1], [os.getpid(), os.getpid()], copy, bounce=bounce)
    if cma_ok:
        print(f"# this host's CMA read 16 bytes off a page offset / at it: {cma.distance_cost():.2f} "
              f"(> {cma.DISTANCE_SLOW}: slow, ringcomm reads through a buffer there): "
              f"{'through a buffer' if bounce else 'straight'}")
    print(f"# {'size':>9} {'distance':>8} {'numpy copy':>11} {'ringcomm copy':>14} {'CMA read':>9} {'ringcomm CMA':>13}"
          f"   (us; compiled copy {'built' if copying.copy_bytes is not None else 'NOT built'})")
    for nbytes in [parse_size(t) for t in args.sizes.split(",")]:
        raw = np.ones(2 * nbytes + 4 * 4096, np.uint8)
        src = at(raw, 0, 0, nbytes)
        n = max(3, min(args.n, args.n * (256 << 10) // nbytes))
        for distance in (0, args.distance):
            dst = at(raw, nbytes + 4096, distance, nbytes)
            row = [timed(lambda: np.copyto(dst, src), n, args.rounds),
                   timed(lambda: copy(dst, src), n, args.rounds)]
            if cma_ok:
                row += [timed(lambda: cma.read_process(os.getpid(), src.ctypes.data, dst.ctypes.data, nbytes),
                              n, args.rounds),
                        timed(lambda: memory.pull(1, src.ctypes.data, dst), n, args.rounds)]
            print(f"  {nbytes:>9} {distance:>8} " + " ".join(f"{v:>{w}.1f}" for v, w in zip(row, (11, 14, 9, 13))))


if __name__ == "__main__":
    main()
