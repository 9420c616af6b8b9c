"""Validation at the public boundary, and flat views of user buffers.

Everything here runs on the calling rank before any communication, so a bad argument raises
locally instead of leaving peers waiting. A ``Buffer`` is a flat, writable view that shares
memory with the user's tensor or array: collectives work in place on it. Host memory (numpy
arrays, CPU tensors) becomes a numpy view; device memory (cupy arrays, CUDA tensors) a cupy
view, through DLPack for torch, so no byte is copied either way.

A buffer's ``device`` is "cpu" or "cuda:<index>": two buffers of one call must agree on it, index
included, and that is checked here, before the call takes a sequence number.
"""
from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass

import numpy as np

from ..errors import bad_type, bad_value
from ..transport.devices import CUPY_INSTALL, is_device_array
from .compiled import array_address
from .ops import DTYPES, DType

_SUPPORTED = ", ".join(DTYPES)


def _torch():
    """torch if the caller has imported it. A tensor can only exist once torch is imported, so
    numpy-only jobs never pay torch's import time (seconds per rank on a small machine)."""
    return sys.modules.get("torch")


@functools.lru_cache(maxsize=None)
def _torch_dtype_names() -> dict:
    torch = _torch()
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
            torch.float64: "float64", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
            torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool"}


@dataclass(slots=True)
class Buffer:
    obj: object          # what the user passed; collectives return it
    flat: np.ndarray     # flat view of obj's memory in its storage dtype
    dtype: DType
    kind: str            # "torch", "numpy" or "cupy"
    device: str          # "cpu" or "cuda:<index>"

    @property
    def numel(self) -> int:
        return self.flat.size

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes


