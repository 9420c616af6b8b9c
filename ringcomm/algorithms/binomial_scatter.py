"""Binomial-tree scatter: binomial gather run backwards.

Relative to the root (v = (r - root) mod n), the subtree of v is the consecutive relative ranks
[v, v + lowbit(v)). The root sends each child the blocks of the child's whole subtree in one
message (straight out of its input when it is rank 0, else out of scratch it first rotated into
relative order); a rank with children receives its subtree's blocks into scratch, keeps its own
and forwards each child's range, largest subtree first; a leaf receives straight into its output.
Steps: 2 per level. Cost: ceil(log2 n) alpha + (n-1)/n S beta (plus the root's rotation).
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, TMP, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm
from .binomial_broadcast import relative
from .binomial_gather import subtree


class BinomialScatter(ScheduleAlgorithm):
    name = "binomial"
    collective = "scatter"
    out_of_place = True
    even_only = True

    def program(self, rank, shape):
        n, m, root, seg = shape.size, shape.count, shape.root, shape.seg
        v, parent, children, *_ = tree = relative(rank, shape)
        real = tree.real
        steps = []
        if parent is None:
            if root == 0:
                src = IN
            else:   # rotate rank order into relative order: relative i is rank (i + root) % n
                src, head = TMP, (n - root) * m
                steps.append([Copy(0, head, TMP, IN, root * m), Copy(head, root * m, TMP, IN, 0)])
        elif children:
            src = TMP
            steps.append(recv_segments(real(parent), 0, subtree(v, n) * m, seg, buf=TMP))
        else:
            return compact([recv_segments(real(parent), 0, m, seg)])
        ops = [Copy(0, m, OUT, src, 0)]
        for c in children:
            ops += send_segments(real(c), (c - v) * m, subtree(c, n) * m, seg, buf=src)
        steps.append(ops)
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return log2_ceil(n) * net.alpha + (n - 1) / n * nbytes * net.beta
