"""Put the CPU stand-in for cupy (tests/stand_ins/cupy) where ``import cupy`` finds it, but only
when the real cupy is not importable: the real one is always preferred.

- ``installed()``: in this process, for the length of a ``with`` block. The stand-in's modules
  enter ``sys.modules`` on entry and leave it on exit (one stand-in state per process, kept
  for the next block), so tests that run later and expect no cupy still see none.
- ``job_env()``: the environment for an ``mpirun`` job (``mpi_util.run_mpi(..., env=...)``):
  PYTHONPATH with the stand-in first, and the number of pretend devices.

``force=True`` gives the stand-in even where real cupy exists (the stand-in's own tests).
What the stand-in models and what it proves: tests/stand_ins/README.md.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
DEVICES_VARIABLE = "STAND_IN_CUPY_DEVICES"   # as in stand_ins/cupy/_stand_in/config.py


def _without_stand_in(path: str) -> str:
    return os.pathsep.join(p for p in path.split(os.pathsep)
                           if p and Path(p).resolve() != STAND_INS)


@functools.cache
def real_cupy_importable() -> bool:
    """Whether ``import cupy`` succeeds here without the stand-in (asked in a fresh interpreter,
    so a real cupy is never half-imported into this one)."""
    env = dict(os.environ, PYTHONPATH=_without_stand_in(os.environ.get("PYTHONPATH", "")))
    code = "import cupy, sys; sys.exit(0 if not getattr(cupy, 'IS_STAND_IN', False) else 1)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def uses_stand_in(force: bool = False) -> bool:
    return force or not real_cupy_importable()


def job_env(devices: int = 2, *, force: bool = False, env: dict | None = None) -> dict:
    """Variables for an mpirun job whose ranks ``import cupy``: the stand-in first on
    PYTHONPATH (with the repository after it, as run_mpi sets) unless real cupy is importable."""
    out = dict(env or {})
    if not uses_stand_in(force):
        return out
    rest = out.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STAND_INS), str(ROOT), _without_stand_in(rest)]))
    out[DEVICES_VARIABLE] = str(devices)
    return out


_stash: dict = {}            # the stand-in's modules while no block uses them
_devices: list = []          # the device count the stand-in was first loaded with


def _is_cupy(name: str) -> bool:
    return name == "cupy" or name.startswith("cupy.")


@contextlib.contextmanager
def installed(devices: int = 2, *, force: bool = False):
    """``import cupy`` gives the stand-in (or the real cupy, when importable and not ``force``)
    inside the block; yields the module. On a clean exit, violations the stand-in recorded and
    nobody took fail the block: they are undefined behaviour some code swallowed."""
    if not uses_stand_in(force):
        yield importlib.import_module("cupy")
        return
    if _devices and _devices[0] != devices:
        raise ValueError(f"the stand-in was loaded with {_devices[0]} devices in this process; a "
                         f"different count ({devices}) needs a new process (job_env)")
    saved = {k: sys.modules.pop(k) for k in [k for k in sys.modules if _is_cupy(k)]}
    if _stash:
        sys.modules.update(_stash)
    else:
        previous = os.environ.get(DEVICES_VARIABLE)
        os.environ[DEVICES_VARIABLE] = str(devices)
        sys.path.insert(0, str(STAND_INS))
        try:
            importlib.import_module("cupy")
        finally:
            sys.path.remove(str(STAND_INS))
            if previous is None:
                del os.environ[DEVICES_VARIABLE]
            else:
                os.environ[DEVICES_VARIABLE] = previous
        _devices.append(devices)
    module = sys.modules["cupy"]
    try:
        try:
            yield module
        except BaseException:
            module.stand_in.take_violations()   # this block fails anyway; do not blame the next
            raise
        left = module.stand_in.take_violations()
        if left:
            raise AssertionError("the cupy stand-in recorded violations that no one took (an except "
                                 "clause swallowed them?):\n" + "\n".join(left))
    finally:
        _stash.clear()
        _stash.update({k: sys.modules.pop(k) for k in [k for k in sys.modules if _is_cupy(k)]})
        sys.modules.update(saved)
