"""Where a CUDA call runs: on its buffers' device, on a stream ordered after the caller's.

A call on device memory may run inline in the caller's thread or later on the communicator's
progress thread, whose current device is 0 and whose current stream is not the caller's. So the
call takes both with it, as torch's NCCL backend does:

- at the call, in the caller's thread, an event is recorded on the caller's current stream
  (cupy's current stream for cupy arrays, torch's for CUDA tensors): it covers everything the
  caller queued before the call, and nothing queued after;
- the job runs with the buffers' device current and with an internal stream of that thread and
  device current, which first waits for that event. Every kernel of the call (copies in and out
  of the transport, reductions, the avg divide, scratch allocation) goes there, and so does
  torch's work when a torch backend (gloo, nccl) runs the call;
- the job ends by synchronising that stream from the host, so when the call returns, or its
  Work completes, the results are complete in device memory and every stream may read them.

The last point is stronger than torch's promise (which only orders the caller's current stream
after the work). ringcomm's CUDA IPC transport is driven by the host and synchronises each
message anyway, so one more synchronisation per call costs little, and it leaves no stream the
caller could get wrong: a side stream, another thread's stream, or a host read.
"""
from __future__ import annotations

import sys
import threading
from typing import Optional

from .buffers import Buffer, device_index


class _Streams(threading.local):
    """The internal stream of each device, per thread (so two communicators driven by two threads
    do not wait on each other's kernels)."""

    def __init__(self):
        self.by_device: dict = {}


_streams = _Streams()


def _internal_stream(cupy, device: int):
    """This thread's stream on ``device`` (the current device when called)."""
    stream = _streams.by_device.get(device)
    if stream is None:
        stream = _streams.by_device[device] = cupy.cuda.Stream(non_blocking=True)
    return stream


def _torch_cuda():
    """torch, when it is imported and can run CUDA work (its backends then need its stream set)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() else None


def caller_stream(cupy, buf: Buffer):
    """The stream the caller's work on ``buf`` was queued on, as a cupy stream object."""
    index = device_index(buf)
    if buf.kind == "torch":
        torch = sys.modules["torch"]
        return cupy.cuda.ExternalStream(torch.cuda.current_stream(buf.obj.device).cuda_stream, index)
    return cupy.cuda.get_current_stream(index)


class DeviceScope:
    """Enter around everything a device call runs (see the module doc). Made in the caller's
    thread at the call; entered once per job (or once per poll of a point-to-point operation)."""

    __slots__ = ("cupy", "device", "ready", "_saved")

    def __init__(self, buf: Buffer):
        self.cupy = cupy = sys.modules["cupy"]   # a device buffer is a cupy view: cupy is loaded
        self.device = device_index(buf)
        with cupy.cuda.Device(self.device):   # an event belongs to the device it is created on
            self.ready = cupy.cuda.Event(disable_timing=True)
            self.ready.record(caller_stream(cupy, buf))
        self._saved: list = []

    def __enter__(self) -> "DeviceScope":
        cupy = self.cupy
        device = cupy.cuda.Device(self.device)
        device.__enter__()
        stream = _internal_stream(cupy, self.device)
        stream.wait_event(self.ready)
        stream.__enter__()
        torch = _torch_cuda()
        torch_stream = None
        if torch is not None:   # torch's collectives (gloo, nccl backends) order after torch's stream
            torch_stream = torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr, device=f"cuda:{self.device}"))
            torch_stream.__enter__()
        self._saved.append((device, stream, torch_stream))
        return self

    def __exit__(self, *exc) -> None:
        device, stream, torch_stream = self._saved.pop()
        try:
            stream.synchronize()
        finally:
            if torch_stream is not None:
                torch_stream.__exit__(None, None, None)
            stream.__exit__(None, None, None)
            device.__exit__(None, None, None)

    def wrap(self, fn):
        """``fn`` run inside this scope (a point-to-point test polled by the progress thread)."""
        def scoped():
            with self:
                return fn()
        return scoped


def scope_for(call) -> Optional[DeviceScope]:
    """The scope of a call on device memory; None for host memory (nothing to do)."""
    buf = call.inp if call.inp is not None else call.out
    if buf is None or buf.device == "cpu":
        return None
    return DeviceScope(buf)
