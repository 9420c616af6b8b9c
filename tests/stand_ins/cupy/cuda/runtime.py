"""cupy.cuda.runtime (cupy_backends/cuda/api/runtime.pyx): the CUDA runtime calls ringcomm makes.

Same names, signatures and error class as cupy's; CUDA's documented rules are enforced where a
real GPU would fail (CUDARuntimeError) and where it would be undefined (StandInViolation).
"""
from __future__ import annotations

import ctypes
import os

from .._stand_in import config, launch, memory, pending, streams
from .._stand_in.errors import (INVALID_DEVICE, INVALID_VALUE, NO_DEVICE, CUDARuntimeError,
                                module_getattr, violation)
from .stream import Stream

is_hip = False
cudaIpcMemLazyEnablePeerAccess = 1
memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = range(5)
streamLegacy, streamPerThread = 1, 2
streamNonBlocking = 1


def getDeviceCount() -> int:
    if config.DEVICES == 0:
        raise CUDARuntimeError(NO_DEVICE, f"{config.DEVICES_VARIABLE}=0")
    return config.DEVICES


def getDevice() -> int:
    return launch.current_device()


def _valid(device: int, what: str) -> int:
    n = getDeviceCount()
    if not 0 <= device < n:
        raise CUDARuntimeError(INVALID_DEVICE, f"{what} {device}, but this process sees devices 0..{n - 1} "
                               f"({config.DEVICES_VARIABLE}={n})")
    return device


def setDevice(device: int) -> None:
    """The current device of the calling thread only."""
    streams.thread.device = _valid(int(device), "device")


def deviceSynchronize() -> None:
    streams.synchronize_device(getDevice())


def deviceCanAccessPeer(device: int, peerDevice: int) -> int:
    _valid(device, "device")
    _valid(peerDevice, "peerDevice")
    return int(config.PEER_ACCESS and device != peerDevice)


def malloc(size: int) -> int:
    """cudaMalloc on the current device; 0 bytes give the null pointer, as in CUDA."""
    if size < 0:
        raise OverflowError("can't convert negative value to size_t")
    return memory.allocate(size, getDevice(), "malloc").base if size else 0


def free(ptr: int) -> None:
    """cudaFree: waits for the device's work first (CUDA synchronises implicitly)."""
    if ptr == 0:
        return
    m = memory.find(ptr)
    if m is None or m.base != ptr or m.kind != "malloc":
        what = ("no allocation" if m is None else
                "an IPC mapping (close it with ipcCloseMemHandle)" if m.kind == "ipc" else
                f"inside {m!r}, not its start" if m.base != ptr else "memory owned by a cupy object")
        raise CUDARuntimeError(INVALID_VALUE, f"free({ptr:#x}): {what}")
    if m.dead:
        raise CUDARuntimeError(INVALID_VALUE, f"free({ptr:#x}): {m.dead} already")
    streams.synchronize_device(m.device)
    memory.release(m, "freed with cudaFree")


def memGetInfo() -> tuple:
    held = sum(m.size for m in memory.live() if m.kind != "ipc" and m.device == getDevice())
    return config.DEVICE_BYTES - held, config.DEVICE_BYTES


def _live(ptr: int, call: str) -> memory.Mapping:
    m = memory.find(ptr) if memory.is_device_pointer(ptr) else None
    if m is None or m.dead:
        raise CUDARuntimeError(INVALID_VALUE, f"{call}({ptr:#x}): " +
                               ("not device memory of this process" if m is None else f"{m!r}"))
    return m


def ipcGetMemHandle(devPtr: int) -> bytes:
    """64 opaque bytes naming the whole allocation that holds ``devPtr``."""
    m = _live(devPtr, "ipcGetMemHandle")
    if m.kind == "ipc":
        raise CUDARuntimeError(INVALID_VALUE, "memory opened through IPC cannot be exported again")
    return memory.handle_of(m)


