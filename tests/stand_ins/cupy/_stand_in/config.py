"""The stand-in's settings, read once from the environment when cupy is first imported (as the
CUDA runtime reads CUDA_VISIBLE_DEVICES once). Names start with STAND_IN_CUPY_, never
RINGCOMM_ (ringcomm refuses RINGCOMM_ variables it does not know) nor CUPY_ (real cupy's)."""
from __future__ import annotations

import os

DEVICES_VARIABLE = "STAND_IN_CUPY_DEVICES"
DEVICE_BYTES_VARIABLE = "STAND_IN_CUPY_DEVICE_BYTES"
PEER_ACCESS_VARIABLE = "STAND_IN_CUPY_PEER_ACCESS"
SYNC_DELAY_VARIABLE = "STAND_IN_CUPY_SYNC_DELAY"


def _integer(name: str, default: int, low: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected an integer >= {low}") from None
    if value < low:
        raise ValueError(f"{name}={text!r}: expected an integer >= {low}")
    return value


def _seconds(name: str) -> float:
    text = os.environ.get(name, "0")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 10.0:
        raise ValueError(f"{name}={text!r}: expected seconds between 0 and 10")
    return value


# How many pretend GPUs every process of the job sees (0: none, getDeviceCount raises).
DEVICES = _integer(DEVICES_VARIABLE, 2, 0)
# What one process may hold per device before malloc fails with cudaErrorMemoryAllocation.
DEVICE_BYTES = _integer(DEVICE_BYTES_VARIABLE, 4 << 30, 1)
# 0 (default): devices cannot access each other's memory, as on GPUs without P2P; cupy then
# raises ValueError for a kernel whose array is on another device than the current one.
# 1: they can (NVLink, P2P over PCIe); cupy then only warns (PerformanceWarning).
PEER_ACCESS = bool(_integer(PEER_ACCESS_VARIABLE, 0, 0))
# Seconds a synchronisation takes before the work counts as complete: widens the window in
# which a peer that reads too early (before the writer's sync) is caught.
SYNC_DELAY = _seconds(SYNC_DELAY_VARIABLE)
