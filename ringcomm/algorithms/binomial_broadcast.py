"""Binomial-tree broadcast.

Ranks are renumbered relative to the root (v = (r - root) mod n). Rank v > 0 receives from
v - lowbit(v), then forwards to v + 2^j for each 2^j < lowbit(v), largest subtree first.
Steps: ceil(log2 n) rounds. Bytes sent: S per forwarded child; S beta on each of log2(n) levels.
Cost: ceil(log2 n)(alpha + S beta). Wins for small messages; large ones prefer the pipeline.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ..core.schedule import compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm


class Relative(NamedTuple):
    """A rank's place in the binomial tree of a rooted call (numbered relative to the root)."""
    v: int
    parent: Optional[int]   # relative numbers
    children: list
    root: int
    size: int

    def real(self, u: int) -> int:
        return (u + self.root) % self.size


def relative(rank: int, shape) -> Relative:
    v = (rank - shape.root) % shape.size
    return Relative(v, *binomial_links(v, shape.size), shape.root, shape.size)


def binomial_links(v: int, size: int) -> tuple:
    """(parent, children largest-subtree-first) in root-relative numbering."""
    low = v & -v if v else 1 << log2_ceil(size)
    parent = v - (v & -v) if v else None
    children, mask = [], low >> 1
    while mask:
        if v + mask < size:
            children.append(v + mask)
        mask >>= 1
    return parent, children


class BinomialBroadcast(ScheduleAlgorithm):
    name = "binomial"
    collective = "broadcast"

    def program(self, rank, shape):
        size, count, root, seg = shape.size, shape.count, shape.root, shape.seg
        v = (rank - root) % size
        parent, children = binomial_links(v, size)
        real = lambda u: (u + root) % size  # noqa: E731
        steps = [] if parent is None else [recv_segments(real(parent), 0, count, seg)]
        steps += [send_segments(real(c), 0, count, seg) for c in children]
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        size, link = net.size, net.link
        return log2_ceil(size) * (link.alpha + nbytes * link.beta)
