"""cupy.cuda: devices, streams, memory and the runtime API, as far as ringcomm uses them."""
from __future__ import annotations

from .._stand_in.errors import CUDARuntimeError, module_getattr
from . import device, memory, runtime, stream
from .device import Device
from .memory import BaseMemory, Memory, MemoryPointer, UnownedMemory, alloc
from .stream import Event, ExternalStream, Stream, get_current_stream

__all__ = ["BaseMemory", "CUDARuntimeError", "Device", "Event", "ExternalStream", "Memory",
           "MemoryPointer", "Stream", "UnownedMemory", "alloc", "device", "get_current_stream",
           "get_device_id", "is_available", "memory", "runtime", "stream"]


def is_available() -> bool:
    try:
        return runtime.getDeviceCount() > 0
    except CUDARuntimeError:
        return False


def get_device_id() -> int:
    return runtime.getDevice()


__getattr__ = module_getattr("cupy.cuda")
