"""Cross Memory Attach: a rank reads a peer's private array straight out of the peer's process,
or writes into it.

process_vm_readv (compiled in core/_round.c where built, else through ctypes; either drops the
GIL for the call) copies a range of another process's memory into this one: one copy per
receive, where staging costs two (copy into the pool, then read from it). process_vm_writev is
the same copy the other way, done by the rank that has the data: a gather's ranks write their
blocks into the root's output at once, each on its own core, instead of the root reading them
one after another. The kernel allows both only where the caller could attach a debugger to the
peer anyway (same user, ptrace permitted), and the ranks of a node are already trusted with each
other's 0600 segments, so they grant nothing a rank could not do already.

Containers often forbid them (seccomp, ptrace rules: EPERM), so at setup every rank test-reads a
random token from the next rank of the node and writes the same value back (the token also
catches ranks in other pid namespaces, where a pid names another process), and the node agrees:
CMA, both ways, for every pair, or for none ("off: <why>"). A ring of such probes crosses every
boundary between groups of ranks that cannot reach each other. RINGCOMM_SHM_CMA=0 turns it off.

Whether a send is read by CMA is then the sender's own decision, per collective (see
``min_bytes``): the descriptor says where the payload is, so ranks need not agree on it.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import math
import mmap
import os
import threading
import time
from typing import Callable, Optional

import numpy as np

from ... import env
from ...core import copying
from ...core.compiled import transfer as compiled_transfer
from ...errors import CommError
from .segments import address

CHUNK = 1 << 20          # bytes read per system call before reducing: stays in cache
# Collectives smaller than this stage instead of reading by CMA: a cache-sized collective copies
# fast, and process_vm_readv pins every page it reads, which then dominates (2 ranks here: the
# ring at 256 KiB-16 MiB took 1.2-1.6x longer with CMA, at 64 MiB 0.75x; docs/transports.md).
MIN_BYTES = 32 << 20
# A send (comm.send) is one copy by CMA against two through the pool (the sender's copy in, the
# receiver's copy out), and a pooled send is done for its caller once copied in. Which wins below
# 4 MiB depends on the host this VM lands on: how fast a read pins pages (``read_cost``). 2 ranks
# exchanging 1 MiB, CMA / pool: an AMD EPYC host, where a read took 3.8 memcpys, 175-178 / 92-94
# us (pooled also 0.61-0.64x at 2 MiB, 1.35-1.37x at 4 MiB); an Intel Xeon host, where it took
# 1.6-2.3 (2.2 at most with 4 processes probing at once on 2 cores), 121-123 / 201-204 us, and at
# 256 KiB 42 / 56 (docs/transports.md). So reads start at 256 KiB where a read costs at most
# READ_FAST memcpys, between the two hosts, else at 4 MiB.
P2P_MIN_BYTES = 4 << 20
READ_FAST = 3.0
FAST_P2P_MIN_BYTES = 256 << 10


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load(name: str):
    """libc's process_vm_readv or process_vm_writev, or None where there is none (not Linux, an
    old libc)."""
    try:
        f = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                  ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    f.restype = ctypes.c_ssize_t
    return f


_process_vm_readv = _load("process_vm_readv")
_process_vm_writev = _load("process_vm_writev")


def _transfer(write: bool, pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` between ``remote_addr`` in process ``pid`` and ``local_addr`` here: into
    local (or, with ``write``, out of it); OSError on failure. Compiled where built (ctypes'
    argument conversion cost ~1 us a call); else through ctypes, where the kernel may stop short
    (a page it could not reach), so the rest is asked for again and that second call reports the
    error (the compiled call does the same)."""
    if compiled_transfer is not None:
        compiled_transfer(pid, local_addr, remote_addr, nbytes, write)
        return
    call = _process_vm_writev if write else _process_vm_readv
    local, remote = _IoVec(), _IoVec()
    done = 0
    while done < nbytes:
        local.base, local.len = local_addr + done, nbytes - done
        remote.base, remote.len = remote_addr + done, nbytes - done
        got = call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:   # 0 would loop forever; the kernel only returns it for empty vectors
            code = ctypes.get_errno() if got < 0 else errno.EIO
            raise OSError(code, os.strerror(code))
        done += got


