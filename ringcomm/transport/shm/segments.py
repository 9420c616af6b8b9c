"""Shared-memory segments: files in /dev/shm that every rank of a node maps, and their lifetime.

A segment is created by its owner (``create``: O_CREAT | O_EXCL, mode 0600, the space reserved
with posix_fallocate), mapped by every peer (``open_peer``) and unlinked by its owner as soon as
every peer has mapped it; from then on only the mappings keep the memory, and /dev/shm holds
nothing of ringcomm's.

Why posix_fallocate: a tmpfs file sized with ftruncate has no pages yet; the first write to a
page that /dev/shm cannot supply (Docker's default is 64 MiB) kills the process with SIGBUS.
Reserving every page at creation turns that into ENOSPC, which the transport can handle: shrink
the staging pool, fall back to private memory, or raise a CommError that says what to do.

Names carry their owner: ``ringcomm-<owner pid>-<pid namespace>-<token>-<segment id>``. Between
creation and unlink (the node-wide handshakes of transport.py) a file exists by name, and a job
killed in that window cannot unlink it. ``sweep`` (run by every transport at start) removes the
files of this user whose owner process is dead, in this pid namespace: the next job of the same
user cleans up after a killed one. A pid that was reused keeps its file until that process ends;
files of other namespaces or users are never touched.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
from typing import Optional

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "ringcomm-"
ALIGN = 64             # offsets handed out inside segments: one cache line, any dtype's alignment
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-([0-9a-f]+)-(\d+)$")


def address(a) -> int:
    """Start address of an array's data: host (numpy) or device (cupy) memory."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pid_namespace() -> int:
    """An id of this process's pid namespace (the inode of /proc/self/ns/pid); 0 if unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def segment_path(pid: int, namespace: int, token: int, seg_id: int) -> str:
    return f"{SHM_DIR}/{PREFIX}{pid}-{namespace:x}-{token:x}-{seg_id}"


class Segment:
    """One rank's shared mapping: ``data`` is a uint8 array over all of it."""

    __slots__ = ("seg_id", "data", "addr", "nbytes")

    def __init__(self, seg_id: int, data):
        self.seg_id, self.data = seg_id, data
        self.addr, self.nbytes = address(data), data.nbytes

    def contains(self, addr: int, nbytes: int) -> bool:
        return self.addr <= addr and addr + nbytes <= self.addr + self.nbytes


def create(path: str, nbytes: int) -> np.ndarray:
    """Create ``path`` with ``nbytes`` reserved and map it; OSError (ENOSPC when /dev/shm is
    short) leaves no file behind."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)   # every page now, or ENOSPC now: never SIGBUS later
        except OSError:
            unlink_quietly(path)
            raise
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)   # the mapping keeps the memory; the descriptor is not needed
    return np.frombuffer(mm, dtype=np.uint8)


def open_peer(path: str, nbytes: int) -> np.ndarray:
    """Map a peer's segment of ``nbytes``; OSError if it is missing or shorter than that."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise OSError(errno.EINVAL, f"{path} holds {size} bytes, its owner announced {nbytes}")
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def space() -> tuple:
    """(free, total) bytes of /dev/shm, or (None, None) where it cannot be asked."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


def stale(namespace: Optional[int] = None) -> list:
    """Paths of this user's ringcomm files in /dev/shm whose owner is dead (this namespace)."""
    namespace = pid_namespace() if namespace is None else namespace
    if not namespace:   # without a namespace id a pid says nothing for sure: touch nothing
        return []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    found, uid = [], os.geteuid()
    for name in names:
        m = _NAME.match(name)
        if m is None or int(m.group(2), 16) != namespace or owner_alive(int(m.group(1))):
            continue
        path = f"{SHM_DIR}/{name}"
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == uid:
                found.append(path)
    return found


def sweep(namespace: Optional[int] = None) -> list:
    """Unlink what ``stale`` finds; returns the paths removed."""
    removed = []
    for path in stale(namespace):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


def leftovers() -> list:
    """Every ringcomm file in /dev/shm (tests: what a job left behind)."""
    try:
        return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX))
    except OSError:
        return []


def mib(nbytes: Optional[int]) -> str:
    return "unknown" if nbytes is None else f"{nbytes / (1 << 20):.1f} MiB"


def space_advice() -> str:
    return ("give the job more shared memory: `docker run --shm-size=1g` (or `--ipc=host`), in "
            "Kubernetes an emptyDir volume with `medium: Memory` mounted at /dev/shm; or set "
            "RINGCOMM_TRANSPORT=mpi")
