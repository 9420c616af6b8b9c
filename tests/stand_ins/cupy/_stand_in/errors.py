"""The three ways the stand-in says no.

- ``CUDARuntimeError``: what real cupy raises when the CUDA runtime returns an error; the same
  class name, status numbers and ``"cudaErrorX: text"`` message, with a ``[stand-in: ...]`` note
  saying why when that helps.
- ``StandInViolation``: undefined behaviour on a real GPU (a race between streams, memory freed
  while a peer still maps it, a device pointer given to host code). A GPU would give wrong data
  or crash some of the time; the stand-in raises every time and also *records* the violation,
  so code that swallows exceptions (``except Exception``) cannot hide it: the test fixture and
  the exit hook turn every recorded violation into a failure.
- ``NotModelledError`` (an ``ImportError``): real cupy has the attribute but the stand-in does
  not model it, so a gap shows up as a failure rather than a silent fallback.
"""
from __future__ import annotations

import threading

_ERRORS = {
    1: ("cudaErrorInvalidValue", "invalid argument"),
    2: ("cudaErrorMemoryAllocation", "out of memory"),
    17: ("cudaErrorInvalidDevicePointer", "invalid device pointer"),
    100: ("cudaErrorNoDevice", "no CUDA-capable device is detected"),
    101: ("cudaErrorInvalidDevice", "invalid device ordinal"),
    201: ("cudaErrorDeviceUninitialized", "invalid device context"),
    217: ("cudaErrorPeerAccessUnsupported", "peer access is not supported between these two devices"),
    400: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    700: ("cudaErrorIllegalAddress", "an illegal memory access was encountered"),
}
INVALID_VALUE, MEMORY_ALLOCATION, INVALID_DEVICE_POINTER = 1, 2, 17
NO_DEVICE, INVALID_DEVICE, INVALID_CONTEXT = 100, 101, 201
PEER_ACCESS_UNSUPPORTED, INVALID_HANDLE, ILLEGAL_ADDRESS = 217, 400, 700


class CUDARuntimeError(RuntimeError):
    """cupy_backends.cuda.api.runtime.CUDARuntimeError: ``status`` is the cudaError_t number."""

    def __init__(self, status: int, detail: str | None = None):
        self.status, self.detail = status, detail
        name, text = _ERRORS.get(status, ("cudaErrorUnknown", "unknown error"))
        super().__init__(f"{name}: {text}" + (f" [stand-in: {detail}]" if detail else ""))

    def __reduce__(self):
        return type(self), (self.status, self.detail)


class StandInViolation(RuntimeError):
    """Undefined behaviour on a real GPU, caught by the stand-in (and recorded)."""


class NotModelledError(ImportError):
    """Real cupy has this, the stand-in does not model it."""


_log: list[str] = []
_log_lock = threading.Lock()


def violation(message: str) -> StandInViolation:
    """Record ``message`` and return the exception for the caller to raise."""
    with _log_lock:
        _log.append(message)
    return StandInViolation(message)


def recorded() -> list[str]:
    with _log_lock:
        return list(_log)


def take_recorded() -> list[str]:
    """Every violation recorded so far in this process, and forget them."""
    with _log_lock:
        taken = list(_log)
        _log.clear()
    return taken


def not_modelled(name: str) -> NotModelledError:
    return NotModelledError(
        f"{name} is not modelled by the cupy stand-in (tests/stand_ins/cupy): real cupy has it, "
        f"but the stand-in only implements what ringcomm uses. Model it faithfully there (see "
        f"tests/stand_ins/README.md), or do not use it")


def module_getattr(module_name: str):
    """A module ``__getattr__`` that names the unmodelled attribute. Dunder names stay an
    AttributeError, which Python's own machinery (pickle, inspect, import) relies on."""
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        raise not_modelled(f"{module_name}.{name}")
    return __getattr__
