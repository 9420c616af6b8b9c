"""Binomial-tree reduce to a root.

The mirror image of binomial broadcast (root-relative v): rank v reduces in the vectors of
v + 1, v + 2, v + 4, ... (while v has that bit clear), in that order, then sends its partial
result to v - lowbit(v). Every element is reduced in one fixed tree order.
No rank changes its input: the first reduction reads it as the own operand and writes the
accumulator (the output on the root, scratch elsewhere), and a leaf sends its input as it is.
Steps: ceil(log2 n). Cost: ceil(log2 n)(alpha + S beta + S gamma).
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, TMP, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm
from .binomial_broadcast import binomial_links


class BinomialReduce(ScheduleAlgorithm):
    name = "binomial"
    collective = "reduce"
    out_of_place = True

    def program(self, rank, shape):
        size, count, root, seg = shape.size, shape.count, shape.root, shape.seg
        v = (rank - root) % size
        parent, children = binomial_links(v, size)
        real = lambda u: (u + root) % size  # noqa: E731
        acc = OUT if parent is None else TMP
        own = None if (acc == OUT and shape.in_place) else IN
        steps = []
        for c in reversed(children):
            steps.append(recv_segments(real(c), 0, count, seg, reduce=True, buf=acc, own=own, own_off=0))
            own = None   # from the second child on, the accumulator holds the partial result
        if parent is not None:
            steps.append(send_segments(real(parent), 0, count, seg, buf=acc if children else IN))
        elif not children and not shape.in_place:
            steps.append([Copy(0, count, OUT, IN, 0)])
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        return log2_ceil(net.size) * (net.alpha + nbytes * (net.beta + net.gamma))