def read_process(pid: int, addr: int, dst_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``addr`` in process ``pid`` to ``dst_addr`` here; OSError on failure."""
    _transfer(False, pid, addr, dst_addr, nbytes)


def write_process(pid: int, addr: int, src_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``src_addr`` here to ``addr`` in process ``pid``; OSError on failure."""
    _transfer(True, pid, addr, src_addr, nbytes)


def min_bytes() -> int:
    """RINGCOMM_SHM_CMA_MIN (bytes, e.g. 32M), else MIN_BYTES."""
    value = env.get("RINGCOMM_SHM_CMA_MIN")
    return MIN_BYTES if value is None else value


def p2p_min_bytes(probe: bool = False) -> int:
    """RINGCOMM_SHM_CMA_P2P_MIN (bytes); else, with ``probe`` (this node reads by CMA),
    FAST_P2P_MIN_BYTES where this host's reads are fast (``read_cost``); else P2P_MIN_BYTES. A
    tuning file's measured floor replaces the last two (init.py)."""
    value = env.get("RINGCOMM_SHM_CMA_P2P_MIN")
    if value is not None:
        return value
    return FAST_P2P_MIN_BYTES if probe and reads_fast(read_cost()) else P2P_MIN_BYTES


def reads_fast(cost: float) -> bool:
    """Whether a read cost (``read_cost``; 0 where not measured) makes a host's reads fast."""
    return 0 < cost <= READ_FAST


def _probe_buffer(nbytes: int, value: int) -> np.ndarray:
    """``nbytes`` filled with ``value``, mapped for the probe alone rather than taken from malloc:
    glibc raises its mmap threshold to the size of every mapped block a process frees, so a
    freed 1 MiB probe array made every later array of up to 1 MiB come from the heap, where
    consecutive arrays lie 16 bytes apart modulo a page. Reads between such arrays cost 1.2x on
    the Xeon and take the detour on the EPYC (PeerMemory); ``ringcomm.init()`` must not move the
    caller's arrays there."""
    buf = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)   # the array keeps the mapping alive
    buf[...] = value
    return buf


def _fastest(fn) -> float:
    """Seconds of the fastest of five calls of ``fn``, after one that warms the caches and the
    page tables (the start-up probes below)."""
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


@functools.lru_cache(maxsize=1)   # once per process: its CPU and kernel do not change
def read_cost(nbytes: int = 1 << 20) -> float:
    """A process_vm_readv of ``nbytes`` of this process's own memory, over a memcpy of them: the
    page pinning that decides between one CMA read and two copies through the pool. The lowest
    of three ratios, each of the best of five reads and copies (warm), so that a peer's start-up
    stealing the core makes a host look no slower than it is; about 3 ms in all. inf where the
    read fails."""
    src, dst = _probe_buffer(nbytes, 1), _probe_buffer(nbytes, 0)
    pid, src_addr, dst_addr = os.getpid(), address(src), address(dst)
    ratios = []
    for _ in range(3):
        try:
            read = _fastest(lambda: read_process(pid, src_addr, dst_addr, nbytes))
        except OSError:
            return math.inf
        ratios.append(read / max(_fastest(lambda: copying.numpy_copy(dst, src)), 1e-9))
    return min(ratios)


# Reads whose two sides lie a few bytes apart modulo a page go through a buffer at the remote
# side's page offset (PeerMemory) where this host's kernel copies them slowly: 2-5x on the AMD
# EPYC this VM lands on. On its Intel Xeon hosts they cost the same as aligned ones, and the
# detour's second copy made a 16 MiB send 1.7-2.1x slower (benchmarks/copy_distance.py:
# 1 MiB 147 us against 70 read straight; docs/transports.md). So each process measures it.
DISTANCE_SLOW = 1.5   # between the Xeon's 1.1 and the EPYC's 2-5, on a log scale


@functools.lru_cache(maxsize=1)   # once per process, as read_cost
def distance_cost(nbytes: int = 256 << 10) -> float:
    """A process_vm_readv of ``nbytes`` of this process's own memory into a buffer 16 bytes past
    the source's page offset (numpy's large arrays start 16 bytes into a page), over one at the
    same offset: the lowest of three ratios, each of the best of five reads (about 1 ms in all).
    inf where the read fails (the detour is kept)."""
    src = _probe_buffer(nbytes + copying.PAGE, 1)
    dst = _probe_buffer(nbytes + 2 * copying.PAGE, 0)
    pid, src_addr = os.getpid(), address(src)
    aligned = copying.like(dst, src_addr, nbytes)
    start = address(aligned) - address(dst) + 16
    apart = dst[start:start + nbytes]

    def best(local) -> float:
        return _fastest(lambda: read_process(pid, src_addr, address(local), nbytes))
    try:
        return min(best(apart) / max(best(aligned), 1e-9) for _ in range(3))
    except OSError:
        return math.inf


def slow_distances() -> bool:
    """Whether this host's kernel copies slowly between buffers a few bytes apart modulo a page."""
    return distance_cost() > DISTANCE_SLOW


def blocked() -> Optional[str]:
    """Why this rank must not even try CMA; None if it may."""
    if not env.get("RINGCOMM_SHM_CMA"):
        return "RINGCOMM_SHM_CMA=0"
    if _process_vm_readv is None or _process_vm_writev is None:
        return "libc has no process_vm_readv/process_vm_writev"
    return None


def errno_text(err: OSError) -> str:
    name = errno.errorcode.get(err.errno, str(err.errno))
    if err.errno == errno.ESRCH:
        return f"{name} (the process is gone)"
    return f"{name} ({err.strerror})"


