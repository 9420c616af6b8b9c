"""cupy.cuda.stream: Stream, ExternalStream, Event, get_current_stream (cupy/cuda/stream.pyx).

What orders what is modelled in _stand_in/streams.py; these are cupy's objects over it.
``Stream.null`` (pointer 0) is the legacy default stream of whichever device is current when
it is used. ``ExternalStream(ptr)`` wraps a stream by pointer, as torch interop does
(``ExternalStream(torch.cuda.current_stream().cuda_stream)``); in the stand-in the pointer
must be one of its own streams (or 0/1, the legacy stream), since no other CUDA library runs.

The caller's stream, for a library like ringcomm, is ``get_current_stream()`` evaluated on the
caller's thread: a progress thread has its own current stream (Stream.null of device 0 until
told otherwise), so work handed to it must be ordered after the caller's stream explicitly,
e.g. an Event recorded on the caller's stream and waited for on the worker's.
"""
from __future__ import annotations

from .._stand_in import launch, memory, streams
from .._stand_in.errors import module_getattr, not_modelled

LEGACY_PTRS = (0, 1)          # 0: cupy's Stream.null; 1: cudaStreamLegacy
PER_THREAD_PTR = 2            # cudaStreamPerThread: not modelled


def _check_device(device_id: int) -> int:
    current = launch.current_device()
    if device_id == -1:
        device_id = current
    if device_id != current:
        raise RuntimeError(f"The device that the stream is created on ({device_id}) does not match "
                           f"with the current device ({current})")
    return device_id


class _BaseStream:
    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id
        self._state = None if ptr in LEGACY_PTRS else streams.by_ptr(ptr)

    def _resolve(self, device: int | None = None) -> streams.StreamState:
        if self._state is not None:
            return self._state
        if self.device_id >= 0:
            return streams.legacy(self.device_id)
        return streams.legacy(launch.current_device() if device is None else device)

    def __eq__(self, other) -> bool:
        return isinstance(other, _BaseStream) and self.ptr == other.ptr

    def __hash__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.ptr} (device {self.device_id})>"

    def __enter__(self):
        device = _check_device(self.device_id)
        t = streams.thread
        t.saved.append((device, t.current.get(device)))
        t.current[device] = self
        return self

    def __exit__(self, *exc):
        t = streams.thread
        device, previous = t.saved.pop()
        if previous is None:
            t.current.pop(device, None)
        else:
            t.current[device] = previous

    def use(self):
        streams.thread.current[_check_device(self.device_id)] = self
        return self

    def synchronize(self) -> None:
        streams.synchronize(self._resolve())

    @property
    def done(self) -> bool:
        """True: the stand-in's work is done when queried, so this counts as a synchronisation."""
        self.synchronize()
        return True

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        if event._clock is not None:   # waiting for an event never recorded returns at once
            streams.wait(self._resolve(), event._clock)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise not_modelled(f"cupy.cuda.{type(self).__name__}.{name}")


class Stream(_BaseStream):
    """Stream(null=False, non_blocking=False, ptds=False), created on the current device."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        if null:
            super().__init__(0, -1)
        elif ptds:
            raise not_modelled("cupy.cuda.Stream(ptds=True) (the per-thread default stream)")
        else:
            state = streams.create(launch.current_device(), blocking=not non_blocking)
            super().__init__(state.ptr, state.device)


Stream.null = Stream(null=True)


class ExternalStream(_BaseStream):
    """A stream by pointer; the stand-in knows only its own streams and the legacy stream."""

    def __init__(self, ptr: int, device_id: int = -1):
        ptr = int(ptr)
        if ptr == PER_THREAD_PTR:
            raise not_modelled("cupy.cuda.ExternalStream(2) (cudaStreamPerThread)")
        super().__init__(ptr, device_id)
        if ptr not in LEGACY_PTRS and self._state is None:
            raise ValueError(f"ExternalStream({ptr:#x}): no stream of this process has that pointer "
                             f"(the stand-in models only streams made by cupy.cuda.Stream)")


class Event:
    """Event(block=False, disable_timing=False, interprocess=False): a snapshot of what a
    stream's work so far is ordered after, taken by ``record``."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        if interprocess:
            if not disable_timing:
                raise ValueError("Timing must be disabled for interprocess events")
            raise not_modelled("cupy.cuda.Event(interprocess=True)")
        self._clock: dict | None = None
        self.ptr = id(self)

    def record(self, stream: _BaseStream | None = None) -> None:
        state = get_current_stream()._resolve() if stream is None else stream._resolve()
        with memory.LOCK:
            self._clock = state.snapshot()

    def synchronize(self) -> None:
        if self._clock is not None:
            streams.synchronize_clock(self._clock)

    @property
    def done(self) -> bool:
        self.synchronize()
        return True

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise not_modelled(f"cupy.cuda.Event.{name}")


def get_current_stream(device_id: int = -1) -> _BaseStream:
    """The current stream of this thread on ``device_id`` (default: the current device)."""
    device = launch.current_device() if device_id == -1 else device_id
    return streams.thread.current.get(device) or Stream.null


__getattr__ = module_getattr("cupy.cuda.stream")
