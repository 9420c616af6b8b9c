"""Pretend device memory: every allocation is an anonymous shared-memory file (memfd), mapped.

Pointers live in a pretend device address space (0x0de0... upwards, one 1 TiB region per
device), far from any host address: no host code can dereference one by accident, and every
pointer names its device and its allocation. Each allocation keeps a gap after it, so pointer
arithmetic past its end lands in no allocation and is reported instead of reading a neighbour.

The file starts with a header that every process mapping it shares: who owns it, which
processes have it open through IPC (and how often), whether the owner freed it, and the
accesses still pending on some stream (pending.py). Processes update it under ``flock``.

Nothing can leak: the file has no name. Its descriptor stays open in the owner until ``free``,
and an IPC handle names it as ``/proc/<owner pid>/fd/<fd>`` plus a random nonce; when the last
process holding it exits, the kernel reclaims it, even after SIGKILL.
"""
from __future__ import annotations

import bisect
import fcntl
import mmap
import os
import secrets
import struct
import threading

import numpy as np

from . import config
from .errors import (INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, MEMORY_ALLOCATION,
                     PEER_ACCESS_UNSUPPORTED, CUDARuntimeError, violation)

# One lock for all of the stand-in's bookkeeping in this process. flock serialises processes,
# not threads (they share the descriptor), so every flock is taken under it.
LOCK = threading.RLock()

HEADER_BYTES = 16384
MAGIC = 0x53544E44494E4355        # "UCNIDNTS": a stand-in allocation
W_MAGIC, W_NONCE, W_OWNER, W_SIZE, W_DEVICE, W_FREED, W_PENDING = range(7)
OPENERS_AT, OPENER_SLOTS = 16, 32      # (pid, open count) per process that opened it by IPC
PENDING_AT = OPENERS_AT + 2 * OPENER_SLOTS
HANDLE_BYTES = 64                      # cudaIpcMemHandle_t: 64 opaque bytes
_HANDLE = struct.Struct("<8sqqqqq")
_HANDLE_TAG = b"stand-in"

