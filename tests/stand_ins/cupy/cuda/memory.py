"""cupy.cuda.memory: memory objects and MemoryPointer, as in cupy/cuda/memory.pyx.

``Memory`` (and ``alloc``, cupy's pool) owns an allocation of its own and frees it when the
last reference goes; real cupy's pool keeps freed blocks for reuse, the stand-in gives each
request an allocation of its own (so a stale pointer is caught instead of aliasing a new array).
``UnownedMemory`` wraps a pointer from elsewhere (runtime.malloc, an IPC mapping); the range
must lie inside one live allocation of this process.
"""
from __future__ import annotations

import weakref

from .._stand_in import launch, memory
from .._stand_in.errors import module_getattr, violation


class BaseMemory:
    __slots__ = ("__weakref__", "_mapping", "device_id", "ptr", "size")

    @property
    def device(self):
        from .device import Device
        return Device(self.device_id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.ptr:#x} size={self.size} device={self.device_id}>"


def _return_to_pool(m: memory.Mapping) -> None:
    memory.release(m, "freed: its last cupy array is gone")


class Memory(BaseMemory):
    """Device memory owned by this object (cupy.cuda.Memory), on the current device."""

    __slots__ = ()

    def __init__(self, size: int):
        self.size = int(size)
        self.device_id = launch.current_device()
        self.ptr, self._mapping = 0, None
        if self.size > 0:
            m = memory.allocate(self.size, self.device_id, "pool")
            self.ptr, self._mapping = m.base, m
            weakref.finalize(self, _return_to_pool, m)


class UnownedMemory(BaseMemory):
    """Memory not owned by cupy: ``owner`` is kept alive as long as this object."""

    __slots__ = ("_owner",)

    def __init__(self, ptr: int, size: int, owner, device_id: int = -1):
        self.ptr, self.size, self._owner, self._mapping = int(ptr), int(size), owner, None
        if self.ptr == 0:
            if device_id < 0:
                raise RuntimeError("UnownedMemory requires explicit device ID for a null pointer.")
            self.device_id = device_id
            return
        m = memory.find(self.ptr)
        if m is None or self.ptr + self.size > m.base + m.size:
            where = "lies in no device allocation of this process" if m is None else f"overruns {m!r}"
            raise violation(f"UnownedMemory(ptr={self.ptr:#x}, size={self.size}): the range {where}; "
                            f"a kernel on it would touch memory that is not this array's")
        if m.dead:
            raise violation(f"UnownedMemory(ptr={self.ptr:#x}, size={self.size}) over {m!r}")
        self._mapping = m
        self.device_id = m.device if device_id < 0 else device_id


class MemoryPointer:
    """A pointer into a memory object: ``ptr`` is ``mem.ptr + offset``."""

    __slots__ = ("device_id", "mem", "ptr")

    def __init__(self, mem: BaseMemory, offset: int):
        assert mem.ptr != 0 or offset == 0
        self.mem, self.ptr, self.device_id = mem, mem.ptr + int(offset), mem.device_id

    @property
    def device(self):
        return self.mem.device

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"<MemoryPointer 0x{self.ptr:x} device={self.device_id} mem={self.mem!r}>"

    def __add__(self, offset: int) -> MemoryPointer:
        assert self.ptr != 0 or offset == 0
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + int(offset))

    __radd__ = __add__

    def __sub__(self, offset: int) -> MemoryPointer:
        return self + -int(offset)


def alloc(size: int) -> MemoryPointer:
    """cupy.cuda.alloc: memory from the (stand-in) pool on the current device."""
    return MemoryPointer(Memory(size), 0)


__getattr__ = module_getattr("cupy.cuda.memory")
