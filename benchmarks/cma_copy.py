"""What a Cross Memory Attach copy costs against a memcpy on this machine.

    python benchmarks/cma_copy.py [--sizes 512K,1M,4M,16M] [--calls 200] [--pages 4k,huge]

A forked child holds a written array, on 4 KiB pages or on transparent huge pages (``--pages``:
the kernel pins every page a CMA copy touches, so the peer's page size decides its speed;
docs/transports.md "Huge pages"); the parent copies it out of the child with
``process_vm_readv`` (ringcomm.transport.shm.cma, what a receive read by CMA and the direct
algorithms do), and into the child with ``process_vm_writev`` (what a direct gather does), and
copies the same bytes between two of its own arrays with numpy (what a copy through shared memory
costs, per copy). Every figure is the best of three repeats of ``--calls`` copies, in
microseconds per copy. The ratio says when one CMA copy beats two memcpys (the staging pool or a
window slot: copy in, copy out), which is how the transport's floors are set (docs/transports.md).
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
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


HUGE = 2 << 20
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


def child_array(nbytes: int, pages: str) -> tuple:
    """A private array of ``nbytes`` whose pages the kernel is asked to make huge (aligned to 2
    MiB, madvised before the first write) or kept at 4 KiB; (array, its mapping)."""
    mapping = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mapping, np.uint8)
    array = whole[(-address(whole)) % HUGE:][:nbytes]
    advice = MADV_HUGEPAGE if pages == "huge" else MADV_NOHUGEPAGE
    ctypes.CDLL(None).madvise(ctypes.c_void_p(address(array)), ctypes.c_size_t(nbytes), advice)
    return array, mapping


def huge_kb(pid: int, addr: int) -> int:
    """The kB of the mapping holding ``addr`` in ``pid`` on transparent huge pages (0 where the
    kernel does not say)."""
    inside = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):   # a mapping's first line: lo-hi perms ...
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512K,1M,4M,16M", help="bytes per copy, comma-separated")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pages", default="4k,huge", help="the child's pages, comma-separated: 4k, huge")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.pages.split(",") if k.strip()]
    if not kinds or any(k not in ("4k", "huge") for k in kinds):
        parser.error(f"--pages: expected a comma list of 4k, huge, got {args.pages!r}")
    print(f"{'bytes':>10} {'pages':>5} {'huge kB':>8} {'readv us':>10} {'writev us':>10} {'memcpy us':>10} "
          f"{'readv/memcpy':>13}")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        src = np.ones(nbytes, np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        for pages in kinds:
            dst[...] = 0   # the read below must bring the child's 2s
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:   # the peer: its own array, written, its address sent; held until killed
                os.close(r)
                held, _mapping = child_array(nbytes, pages)
                held[:] = 2
                os.write(w, address(held).to_bytes(8, "little"))
                signal.pause()
                os._exit(0)
            os.close(w)
            try:
                there = int.from_bytes(os.read(r, 8), "little")
                readv = best_of(lambda: read_process(pid, there, address(dst), nbytes), args.calls)
                assert dst[0] == 2 and dst[-1] == 2, "the read did not come from the child"
                writev = best_of(lambda: write_process(pid, there, address(dst), nbytes), args.calls)
                memcpy = best_of(lambda: np.copyto(dst, src), args.calls)
                huge = huge_kb(pid, there)
            finally:
                os.close(r)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            print(f"{nbytes:>10} {pages:>5} {huge:>8} {readv:>10.1f} {writev:>10.1f} {memcpy:>10.1f} "
                  f"{readv / memcpy:>13.2f}")


if __name__ == "__main__":
    main()
