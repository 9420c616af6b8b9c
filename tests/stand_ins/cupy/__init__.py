"""A CPU stand-in for cupy (13.x), for testing ringcomm's CUDA code paths without a GPU.

It proves that code paths run and that misuse is caught; it is no evidence that anything works
on a real GPU. What it models and what it does not: tests/stand_ins/README.md. Controls for
tests (violations, host-copy counters): ``cupy.stand_in``. Anything of real cupy's that is
not modelled raises NotModelledError (an ImportError) naming it.
"""
from __future__ import annotations

from numpy import (bool_, complex64, complex128, dtype, float16, float32, float64, int8, int16,
                   int32, int64, intp, newaxis, uint8, uint16, uint32, uint64, uintp)

from . import cuda
from ._stand_in import dispatch
from ._stand_in.array import ndarray
from ._stand_in.creation import (array, asarray, asnumpy, copyto, empty, empty_like, from_dlpack,
                                 may_share_memory, ones, shares_memory, zeros, zeros_like)
from ._stand_in.dispatch import ufunc
from ._stand_in.errors import module_getattr
from . import stand_in

__version__ = "13.6.0+stand-in"
IS_STAND_IN = True

globals().update(dispatch.UFUNCS)   # cupy.add, cupy.minimum, ... (numpy's names)

__all__ = ["array", "asarray", "asnumpy", "bool_", "complex64", "complex128", "copyto", "cuda",
           "dtype", "empty", "empty_like", "float16", "float32", "float64", "from_dlpack", "int8",
           "int16", "int32", "int64", "intp", "may_share_memory", "ndarray", "newaxis", "ones",
           "shares_memory", "stand_in", "uint8", "uint16", "uint32", "uint64", "uintp", "ufunc",
           "zeros", "zeros_like", *dispatch.UFUNCS]

__getattr__ = module_getattr("cupy")
