"""Controls of the cupy stand-in, for tests. Real cupy has no such module: ``cupy.IS_STAND_IN``
tells code which cupy it has.

Violations (undefined behaviour a GPU would not report) are raised where they happen and also
recorded per process. Whatever is still recorded when the process exits is printed to stderr
and the process exits with status VIOLATION_EXIT_STATUS, so a violation that some ``except``
swallowed still fails the mpirun job; in-process tests take them with ``take_violations``.
"""
from __future__ import annotations

import atexit
import os
import sys

from ._stand_in import config, errors, launch, memory, pending
from ._stand_in.errors import CUDARuntimeError, NotModelledError, StandInViolation

DEVICES_VARIABLE = config.DEVICES_VARIABLE
DEVICE_BYTES_VARIABLE = config.DEVICE_BYTES_VARIABLE
PEER_ACCESS_VARIABLE = config.PEER_ACCESS_VARIABLE
SYNC_DELAY_VARIABLE = config.SYNC_DELAY_VARIABLE
VIOLATION_EXIT_STATUS = 86

__all__ = ["CUDARuntimeError", "NotModelledError", "StandInViolation", "host_copies",
           "live_allocations", "pending_accesses", "reset_host_copies", "take_violations", "violations"]


def host_copies() -> dict:
    """Bytes and calls moved between host and device by this process since the last reset:
    {"to_host_bytes", "to_host_calls", "to_device_bytes", "to_device_calls"}."""
    return launch.host_copies()


def reset_host_copies() -> None:
    launch.reset_host_copies()


def violations() -> list[str]:
    return errors.recorded()


def take_violations() -> list[str]:
    """The violations recorded in this process so far; they are forgotten."""
    return errors.take_recorded()


def live_allocations(kind: str | None = None) -> list[str]:
    """Device memory this process holds: kind "malloc" (runtime.malloc, never freed yet),
    "pool" (owned by cupy arrays), "ipc" (opened from peers, not closed yet), or all."""
    return [repr(m) for m in memory.live(kind)]


def pending_accesses(array) -> list[tuple]:
    """(pid, stream key, launch number, "read"/"write", start, end) rows pending on the
    allocation behind a cupy array, for debugging a reported race."""
    m = array.data.mem._mapping
    if m is None:
        return []
    with m.file.locked() as h:
        return [(r[0], r[1], r[2], pending.KIND_NAMES[r[3]], r[4], r[5]) for r in pending.load(h)]


def _fail_on_unreported_violations() -> None:
    left = errors.take_recorded()
    if left:
        sys.stderr.write(f"cupy stand-in: process {os.getpid()} exits with {len(left)} recorded "
                         f"violation(s) nobody took:\n" + "".join(f"  - {v}\n" for v in left))
        sys.stderr.flush()
        os._exit(VIOLATION_EXIT_STATUS)


atexit.register(_fail_on_unreported_violations)
