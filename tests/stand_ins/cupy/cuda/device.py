"""cupy.cuda.device.Device (cupy/cuda/device.pyx): a device id, current per host thread."""
from __future__ import annotations

from .._stand_in import streams
from .._stand_in.errors import module_getattr, not_modelled
from . import runtime


class Device:
    """Device(device=None): ``None`` means the current device of this thread."""

    __slots__ = ("id",)

    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else int(device)

    def __int__(self) -> int:
        return self.id

    def __index__(self) -> int:
        return self.id

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and self.id == other.id

    def __hash__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"

    def __enter__(self):
        current = runtime.getDevice()
        streams.thread.devices.append(current)
        if self.id != current:
            runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):
        runtime.setDevice(streams.thread.devices.pop())

    def use(self) -> None:
        runtime.setDevice(self.id)

    def synchronize(self) -> None:
        """Wait for all work of this process on this device (every stream)."""
        previous = runtime.getDevice()
        runtime.setDevice(self.id)
        try:
            runtime.deviceSynchronize()
        finally:
            runtime.setDevice(previous)

    def __getattr__(self, name: str):
        raise not_modelled(f"cupy.cuda.Device.{name}")


__getattr__ = module_getattr("cupy.cuda.device")
