"""Binomial-tree reduce to a root.

The mirror image of binomial broadcast (root-relative v): rank v reduces in the vectors of
v + 1, v + 2, v + 4, ... (while v has that bit clear), in that order, then sends its partial
result to v - lowbit(v). Every element is reduced in one fixed tree order.
Steps: ceil(log2 n). Cost: ceil(log2 n)(alpha + S beta + S gamma).
"""
from __future__ import annotations

from ..core.schedule import compact, recv_segments, send_segments
from ..selection.cost import Link, log2_ceil
from .base import Algorithm
from .binomial_broadcast import binomial_links


class BinomialReduce(Algorithm):
    name = "binomial"
    collective = "reduce"

    def program(self, rank, size, count, root, seg):
        v = (rank - root) % size
        parent, children = binomial_links(v, size)
        real = lambda u: (u + root) % size  # noqa: E731
        steps = [recv_segments(real(c), 0, count, seg, reduce=True) for c in reversed(children)]
        if parent is not None:
            steps.append(send_segments(real(parent), 0, count, seg))
        return compact(steps)

    def cost(self, nbytes, size, link: Link) -> float:
        return log2_ceil(size) * (link.alpha + nbytes * (link.beta + link.gamma))
