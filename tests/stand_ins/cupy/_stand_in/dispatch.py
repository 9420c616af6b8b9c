"""Elementwise ufuncs, arithmetic operators, and numpy's dispatch protocols for cupy arrays.

As in real cupy, ``numpy.add(a, b, out=c)`` on cupy arrays reaches ``cupy.add`` through
``__array_ufunc__`` (NEP 13), and ``numpy.empty_like(a)`` reaches ``cupy.empty_like`` through
``__array_function__`` (NEP 18). A ufunc is one kernel on the current device and stream;
numpy arrays as operands are refused (``TypeError: Unsupported type``), since cupy never
copies host data in implicitly. What is not modelled raises NotModelledError naming it.
"""
from __future__ import annotations

import numpy as np

from . import creation
from .array import is_scalar, kernel, ndarray
from .errors import not_modelled


class ufunc:
    """cupy.ufunc: the numpy ufunc of the same name, run as one kernel."""

    def __init__(self, np_ufunc: np.ufunc):
        self._np, self.__name__, self.nin, self.nout = np_ufunc, np_ufunc.__name__, np_ufunc.nin, np_ufunc.nout

    def __repr__(self) -> str:
        return f"<ufunc '{self.__name__}'>"

    def __call__(self, *args, out=None, dtype=None, casting="same_kind", **kwargs):
        if kwargs:
            raise not_modelled(f"cupy.{self.__name__}(..., {', '.join(kwargs)}=...)")
        if len(args) == self.nin + 1 and out is None:
            *args, out = args
        if len(args) != self.nin:
            raise TypeError(f"Wrong number of arguments for {self.__name__}: {len(args)} given, {self.nin} expected")
        if isinstance(out, tuple):
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            out = out[0]
        if out is not None and not isinstance(out, ndarray):
            raise TypeError(f"Output argument must be cupy.ndarray, got {type(out).__name__}")
        hosts = []
        for a in args:
            if isinstance(a, ndarray):
                hosts.append(a._v)
            elif is_scalar(a):
                hosts.append(a)
            else:
                raise TypeError(f"Unsupported type {type(a)}")
        arrays = [a for a in args if isinstance(a, ndarray)]
        what = f"cupy.{self.__name__}"
        if out is not None:
            kernel(what, arrays, [out])
            self._np(*hosts, out=out._v, dtype=dtype, casting=casting)
            return out
        value = np.asarray(self._np(*hosts, dtype=dtype, casting=casting))
        result = ndarray(value.shape, value.dtype)
        kernel(what, arrays, [result])
        np.copyto(result._v, value)
        return result


_MODELLED = ("add", "subtract", "multiply", "divide", "true_divide", "floor_divide", "remainder",
             "power", "negative", "positive", "absolute", "minimum", "maximum", "fmin", "fmax",
             "left_shift", "right_shift", "bitwise_and", "bitwise_or", "bitwise_xor", "invert",
             "isnan", "isinf", "isfinite", "equal", "not_equal", "less", "less_equal", "greater",
             "greater_equal", "logical_and", "logical_or", "logical_not", "sqrt")
UFUNCS = {name: ufunc(getattr(np, name)) for name in _MODELLED}
for _name in _MODELLED:   # numpy names true_divide "divide": index both
    UFUNCS.setdefault(getattr(np, _name).__name__, UFUNCS[_name])


def _binary(uf: ufunc):
    return (lambda self, other: uf(self, other),
            lambda self, other: uf(other, self),
            lambda self, other: uf(self, other, out=self))


_OPERATORS = {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide",
              "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "lshift": "left_shift",
              "rshift": "right_shift", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}
for _op, _name in _OPERATORS.items():
    _f, _r, _i = _binary(UFUNCS[_name])
    setattr(ndarray, f"__{_op}__", _f)
    setattr(ndarray, f"__r{_op}__", _r)
    setattr(ndarray, f"__i{_op}__", _i)


def _comparison(uf: ufunc):
    def compare(self, other):
        if not (isinstance(other, (ndarray, np.ndarray)) or is_scalar(other)):
            return NotImplemented
        return uf(self, other)
    return compare


for _op, _name in {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                   "gt": "greater", "ge": "greater_equal"}.items():
    setattr(ndarray, f"__{_op}__", _comparison(UFUNCS[_name]))
for _op, _name in {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}.items():
    setattr(ndarray, f"__{_op}__", (lambda uf: lambda self: uf(self))(UFUNCS[_name]))


def _array_ufunc(self, np_ufunc, method, *inputs, **kwargs):
    if method != "__call__":
        raise not_modelled(f"numpy.{np_ufunc.__name__}.{method} on cupy arrays")
    mine = UFUNCS.get(np_ufunc.__name__)
    if mine is None:
        raise not_modelled(f"cupy.{np_ufunc.__name__} (numpy.{np_ufunc.__name__} on cupy arrays)")
    for x in inputs + tuple(kwargs.get("out") or ()):
        if not (isinstance(x, (ndarray, np.ndarray)) or is_scalar(x)):
            return NotImplemented
    return mine(*inputs, **kwargs)


FUNCTIONS = {np.empty_like: creation.empty_like, np.zeros_like: creation.zeros_like,
             np.shares_memory: creation.shares_memory, np.may_share_memory: creation.may_share_memory,
             np.copyto: creation.copyto}


def _array_function(self, func, types, args, kwargs):
    mine = FUNCTIONS.get(func)
    if mine is None:
        raise not_modelled(f"cupy.{func.__name__} (numpy.{func.__name__} on cupy arrays)")
    return mine(*args, **kwargs)


ndarray.__array_ufunc__ = _array_ufunc
ndarray.__array_function__ = _array_function
