"""Folding a non-power-of-two world into a power of two, for the doubling/halving algorithms.

With p the largest power of two <= n, rank p+i (an "extra") first sends its whole vector to
rank i, which reduces it in; the p "core" ranks run the power-of-two algorithm; at the end rank i
sends the result back to rank p+i. Costs 2 alpha + 2 S beta + S gamma on the extra pairs.
"""
from __future__ import annotations

from ..core.schedule import recv_segments, send_segments
from ..selection.cost import Link, pow2_floor


def fold(rank: int, size: int, count: int, seg: int) -> tuple:
    """(steps before, steps after, core rank or None, core size)."""
    p = pow2_floor(size)
    if rank >= p:
        return [send_segments(rank - p, 0, count, seg)], [recv_segments(rank - p, 0, count, seg)], None, p
    if rank < size - p:
        return ([recv_segments(rank + p, 0, count, seg, reduce=True)],
                [send_segments(rank + p, 0, count, seg)], rank, p)
    return [], [], rank, p


def fold_cost(nbytes: int, size: int, link: Link) -> float:
    if size == pow2_floor(size):
        return 0.0
    return 2 * link.alpha + 2 * nbytes * link.beta + nbytes * link.gamma