class PeerMemory:
    """Reads (and writes) peers' memory for one transport; errors name the peer's rank, pid,
    address, size.

    The kernel copies with ``rep movsb``, 2-5x slower on some CPUs where the two sides lie 1 to
    31 bytes apart modulo a page (core/copying.py), so where ``bounce`` (``slow_distances()``, or
    as given) a transfer between two such addresses goes in CHUNK pieces through a buffer of this
    thread's placed at the remote side's page offset, and the local copy is core/_copy.h's, which
    avoids the slow distance."""

    def __init__(self, rank: int, ranks: list, pids: list, copy=copying.numpy_copy, bounce: bool = True,
                 gone: Callable[[int], Optional[str]] = lambda p: None):
        self.rank, self.ranks, self.pids, self._copy = rank, ranks, pids, copy
        self.bounce = bounce
        self._gone = gone   # why node rank p left, if it did: a failed read names it
        self._local = threading.local()   # each thread's chunk buffer, reused: it stays in cache

    def pull(self, p: int, addr: int, dst: np.ndarray) -> None:
        """Copy ``dst.nbytes`` bytes at ``addr`` of node rank ``p``'s memory into ``dst``."""
        if self.bounce and dst.nbytes > copying.PIECE and dst.flags.c_contiguous \
                and copying.slow_distance(address(dst), addr):
            flat = dst.reshape(-1).view(np.uint8)
            for i in range(0, flat.size, CHUNK):
                part = flat[i:i + CHUNK]
                bounce = self.chunk_like(addr + i, part.size)
                self._reach(read_process, "read", p, addr + i, bounce)
                self._copy(part, bounce)
            return
        self._reach(read_process, "read", p, addr, dst)

    def push(self, p: int, addr: int, src: np.ndarray) -> None:
        """Copy ``src`` (contiguous) to ``addr`` of node rank ``p``'s memory."""
        if self.bounce and src.nbytes > copying.PIECE and src.flags.c_contiguous \
                and copying.slow_distance(addr, address(src)):
            flat = src.reshape(-1).view(np.uint8)
            for i in range(0, flat.size, CHUNK):
                part = flat[i:i + CHUNK]
                bounce = self.chunk_like(addr + i, part.size)
                self._copy(bounce, part)
                self._reach(write_process, "write", p, addr + i, bounce)
            return
        self._reach(write_process, "write", p, addr, src)

    def chunk_like(self, addr: int, nbytes: int) -> np.ndarray:
        """``nbytes`` (at most CHUNK) of this thread's chunk buffer, at ``addr``'s page offset."""
        chunk = getattr(self._local, "chunk", None)
        if chunk is None:
            chunk = self._local.chunk = np.empty(CHUNK + copying.PAGE, np.uint8)
        return copying.like(chunk, addr, nbytes)

    def _reach(self, transfer, verb: str, p: int, addr: int, local: np.ndarray) -> None:
        try:
            transfer(self.pids[p], addr, address(local), local.nbytes)
        except OSError as err:
            why = self._gone(p)
            raise CommError(f"shm transport on rank {self.rank}: cannot {verb} {local.nbytes} bytes at "
                            f"{addr:#x} of rank {self.ranks[p]} (pid {self.pids[p]}): {errno_text(err)}"
                            + (f"; {why}, which withdraws what it sent and nobody received" if why else "")) from None

    def probe(self, p: int, addr: int, value: int) -> Optional[str]:
        """Why reading node rank ``p``'s token, or writing the same value back, failed; None if
        it read ``value`` and could write it (the token is unchanged either way)."""
        got = np.zeros(1, np.int64)
        try:
            self.pull(p, addr, got)
            if got[0] != value:
                return f"rank {self.rank} read a wrong probe value from rank {self.ranks[p]}"
            self.push(p, addr, got)
        except CommError as err:
            return str(err)
        return None

    def copy(self, p: int, addr: int, buf: np.ndarray) -> None:
        """Read a message into ``buf``."""
        if buf.flags.c_contiguous:
            self.pull(p, addr, buf)
        else:   # the kernel writes one contiguous range
            tmp = np.empty(buf.shape, buf.dtype)
            self.pull(p, addr, tmp)
            buf[...] = tmp

    def reduce(self, p: int, addr: int, buf: np.ndarray, reduce_chunk) -> None:
        """Read a message in CHUNK pieces, calling ``reduce_chunk(start, piece)`` on each while
        it is still in cache (``start``: its first element in ``buf``)."""
        per = CHUNK // buf.itemsize
        for i in range(0, buf.size, per):
            m = min(per, buf.size - i)
            part = self.chunk_like(addr + i * buf.itemsize, m * buf.itemsize).view(buf.dtype)
            self._reach(read_process, "read", p, addr + i * buf.itemsize, part)
            reduce_chunk(i, part)
