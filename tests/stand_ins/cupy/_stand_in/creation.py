"""cupy's array functions that ringcomm uses: creation, host transfer, DLPack, memory queries.

New arrays go on the current device (cupy allocates there, whatever the prototype's device).
"""
from __future__ import annotations

import numpy as np

from . import launch, pending
from .array import is_scalar, kernel, ndarray
from .errors import not_modelled

KDL_CPU, KDL_CUDA, KDL_CUDA_MANAGED = 1, 2, 13


def empty(shape, dtype=float, order="C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def zeros(shape, dtype=float, order="C") -> ndarray:
    a = ndarray(shape, dtype, order=order)
    a.fill(0)
    return a


def ones(shape, dtype=float, order="C") -> ndarray:
    a = ndarray(shape, dtype, order=order)
    a.fill(1)
    return a


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None) -> ndarray:
    if subok is not None:
        raise TypeError("subok is not supported yet")
    if not isinstance(prototype, ndarray):
        raise TypeError(f"empty_like: expected a cupy.ndarray, got {type(prototype).__name__}")
    return ndarray(prototype.shape if shape is None else shape, prototype.dtype if dtype is None else dtype)


def zeros_like(prototype, dtype=None, order="K", subok=None, shape=None) -> ndarray:
    a = empty_like(prototype, dtype, order, subok, shape)
    a.fill(0)
    return a


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False) -> ndarray:
    """A device array from a cupy array (copied on the device) or host data (copied in: counted)."""
    if isinstance(obj, ndarray):
        if ndmin > obj.ndim:
            obj = obj.reshape((1,) * (ndmin - obj.ndim) + obj.shape)
        if not copy and (dtype is None or np.dtype(dtype) == obj.dtype) and obj.device.id == launch.current_device():
            return obj
        return obj.copy() if dtype is None or np.dtype(dtype) == obj.dtype else obj.astype(dtype)
    host = np.array(obj, dtype=dtype, order="C" if order in ("K", "A", None) else order, ndmin=ndmin)
    out = ndarray(host.shape, host.dtype)
    launch.run("cupy.array (host to device)", [a for a in (out._access(pending.WRITE),) if a], kernel=False)
    np.copyto(out._v, host)
    launch.count("to_device", host.nbytes)
    return out


def asarray(a, dtype=None, order=None, *, blocking=False) -> ndarray:
    return array(a, dtype, copy=False, order=order, blocking=blocking)


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    host = np.asarray(a, order=order)
    if out is None:
        return host
    out[...] = host
    return out


def from_dlpack(array, *, device=None, copy=None) -> ndarray:
    """Zero-copy import. CPU producers (a torch CPU tensor) are refused as by real cupy; the
    only CUDA producer that can exist beside the stand-in is a stand-in array."""
    if not hasattr(array, "__dlpack_device__"):
        raise not_modelled("cupy.from_dlpack of a raw DLPack capsule")
    dev_type, dev_id = array.__dlpack_device__()
    if device is not None:
        raise NotImplementedError("from_dlpack() does not support device yet.")
    if dev_type == KDL_CPU:
        raise TypeError("CPU arrays cannot be directly imported to CuPy. "
                        "Use `cupy.array(numpy.from_dlpack(input))` instead.")
    if dev_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise TypeError(f"Unsupported array type: {dev_type}")
    if not isinstance(array, ndarray):
        raise not_modelled(f"cupy.from_dlpack of a {type(array).__module__}.{type(array).__name__} "
                           f"(no CUDA library but the stand-in runs here)")
    if copy:
        raise BufferError("copy=True only supported for copy to CPU.")
    # The DLPack handshake orders the consumer's current stream after the producer's current
    # stream; producer and consumer are the same thread's cupy here, so they are one stream.
    return array._derived(array._v)


def _check_pair(a, b, name: str) -> None:
    if not (isinstance(a, ndarray) and isinstance(b, ndarray)):
        raise TypeError(f"{name}: expected cupy arrays, got {type(a).__name__} and {type(b).__name__}")


def shares_memory(a, b, max_work=None) -> bool:
    _check_pair(a, b, "shares_memory")
    if not a.size or not b.size or a._data.mem._mapping is not b._data.mem._mapping:
        return False
    return bool(np.shares_memory(a._v, b._v))   # both view one host buffer: numpy decides exactly


def may_share_memory(a, b, max_work=None) -> bool:
    _check_pair(a, b, "may_share_memory")
    if not a.size or not b.size or a._data.mem._mapping is not b._data.mem._mapping:
        return False
    return bool(np.may_share_memory(a._v, b._v))


def copyto(dst, src, casting="same_kind", where=None) -> None:
    if where is not None:
        raise not_modelled("cupy.copyto(..., where=...)")
    if not isinstance(dst, ndarray):
        raise TypeError(f"copyto: dst must be a cupy.ndarray, got {type(dst).__name__}")
    if not (isinstance(src, ndarray) or is_scalar(src)):
        raise TypeError(f"Unsupported type {type(src)}")
    kernel("cupy.copyto", [src] if isinstance(src, ndarray) else [], [dst])
    np.copyto(dst._v, src._v if isinstance(src, ndarray) else src, casting=casting)