def ipcOpenMemHandle(handle: bytes, flags: int = cudaIpcMemLazyEnablePeerAccess) -> int:
    """Map another process's allocation on the current device; returns its base here."""
    if flags != cudaIpcMemLazyEnablePeerAccess:
        raise CUDARuntimeError(INVALID_VALUE, f"flags={flags}; CUDA accepts only "
                               f"cudaIpcMemLazyEnablePeerAccess (1)")
    return memory.open_handle(handle, getDevice()).base


def ipcCloseMemHandle(devPtr: int) -> None:
    """Unmap (at the last close). Launches of this process on the memory must be complete:
    after the close nothing could synchronise them, and the owner may free the memory."""
    m = _live(devPtr, "ipcCloseMemHandle")
    if m.kind != "ipc" or m.base != devPtr:
        raise CUDARuntimeError(INVALID_VALUE, f"ipcCloseMemHandle({devPtr:#x}): not a pointer from "
                               f"ipcOpenMemHandle")
    me, unsynced = os.getpid(), []
    if m.opens == 1:
        with m.file.locked() as h:
            rows = pending.load(h)
            unsynced = [streams.describe(me, r[pending.STREAM]) for r in rows if r[pending.PID] == me]
            pending.store(h, [r for r in rows if r[pending.PID] != me])
    memory.close_handle(m)
    if unsynced:
        raise violation(f"ipcCloseMemHandle({devPtr:#x}) with launches on it not yet synchronised "
                        f"({', '.join(sorted(set(unsynced)))}): they may still be running when the "
                        f"owner frees or reuses the memory; synchronise first")


def _side(ptr: int, size: int, what: str):
    """(mapping or None, offset in it, host address of the bytes) for one memcpy operand."""
    if not memory.is_device_pointer(ptr):
        return None, 0, ptr
    m = memory.find(ptr)
    if m is None or ptr + size > m.base + m.size:
        raise CUDARuntimeError(INVALID_VALUE, f"memcpy {what} {ptr:#x}+{size}: " +
                               ("no device allocation" if m is None else f"overruns {m!r}"))
    return m, ptr - m.base, m.file.addr + (ptr - m.base)


_KINDS = {memcpyHostToHost: (False, False), memcpyHostToDevice: (True, False),
          memcpyDeviceToHost: (False, True), memcpyDeviceToDevice: (True, True)}


def memcpy(dst: int, src: int, size: int, kind: int) -> None:
    """cudaMemcpy on the legacy default stream of the current device. Device-to-host returns
    when the copy is done; host-to-device and device-to-device return with the device side
    still pending on that stream (CUDA's rules for pageable memory and for device copies)."""
    if kind not in _KINDS and kind != memcpyDefault:
        raise CUDARuntimeError(INVALID_VALUE, f"memcpy kind {kind}")
    dm, doff, daddr = _side(dst, size, "dst")
    sm, soff, saddr = _side(src, size, "src")
    if kind != memcpyDefault and _KINDS[kind] != (dm is not None, sm is not None):
        raise CUDARuntimeError(INVALID_VALUE, f"memcpy kind {kind} with a {'device' if dm else 'host'} "
                               f"dst and a {'device' if sm else 'host'} src")
    if size == 0:
        return
    accesses = []
    if sm is not None:
        accesses.append(launch.Access(sm, soff, soff + size, pending.READ, sm.device))
    if dm is not None:
        accesses.append(launch.Access(dm, doff, doff + size, pending.WRITE, dm.device))
    state = launch.run("cudaMemcpy", accesses, stream=Stream.null, kernel=False) if accesses else None
    ctypes.memmove(daddr, saddr, size)
    if sm is not None and dm is None:
        launch.count("to_host", size)
        streams.synchronize(state)
    elif dm is not None and sm is None:
        launch.count("to_device", size)


__getattr__ = module_getattr("cupy.cuda.runtime")
