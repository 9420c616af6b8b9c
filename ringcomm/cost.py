"""The alpha-beta-gamma cost model every algorithm states its time in.

alpha: seconds per message (latency plus per-message software overhead)
beta:  seconds per byte moved over the link
gamma: seconds per byte reduced (a local read-modify-write)
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    alpha: float
    beta: float
    gamma: float


# Defaults measured on a 2-core x86 box over MPICH's shared-memory channel from Python
# (per-message cost includes the Python executor's overhead). `ringcomm.tune` replaces them.
DEFAULT_LINK = Link(alpha=15e-6, beta=1 / 3.0e9, gamma=1 / 5.0e9)


def log2_ceil(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0
