"""Device (CUDA) memory: recognised without importing cupy, and cupy itself, imported on demand.

ringcomm reaches device memory through cupy only: cupy arrays directly, CUDA tensors as cupy
views (DLPack). Importing ringcomm never imports cupy; the first device buffer does.
"""
from __future__ import annotations

import importlib.util

from ..errors import CommError

# Which wheel matches the machine's CUDA (README, docs/gpu.md): cupy-cuda12x or cupy-cuda13x.
CUPY_INSTALL = "pip install 'ringcomm[cuda12]' or 'ringcomm[cuda13]' (cupy-cuda12x / cupy-cuda13x)"


def is_device_array(a) -> bool:
    """True for cupy arrays, without importing cupy."""
    return type(a).__module__.startswith("cupy")


def cupy_installed() -> bool:
    """Whether cupy can be imported (without importing it: that starts CUDA)."""
    return importlib.util.find_spec("cupy") is not None


def cupy_module():
    """The cupy module, or CommError saying why device memory cannot be used here."""
    try:
        import cupy
    except ImportError as err:
        raise CommError(f"CUDA IPC needs cupy ({CUPY_INSTALL}): {err}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:   # cupy raises CUDARuntimeError without a driver
        raise CommError(f"CUDA IPC needs a CUDA device: {err}") from None
    if count < 1:
        raise CommError("CUDA IPC needs a CUDA device: none found")
    return cupy
