"""cupy.ndarray over pretend device memory.

An array is a numpy view (``_v``) of the shared file behind its allocation plus cupy's
``MemoryPointer`` (``data``). The numpy view is the stand-in's private way to do the arithmetic
on the CPU; it never leaves this module's classes. Everything that reads or writes the
memory is a launch (launch.py) on the current stream, so device and ordering rules apply;
everything that only reinterprets it (slices, ``view``, ``reshape``) is metadata, as in cupy.

Conversions to host memory happen only where real cupy does them (``get``, ``asnumpy``,
``item``, ``bool()``, ``repr``), and are counted. Implicit ones (``numpy.asarray``, the buffer
protocol, ``__cuda_array_interface__``/``__dlpack__`` for host consumers such as mpi4py) raise
and are recorded as violations, so device pointers cannot reach MPI or ``torch.from_numpy``.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..cuda import memory as cuda_memory
from . import launch, pending, streams
from .errors import not_modelled, violation

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:   # numpy < 2
    byte_bounds = np.byte_bounds

KDL_CUDA = 2
IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
            "a NumPy array explicitly.")
NO_HOST_ACCESS = ("Accessing a CuPy ndarry on CPU is not allowed except when using system memory "
                  "(on HMM or ATS enabled systems, need to set CUPY_ENABLE_UMP=1) or managed memory")


def is_scalar(x) -> bool:
    return isinstance(x, (numbers.Number, np.generic)) and not isinstance(x, np.ndarray)


def refused(exc_type, message: str):
    """An error real cupy raises for host access too; recorded, so swallowing it cannot hide it."""
    violation(message)
    return exc_type(message)


def _view_over(memptr, shape: tuple, dtype: np.dtype, strides, order: str) -> np.ndarray:
    m = memptr.mem._mapping
    if not int(np.prod(shape, dtype=np.int64)):
        return np.empty(shape, dtype)          # touches no memory, as in cupy
    if m is None:
        raise violation(f"an array of shape {shape} over the null pointer")
    offset = memptr.ptr - m.base
    try:
        if offset < 0:
            raise ValueError("it starts before the allocation")
        return np.ndarray(shape, dtype, buffer=m.file.data, offset=offset, strides=strides, order=order)
    except (TypeError, ValueError) as err:
        raise violation(f"an array of shape {shape} and dtype {dtype} at {memptr.ptr:#x} does not fit "
                        f"in {m!r} ({err})") from None


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, v: np.ndarray, owndata: bool):
        self.c_contiguous, self.f_contiguous, self.owndata = v.flags.c_contiguous, v.flags.f_contiguous, owndata

    def __getitem__(self, name: str) -> bool:
        return getattr(self, name.lower())

    def __repr__(self) -> str:
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n  OWNDATA : {self.owndata}"


def _reshaped_view(v: np.ndarray, shape: tuple) -> np.ndarray | None:
    """``v`` reshaped without a copy, or None when only a copy can have that shape."""
    try:
        return v.reshape(shape, copy=False)          # numpy >= 2.1
    except TypeError:
        w = v.view()
        try:
            w.shape = shape                          # older numpy: refuses when a copy is needed
        except AttributeError:
            return None
        return w
    except ValueError:
        np.empty(v.size, np.int8).reshape(shape)     # a wrong size raises numpy's own error here
        return None


def _basic_index(key) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, slice) or
               (isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, (bool, np.bool_)))
               for k in parts)


class ndarray:
    """ndarray(shape, dtype=float, memptr=None, strides=None, order='C'), on the current
    device unless ``memptr`` says otherwise."""

    __slots__ = ("_base", "_data", "_v")
    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = (int(shape),) if isinstance(shape, (numbers.Integral, np.integer)) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        if memptr is None:
            memptr = cuda_memory.alloc(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self._data, self._base = memptr, None
        self._v = _view_over(memptr, shape, dtype, strides, order)

    # ---- the memory behind it ----------------------------------------------------------------
    def _derived(self, v: np.ndarray) -> ndarray:
        """A new array over ``v``, a numpy view of this array's memory (no copy)."""
        out = ndarray.__new__(ndarray)
        m = self._data.mem._mapping
        delta = 0
        if v.size and self._v.size:
            lo, hi = byte_bounds(v)
            if not (m.file.addr <= lo and hi <= m.file.addr + m.size):
                raise AssertionError("stand-in bug: a view outside its allocation")
            delta = v.ctypes.data - self._v.ctypes.data
        out._v, out._base = v, self if self._base is None else self._base
        out._data = cuda_memory.MemoryPointer(self._data.mem, self._data.ptr - self._data.mem.ptr + delta)
        return out

    def _access(self, kind: int):
        v = self._v
        if not v.size:
            return None
        m = self._data.mem._mapping
        if v.flags.c_contiguous:
            start = self._data.ptr - m.base
            return launch.Access(m, start, start + v.nbytes, kind, self._data.device_id)
        lo, hi = byte_bounds(v)
        return launch.Access(m, lo - m.file.addr, hi - m.file.addr, kind, self._data.device_id)

    # ---- attributes ----------------------------------------------------------------------------
    shape = property(lambda self: self._v.shape)
    dtype = property(lambda self: self._v.dtype)
    size = property(lambda self: self._v.size)
    nbytes = property(lambda self: self._v.nbytes)
    itemsize = property(lambda self: self._v.itemsize)
    ndim = property(lambda self: self._v.ndim)
    strides = property(lambda self: self._v.strides)
    data = property(lambda self: self._data)
    base = property(lambda self: self._base)
    device = property(lambda self: _device(self._data.device_id))
    flags = property(lambda self: _Flags(self._v, self._base is None))

    def __len__(self) -> int:
        if not self._v.ndim:
            raise TypeError("len() of unsized object")
        return self._v.shape[0]

    def __iter__(self):
        if not self._v.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self._v.shape[0]))

    # ---- metadata-only views -------------------------------------------------------------------
    def view(self, dtype=None) -> ndarray:
        if dtype is None or (isinstance(dtype, type) and issubclass(dtype, ndarray)):
            return self._derived(self._v.view())
        return self._derived(self._v.view(dtype))

    def reshape(self, *shape, order="C") -> ndarray:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if order not in ("C", "A"):
            raise not_modelled(f"cupy.ndarray.reshape(order={order!r})")
        v = _reshaped_view(self._v, shape)
        return self.copy().reshape(shape) if v is None else self._derived(v)   # cupy copies if it must

    def ravel(self, order="C") -> ndarray:
        return self.reshape(-1, order=order)

    def flatten(self, order="C") -> ndarray:
        return self.copy(order).reshape(-1)

    def __getitem__(self, key):
        if _basic_index(key):
            parts = key if isinstance(key, tuple) else (key,)
            if not any(k is Ellipsis for k in parts):
                parts += (Ellipsis,)   # integers index to a 0-d array, never a scalar, as in cupy
            return self._derived(self._v[parts])
        if isinstance(key, ndarray):
            picked = self._v[key._v]
            out = ndarray(picked.shape, picked.dtype)
            kernel("cupy.ndarray.__getitem__", [self, key], [out])
            np.copyto(out._v, picked)
            return out
        raise not_modelled(f"cupy.ndarray indexing with {type(key).__name__} (only basic indexing "
                           f"and one cupy array index are modelled)")

    # ---- kernels -------------------------------------------------------------------------------
    def __setitem__(self, key, value) -> None:
        if _basic_index(key):
            self[key]._assign(value)
        elif isinstance(key, ndarray):
            kernel("cupy.ndarray.__setitem__", [key] + ([value] if isinstance(value, ndarray) else []), [self])
            self._v[key._v] = value._v if isinstance(value, ndarray) else value
        else:
            raise not_modelled(f"cupy.ndarray assignment indexed by {type(key).__name__}")

    def _assign(self, value) -> None:
        if isinstance(value, ndarray):
            kernel("cupy.ndarray.__setitem__", [value], [self])
            np.copyto(self._v, value._v, casting="unsafe")
        elif is_scalar(value):
            kernel("cupy.ndarray.__setitem__", [], [self])
            self._v[...] = value
        elif isinstance(value, (np.ndarray, list, tuple)):
            host = np.asarray(value)
            launch.count("to_device", host.nbytes)
            kernel("cupy.ndarray.__setitem__ (from host)", [], [self])
            self._v[...] = host
        else:
            raise TypeError(f"Unsupported type {type(value)}")

    def fill(self, value) -> None:
        kernel("cupy.ndarray.fill", [], [self])
        self._v.fill(value)

    def copy(self, order="C") -> ndarray:
        """A copy on the current device (from any device, as cupy allows)."""
        out = ndarray(self.shape, self.dtype, order="F" if order == "F" else "C")
        launch.run("cupy.ndarray.copy", [a for a in (self._access(pending.READ), out._access(pending.WRITE)) if a],
                   kernel=False)
        np.copyto(out._v, self._v)
        return out

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True) -> ndarray:
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        out = ndarray(self.shape, dtype)
        kernel("cupy.ndarray.astype", [self], [out])
        np.copyto(out._v, self._v, casting=casting or "unsafe")
        return out

    def _reduction(self, name: str, axis, out, keepdims) -> ndarray:
        if axis is not None or out is not None or keepdims:
            raise not_modelled(f"cupy.ndarray.{name} with axis, out or keepdims")
        value = getattr(self._v, name)()
        result = ndarray((), np.asarray(value).dtype)
        kernel(f"cupy.ndarray.{name}", [self], [result])
        result._v[...] = value
        return result

    def all(self, axis=None, out=None, keepdims=False) -> ndarray:
        return self._reduction("all", axis, out, keepdims)

    def any(self, axis=None, out=None, keepdims=False) -> ndarray:
        return self._reduction("any", axis, out, keepdims)

    # ---- explicit host transfers (counted) -----------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        """Copy to the host on ``stream`` (default: the current one), then wait for it."""
        if not blocking:
            raise not_modelled("cupy.ndarray.get(blocking=False)")
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
        state = launch.run("cupy.ndarray.get (device to host)",
                           [a for a in (self._access(pending.READ),) if a], stream=stream, kernel=False)
        if out is None:
            out = np.array(self._v, order=order, copy=True)
        else:
            np.copyto(out, self._v)
        launch.count("to_host", self.nbytes)
        streams.synchronize(state)
        return out

    def set(self, arr, stream=None) -> None:
        """Copy a host array of the same shape and dtype in, on ``stream`` (not waited for)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        launch.run("cupy.ndarray.set (host to device)", [a for a in (self._access(pending.WRITE),) if a],
                   stream=stream, kernel=False)
        np.copyto(self._v, arr)
        launch.count("to_device", arr.nbytes)

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def tobytes(self, order="C") -> bytes:
        return self.get().tobytes(order)

    def __bool__(self) -> bool:
        if self.size == 0:
            return False
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __bytes__(self) -> bytes:
        return bytes(self.get())

    def __repr__(self) -> str:
        return repr(self.get())

    def __str__(self) -> str:
        return str(self.get())

    def __reduce__(self):
        from .creation import array
        return array, (self.get(),)

    def __copy__(self) -> ndarray:
        return self.copy()

    def __deepcopy__(self, memo) -> ndarray:
        return self.copy()

    # ---- implicit host access: refused, as in cupy, and recorded -------------------------------
    def __array__(self, dtype=None, copy=None):
        raise refused(TypeError, IMPLICIT)

    def __buffer__(self, flags):   # Python 3.12+; 3.11 has no buffer protocol for Python classes
        raise refused(TypeError, NO_HOST_ACCESS)

    def __dlpack_device__(self) -> tuple:
        return KDL_CUDA, self._data.device_id

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # Only a host consumer can call this here (no CUDA library runs beside the stand-in):
        # mpi4py, for one, would hand the device pointer to MPI, which is not CUDA-aware here.
        raise violation(f"cupy.ndarray.__dlpack__ called: a DLPack consumer asked for device memory "
                        f"(device {self._data.device_id}, {self.nbytes} bytes). mpi4py would give the "
                        f"device pointer to MPI, which is only right with a CUDA-aware MPI; numpy and "
                        f"CPU torch cannot use it. Copy to the host explicitly (.get()) or keep it on "
                        f"the device")

    @property
    def __cuda_array_interface__(self):
        raise violation("cupy.ndarray.__cuda_array_interface__ read: a consumer asked for a raw device "
                        "pointer (mpi4py, for one, would give it to a non-CUDA-aware MPI)")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise not_modelled(f"cupy.ndarray.{name}")


ndarray.__module__ = "cupy"


def _device(device_id: int):
    from ..cuda.device import Device
    return Device(device_id)


def kernel(what: str, reads, writes) -> None:
    """One kernel on the current stream: device checks, ordering checks, pending accesses."""
    accesses = [a._access(pending.READ) for a in reads] + [a._access(pending.WRITE) for a in writes]
    launch.run(what, [a for a in accesses if a is not None])
