"""The compiled window round (core/_round.c), where the install built it and RINGCOMM_COMPILED allows.

``pip install`` builds the extension when a C compiler is there (setup.py, ``optional=True``);
without one the install still succeeds and ``available()`` is False: every window all-reduce then
runs the Python round, with the same results, slower by a few microseconds per call.
"""
from __future__ import annotations

from typing import Optional

from .. import env

try:
    from ._round import Core
except ImportError:   # not built (no compiler at install time): the Python round does the work
    Core = None


def available() -> bool:
    """True when the extension was built, whatever RINGCOMM_COMPILED says."""
    return Core is not None


def enabled() -> bool:
    """True when windows made now get the compiled round."""
    return Core is not None and env.get("RINGCOMM_COMPILED")


def core_for(rank: int, regions: list, capacity: int) -> Optional[object]:
    """The compiled round over a window's regions (host arrays laid out as window.py says), or None."""
    if not enabled():
        return None
    return Core(rank, capacity, tuple(region.ctypes.data for region in regions))