def is_torch(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def as_buffer(x, collective: str, argument: str, read_only: bool = False) -> Buffer:
    """``read_only``: the call only reads this buffer (a send, an out-of-place input), so a
    read-only numpy array is taken, as MPI takes a const send buffer."""
    if type(x) is np.ndarray:   # the common case first: no torch lookup
        return _numpy_buffer(x, collective, argument, read_only)
    if is_torch(x):
        return _torch_buffer(x, collective, argument, not read_only)
    if isinstance(x, np.ma.MaskedArray):   # its views keep the mask: a byte view failed mid-collective
        raise bad_value(collective, argument, "an array without a mask (the mask would be ignored: pass "
                        "x.filled(value), or x.data)", "a numpy.ma.MaskedArray")
    if isinstance(x, np.ndarray):
        return _numpy_buffer(x, collective, argument, read_only)
    if is_device_array(x):
        return _cupy_buffer(x, collective, argument)
    raise bad_type(collective, argument, "a torch.Tensor or numpy.ndarray, or a cupy.ndarray", type(x).__name__)


@functools.lru_cache(maxsize=1)
def version_bumper():
    """What bumps the autograd version counters of a tuple of tensors: torch's C entry, which
    ``torch.autograd.graph.increment_version`` wraps (0.07 us a call against 0.2 through the
    wrapper and this module: a 1 KiB all-reduce on a tensor takes about 2 us), or the wrapper
    where a torch lacks it."""
    torch = _torch()
    return getattr(torch._C, "_increment_version", None) or torch.autograd.graph.increment_version


def mark_written(tensor) -> None:
    """Tell autograd that a call writes ``tensor`` (its version counter), as torch's in-place ops
    and its c10d collectives do. ringcomm writes the memory by address, out of autograd's sight:
    a tensor saved for a backward and then all-reduced in place gave silently wrong gradients,
    where ``x.add_(1)`` makes that backward raise."""
    version_bumper()((tensor,))


def device_index(buf: Buffer) -> int:
    """The CUDA device index of a device buffer ("cuda:3" -> 3)."""
    return int(buf.device[5:])


def _torch_buffer(x, collective: str, argument: str, written: bool = True) -> Buffer:
    name = _torch_dtype_names().get(x.dtype)
    if name is None:
        raise bad_type(collective, argument, f"a tensor of dtype {_SUPPORTED}", f"dtype {x.dtype}")
    try:
        contiguous = x.is_contiguous()
    except RuntimeError:   # sparse CSR, CSC and BSR tensors have no strides to ask about
        contiguous = False
    if not contiguous:
        if x.layout is not _torch().strided:   # a sparse COO tensor says "not contiguous": name the real reason
            raise bad_value(collective, argument, "a dense tensor (call .to_dense() first)", f"a {x.layout} tensor")
        raise bad_value(collective, argument, "a contiguous tensor (call .contiguous() first)",
                        f"a non-contiguous tensor with strides {tuple(x.stride())}")
    if x.is_neg():   # its memory holds the negated values: a max would find the minimum
        raise bad_value(collective, argument, "a tensor without a lazy negation (call .resolve_neg() first)",
                        "a negative view (its neg bit is set, as for x.conj().imag or torch._neg_view(x))")
    if x.is_cpu:
        dtype = DTYPES[name]
        buf = Buffer(x, host_view(x.data_ptr(), x.numel() * dtype.itemsize, dtype.storage), dtype, "torch", "cpu")
    elif x.device.type == "cuda":
        buf = Buffer(x, _cuda_flat(x, name, collective, argument), DTYPES[name], "torch", f"cuda:{x.device.index}")
    else:
        raise bad_value(collective, argument, "a CPU or CUDA tensor", f"a tensor on {x.device}")
    if written:
        mark_written(x)
    return buf


_RAW_TYPES: dict = {}   # nbytes -> ctypes char array type (a type per size; a job uses a handful)


def host_view(ptr: int, nbytes: int, storage: np.dtype) -> np.ndarray:
    """A flat numpy view of host memory at ``ptr``, made from its address. For torch tensors this
    replaces Tensor.numpy(), which costs 4x more and marks the tensor's storage non-resizable for
    good (torch's PowerSGD hook resizes DDP's buckets). The view does not keep the memory alive:
    the Buffer holding it keeps the tensor."""
    if not nbytes:
        return np.empty(0, storage)
    raw = _RAW_TYPES.get(nbytes)
    if raw is None:
        if len(_RAW_TYPES) > 256:
            _RAW_TYPES.clear()
        raw = _RAW_TYPES[nbytes] = ctypes.c_char * nbytes
    return np.frombuffer(raw.from_address(ptr), storage)


def _cuda_flat(x, name: str, collective: str, argument: str):
    """A flat cupy view of a CUDA tensor's memory (DLPack: no copy); bf16 as uint16 bits."""
    try:
        import cupy
    except ImportError:
        raise bad_value(collective, argument, f"a CPU tensor (CUDA tensors need cupy: {CUPY_INSTALL})",
                        f"a tensor on {x.device}") from None
    torch = _torch()
    t = x.detach().reshape(-1)
    if name == "bfloat16":   # cupy has no bfloat16: carry the bits, ops.py widens them
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def _cupy_buffer(x, collective: str, argument: str) -> Buffer:
    dtype = _NUMPY_DTYPES.get(x.dtype)
    if dtype is None or x.dtype.byteorder == ">":
        raise _unsupported_dtype(x, collective, argument)
    if not x.flags.c_contiguous:
        raise bad_value(collective, argument, "a C-contiguous array (use cupy.ascontiguousarray)",
                        f"a non-contiguous array with strides {x.strides}")
    return Buffer(x, x if x.ndim == 1 else x.reshape(-1), dtype, "cupy", f"cuda:{x.device.id}")


def overlaps(a, b) -> bool:
    """Whether two flat contiguous arrays (host or device) share a byte."""
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    start_a, start_b = address(a), address(b)
    return start_a < start_b + b.nbytes and start_b < start_a + a.nbytes and a.nbytes > 0 and b.nbytes > 0


def address(a) -> int:
    """Start address of a flat array's data, host (numpy) or device (cupy)."""
    return array_address(a) if isinstance(a, np.ndarray) else a.data.ptr


# Keyed by numpy dtype (native byte order only): ``x.dtype.name`` costs ~2 us a call, a dict hit 0.1.
_NUMPY_DTYPES = {d.storage: d for name, d in DTYPES.items() if name != "bfloat16"}


def _unsupported_dtype(x, collective: str, argument: str):
    """A numpy or cupy array's dtype that no collective takes. A big-endian float32 is named as
    such: "expected float32, got >f4" read like a contradiction."""
    expected = f"an array of dtype {_SUPPORTED.replace('bfloat16, ', '')}"
    if x.dtype.byteorder == ">" and x.dtype.newbyteorder("=") in _NUMPY_DTYPES:
        return bad_type(collective, argument, f"{expected}, in this machine's byte order (convert with "
                        f"x.astype(x.dtype.newbyteorder('=')))", f"big-endian dtype {x.dtype}")
    return bad_type(collective, argument, expected, f"dtype {x.dtype}")


def _numpy_buffer(x: np.ndarray, collective: str, argument: str, read_only: bool = False) -> Buffer:
    dtype = _NUMPY_DTYPES.get(x.dtype)
    if dtype is None or x.dtype.byteorder == ">":
        raise _unsupported_dtype(x, collective, argument)
    flags = x.flags   # a new flags object per access: fetch it once
    if not flags.c_contiguous:
        raise bad_value(collective, argument, "a C-contiguous array (use np.ascontiguousarray)",
                        f"a non-contiguous array with strides {x.strides}")
    if not flags.writeable and not read_only:
        raise bad_value(collective, argument, "a writable array", "a read-only array")
    return Buffer(x, x if x.ndim == 1 else x.reshape(-1), dtype, "numpy", "cpu")
