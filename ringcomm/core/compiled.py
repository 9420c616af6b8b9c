"""The compiled window rounds (core/_round.c), where the install built them and RINGCOMM_COMPILED allows.

``pip install`` builds the extension when a C compiler is there (setup.py, ``optional=True``);
without one the install still succeeds and ``available()`` is False: every window collective then
runs its Python rounds, with the same results, slower by a few microseconds per call.
"""
from __future__ import annotations

from typing import Optional

from .. import env

try:
    from ._round import Core
    from ._round import address as _address
    from ._round import transfer   # process_vm_readv/writev without ctypes (transport/shm/cma.py)
except ImportError:   # not built (no compiler at install time): the Python round does the work
    Core = _address = transfer = None


def array_address(a) -> int:
    """Where a numpy array's first element lies: compiled when built (numpy's ``a.ctypes.data``
    costs ~3 us, a fifth of a small send)."""
    return a.ctypes.data if _address is None else _address(a)


def available() -> bool:
    """True when the extension was built, whatever RINGCOMM_COMPILED says."""
    return Core is not None


def enabled() -> bool:
    """True when windows made now get the compiled round."""
    return Core is not None and env.get("RINGCOMM_COMPILED")


def core_for(rank: int, regions: list, capacity: int, pids: Optional[tuple] = None,
             detour: bool = False) -> Optional[object]:
    """The compiled round over a window's regions (host arrays laid out as window.py says), or None.
    ``pids``: each rank's process, where the window's direct reads are CMA reads, which the
    compiled direct round then makes itself; ``detour``: except those whose two sides lie a slow
    distance apart (cma.PeerMemory), which it leaves to the Python road."""
    if not enabled():
        return None
    return Core(rank, capacity, tuple(array_address(region) for region in regions), pids, detour)
