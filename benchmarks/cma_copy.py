"""What a Cross Memory Attach copy costs against a memcpy on this machine.

    python benchmarks/cma_copy.py [--sizes 512K,1M,4M,16M] [--calls 200]

A forked child holds a written array; the parent copies it out of the child with
``process_vm_readv`` (ringcomm.transport.shm.cma, what a receive read by CMA and the direct
algorithms do), and into the child with ``process_vm_writev`` (what a direct gather does), and
copies the same bytes between two of its own arrays with numpy (what a copy through shared memory
costs, per copy). Every figure is the best of three repeats of ``--calls`` copies, in
microseconds per copy. The ratio says when one CMA copy beats two memcpys (the staging pool or a
window slot: copy in, copy out), which is how the transport's floors are set (docs/transports.md).
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

from ringcomm.env import parse_size
from ringcomm.transport.shm.cma import read_process, write_process
from ringcomm.transport.shm.segments import address


def best_of(copy, calls: int, repeats: int = 3) -> float:
    copy()   # pages touched, pinned once
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            copy()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512K,1M,4M,16M", help="bytes per copy, comma-separated")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"{'bytes':>10} {'readv us':>10} {'writev us':>10} {'memcpy us':>10} {'readv/memcpy':>13}")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        src = np.ones(nbytes, np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        pid = os.fork()
        if pid == 0:   # the peer: holds its copy of src (written after the fork) until killed
            src[:] = 2
            signal.pause()
            os._exit(0)
        try:
            time.sleep(0.05)   # the child has written its pages
            there = address(src)   # the same address in the forked child
            readv = best_of(lambda: read_process(pid, there, address(dst), nbytes), args.calls)
            assert dst[0] == 2 and dst[-1] == 2, "the read did not come from the child"
            writev = best_of(lambda: write_process(pid, there, address(dst), nbytes), args.calls)
            memcpy = best_of(lambda: np.copyto(dst, src), args.calls)
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(f"{nbytes:>10} {readv:>10.1f} {writev:>10.1f} {memcpy:>10.1f} {readv / memcpy:>13.2f}")


if __name__ == "__main__":
    main()
