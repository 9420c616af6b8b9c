"""Shared-memory segments: files in /dev/shm that every rank of a node maps, and their lifetime.

A segment is created by its owner (``create``: O_CREAT | O_EXCL, mode 0600, the space reserved
with posix_fallocate) and mapped by every peer. Two ways to share it, chosen per node:

- **by descriptor** (the default): the owner unlinks its file right after creating it and keeps
  the descriptor; peers open ``/proc/<owner pid>/fd/<fd>`` (``open_by_fd``) and check that it is
  the inode the owner announced. The name exists for two system calls, so a job killed at any
  moment leaves nothing in /dev/shm. Opening another process's descriptor needs the same
  permission as reading its /proc entries (same user; no ``hidepid``); where a node lacks it,
  the transport falls back to
- **by name**: peers open the file by name (``open_peer``) and the owner unlinks it once every
  peer has mapped it. Between creation and unlink (two node-wide handshakes) a job killed there
  cannot unlink its files; ``sweep`` removes them at the next job's start.

From then on only the mappings keep the memory, and /dev/shm holds nothing of ringcomm's.

Why posix_fallocate: a tmpfs file sized with ftruncate has no pages yet; the first write to a
page that /dev/shm cannot supply (Docker's default is 64 MiB) kills the process with SIGBUS.
Reserving every page at creation turns that into ENOSPC, which the transport can handle: shrink
the staging pool, fall back to private memory, or raise a CommError that says what to do.

Names carry their owner: ``ringcomm-<owner pid>-<pid namespace>-<token>-<segment id>``. ``sweep``
(run by every transport at start) removes the files of this user whose owner process is dead,
in this pid namespace: the next job of the same user cleans up after a killed one. A pid that
was reused keeps its file until that process ends; files of other namespaces or users are never
touched.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
from typing import Optional

import numpy as np

from ...core.buffers import address

SHM_DIR = "/dev/shm"
PREFIX = "ringcomm-"
ALIGN = 64             # offsets handed out inside segments: one cache line, any dtype's alignment
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-([0-9a-f]+)-(\d+)$")


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


def create(path: str, nbytes: int, keep_fd: bool = False):
    """Create ``path`` with ``nbytes`` reserved and map it; OSError (ENOSPC when /dev/shm is
    short) leaves no file behind. With ``keep_fd`` the name is unlinked at once and the result
    is (mapping, open descriptor, (st_dev, st_ino)) for peers to open by descriptor; else the
    mapping alone, the name staying until ``unlink_quietly``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if keep_fd:
            os.unlink(path)   # the only moment the name exists: these two calls
        os.posix_fallocate(fd, 0, nbytes)   # every page now, or ENOSPC now: never SIGBUS later
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        unlink_quietly(path)
        raise
    data = np.frombuffer(mm, dtype=np.uint8)
    if not keep_fd:
        os.close(fd)   # the mapping keeps the memory; the descriptor is not needed
        return data
    st = os.fstat(fd)
    return data, fd, (st.st_dev, st.st_ino)


def open_by_fd(pid: int, fd: int, nbytes: int, identity: tuple) -> np.ndarray:
    """Map the segment process ``pid`` holds open as ``fd``; OSError if it cannot be opened or
    is not the inode ``identity`` (st_dev, st_ino) its owner announced (another pid namespace)."""
    return _map_checked(f"/proc/{pid}/fd/{fd}", nbytes, identity)


def open_peer(path: str, nbytes: int) -> np.ndarray:
    """Map a peer's segment of ``nbytes`` by name; OSError if it is missing or shorter."""
    return _map_checked(path, nbytes, None)


def _map_checked(path: str, nbytes: int, identity) -> np.ndarray:
    fd = os.open(path, os.O_RDWR)
    try:
        st = os.fstat(fd)
        if identity is not None and (st.st_dev, st.st_ino) != tuple(identity):
            raise OSError(errno.ESTALE, f"{path} is not the segment its owner announced")
        if st.st_size < nbytes:
            raise OSError(errno.EINVAL, f"{path} holds {st.st_size} bytes, its owner announced {nbytes}")
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


def _stat(pid: int) -> Optional[list]:
    """/proc/<pid>/stat's fields from the state on (the third), or None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()   # after the command name, which may hold anything


def proc_is_ours() -> bool:
    """Whether /proc shows this process's own pid namespace (it does not after ``unshare -p``
    without a new /proc): only then does /proc/<pid> describe the process a peer's pid names."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks after boot: /proc/<pid>/stat's 22nd field), or
    None where /proc does not say. With the pid it names one process for good: a pid is reused,
    the pair never is."""
    fields = _stat(pid)
    try:
        return None if fields is None else int(fields[19])
    except (IndexError, ValueError):
        return None


def process_ended(pid: int, start: int) -> bool:
    """Whether the process that was ``pid`` when it started at ``start`` (``process_start``) has
    ended: no such pid, a zombie (dead, not yet reaped), or another process under the same pid.
    False where /proc cannot tell."""
    if not owner_alive(pid):
        return True
    fields = _stat(pid)
    if not fields or len(fields) < 20:
        return False
    return fields[0] in (b"Z", b"X") or fields[19] != str(start).encode()


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