DEVICE_BASE = 0x0DE0 << 48             # device d owns [DEVICE_BASE + d << 40, + 1 << 40)
ALIGNMENT = 256                        # cudaMalloc guarantees at least this
GAP = 1 << 16                          # unmapped bytes after every allocation


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedFile:
    """One allocation's file as this process maps it: header words and data bytes."""

    __slots__ = ("__weakref__", "addr", "data", "device", "fd", "header", "mm", "nonce", "owner", "size")

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.mm = mmap.mmap(fd, HEADER_BYTES + size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.header = np.frombuffer(self.mm, np.int64, count=HEADER_BYTES // 8)
        self.data = np.frombuffer(self.mm, np.uint8, count=size, offset=HEADER_BYTES)
        self.addr = self.data.ctypes.data     # where the data bytes are mapped in this process
        self.size = size
        self.nonce = self.owner = self.device = 0

    @classmethod
    def create(cls, size: int, device: int) -> SharedFile:
        fd = os.memfd_create(f"stand-in-cupy-device{device}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, HEADER_BYTES + size)
            f = cls(fd, size)
        except BaseException:
            os.close(fd)
            raise
        f.nonce, f.owner, f.device = secrets.randbits(62), os.getpid(), device
        h = f.header
        h[W_NONCE], h[W_OWNER], h[W_SIZE], h[W_DEVICE] = f.nonce, f.owner, size, device
        h[W_MAGIC] = MAGIC
        return f

    @classmethod
    def open(cls, owner: int, fd: int, nonce: int, size: int) -> SharedFile:
        """The owner's file through /proc; CUDARuntimeError if it is not (any longer) that one."""
        path = f"/proc/{owner}/fd/{fd}"
        try:
            mine = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            raise CUDARuntimeError(INVALID_HANDLE, f"cannot open {path} ({err.strerror}): the "
                                   f"exporting process {owner} is gone or freed the memory") from None
        try:
            if os.fstat(mine).st_size != HEADER_BYTES + size:
                raise CUDARuntimeError(INVALID_HANDLE, f"{path} is no longer the exported memory")
            f = cls(mine, size)
        except BaseException:
            os.close(mine)
            raise
        h = f.header
        if h[W_MAGIC] != MAGIC or h[W_NONCE] != nonce or h[W_FREED]:
            f.close()
            raise CUDARuntimeError(INVALID_HANDLE, f"process {owner} freed the exported memory")
        f.nonce, f.owner, f.device = nonce, owner, int(h[W_DEVICE])
        return f

    def locked(self) -> "SharedFile":
        """``with f.locked() as header:`` this process's lock, then the file's (flock)."""
        return self

    def __enter__(self) -> np.ndarray:
        LOCK.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            LOCK.release()
            raise
        return self.header

    def __exit__(self, *exc) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            LOCK.release()

    def close(self) -> None:
        """Close the descriptor; the mapping goes when the last array over it does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def describe(self) -> str:
        return f"allocation {self.nonce:#x} of {self.size} bytes on device {self.device} owned by process {self.owner}"


class Mapping:
    """A range of this process's device address space backed by a SharedFile."""

    __slots__ = ("__weakref__", "base", "dead", "device", "file", "kind", "opens", "size")

    def __init__(self, base: int, file: SharedFile, device: int, kind: str):
        self.base, self.size, self.device, self.file, self.kind = base, file.size, device, file, kind
        self.dead: str | None = None     # why it may no longer be used
        self.opens = 1                   # IPC mappings: cudaIpcOpenMemHandle reference count

    def __repr__(self) -> str:
        return (f"<{self.kind} device memory {self.base:#x}+{self.size} on device {self.device}"
                f"{', ' + self.dead if self.dead else ''}>")


_starts: list[int] = []                  # sorted bases of every mapping ever made here
_by_base: dict[int, Mapping] = {}
_next: dict[int, int] = {}
_held: dict[int, int] = {}               # device -> bytes this process allocated there


def _reserve(device: int, size: int) -> int:
    base = _next.get(device, DEVICE_BASE + (device << 40))
    _next[device] = base + -(-size // ALIGNMENT) * ALIGNMENT + GAP
    return base


def _insert(m: Mapping) -> None:
    bisect.insort(_starts, m.base)
    _by_base[m.base] = m


def find(ptr: int) -> Mapping | None:
    """The mapping whose range holds ``ptr`` (dead ones too, to name a use after free)."""
    with LOCK:
        i = bisect.bisect_right(_starts, ptr) - 1
        if i < 0:
            return None
        m = _by_base[_starts[i]]
        return m if ptr < m.base + m.size else None


def is_device_pointer(ptr: int) -> bool:
    return ptr >= DEVICE_BASE


def allocate(size: int, device: int, kind: str) -> Mapping:
    """cudaMalloc of ``size`` > 0 bytes on ``device``; ``kind`` is "malloc" or "pool"."""
    with LOCK:
        held = _held.get(device, 0)
        if held + size > config.DEVICE_BYTES:
            raise CUDARuntimeError(MEMORY_ALLOCATION, f"{size} more bytes on device {device}, which "
                                   f"holds {held} of {config.DEVICE_BYTES} "
                                   f"({config.DEVICE_BYTES_VARIABLE})")
        file = SharedFile.create(size, device)
        m = Mapping(_reserve(device, size), file, device, kind)
        _insert(m)
        _held[device] = held + size
        return m


def release(m: Mapping, why: str) -> None:
    """Free an allocation of this process (cudaFree, or a pool block nobody references).

    Freeing memory that another process still has open is undefined behaviour in CUDA: the
    memory is freed all the same, then the violation is raised naming those processes."""
    with LOCK:
        if m.dead:
            return
        with m.file.locked() as h:
            openers = [int(h[OPENERS_AT + 2 * i]) for i in range(OPENER_SLOTS)
                       if h[OPENERS_AT + 2 * i + 1] > 0 and alive(int(h[OPENERS_AT + 2 * i]))]
            h[W_FREED] = 1
        m.dead = why
        m.file.close()
        _held[m.device] -= m.size
        if m.kind == "pool":   # nothing can name a pool block once its last array is gone
            _starts.remove(m.base)
            del _by_base[m.base]
    if openers:
        raise violation(f"freed {m.file.describe()} while process(es) {openers} still had it open "
                        f"through cudaIpcOpenMemHandle: CUDA documents this as undefined behaviour "
                        f"(the importers must cudaIpcCloseMemHandle first)")


def handle_of(m: Mapping) -> bytes:
    """cudaIpcGetMemHandle: names the whole allocation, whatever pointer inside it was given."""
    f = m.file
    return _HANDLE.pack(_HANDLE_TAG, f.owner, f.fd, f.nonce, f.device, f.size).ljust(HANDLE_BYTES, b"\0")


def _parse(handle: bytes) -> tuple:
    if not isinstance(handle, bytes) or len(handle) != HANDLE_BYTES:
        raise CUDARuntimeError(INVALID_VALUE, f"an IPC handle is {HANDLE_BYTES} bytes from "
                               f"ipcGetMemHandle, got {type(handle).__name__} of {len(handle) if isinstance(handle, (bytes, bytearray)) else '?'} bytes")
    tag, owner, fd, nonce, device, size = _HANDLE.unpack(handle[:_HANDLE.size])
    if tag != _HANDLE_TAG:
        raise CUDARuntimeError(INVALID_HANDLE, "not a handle from the stand-in's ipcGetMemHandle")
    return owner, fd, nonce, device, size


def _opener_slot(h, pid: int, delta: int) -> None:
    free = None
    for i in range(OPENER_SLOTS):
        p = int(h[OPENERS_AT + 2 * i])
        if p == pid:
            h[OPENERS_AT + 2 * i + 1] += delta
            return
        if free is None and (p == 0 or h[OPENERS_AT + 2 * i + 1] <= 0 or not alive(p)):
            free = i
    if free is None:
        raise CUDARuntimeError(INVALID_VALUE, f"more than {OPENER_SLOTS} processes opened one allocation")
    h[OPENERS_AT + 2 * free], h[OPENERS_AT + 2 * free + 1] = pid, delta


def open_handle(handle: bytes, device: int) -> Mapping:
    """cudaIpcOpenMemHandle on the current ``device``: the same pointer again (reference
    counted) if this process already opened it on that device."""
    owner, fd, nonce, alloc_device, size = _parse(handle)
    me = os.getpid()
    if owner == me:
        raise CUDARuntimeError(INVALID_CONTEXT, "a process cannot open its own IPC handle; use the "
                               "pointer it exported")
    with LOCK:
        for m in _by_base.values():
            if m.kind == "ipc" and not m.dead and m.file.nonce == nonce:
                if m.device != device:
                    raise CUDARuntimeError(INVALID_CONTEXT, f"this handle is already open on device "
                                           f"{m.device}; CUDA allows one context per device per process")
                m.opens += 1
                return m
        if alloc_device != device and not config.PEER_ACCESS:
            raise CUDARuntimeError(PEER_ACCESS_UNSUPPORTED, f"the memory is on device {alloc_device}, the "
                                   f"current device is {device} ({config.PEER_ACCESS_VARIABLE}=0)")
        file = SharedFile.open(owner, fd, nonce, size)
        with file.locked() as h:
            _opener_slot(h, me, +1)
        m = Mapping(_reserve(device, size), file, device, "ipc")
        _insert(m)
        return m


def close_handle(m: Mapping) -> None:
    """cudaIpcCloseMemHandle: unmapped when the last open is closed."""
    with LOCK:
        m.opens -= 1
        if m.opens:
            return
        with m.file.locked() as h:
            _opener_slot(h, os.getpid(), -1)
        m.dead = "closed with cudaIpcCloseMemHandle"
        m.file.close()


def live(kind: str | None = None) -> list[Mapping]:
    with LOCK:
        return [m for m in _by_base.values() if not m.dead and (kind is None or m.kind == kind)]
