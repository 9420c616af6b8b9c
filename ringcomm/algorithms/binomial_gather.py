"""Binomial-tree gather.

Ranks are numbered relative to the root (v = (r - root) mod n), as in binomial broadcast. The
subtree of v holds the consecutive relative ranks [v, v + lowbit(v)) (cut at n), so a rank can
collect its subtree's blocks in one contiguous scratch range: its own block, then each child's
subtree as the child sends it in one message; then it sends the whole range to its parent. The
root receives straight into its output when it is rank 0 (relative order is rank order), else
into scratch that it rotates into rank order at the end.
Steps: 2 per level. Bytes: the root receives (n-1)/n S; a rank at depth d forwards its subtree.
Cost: ceil(log2 n) alpha + (n-1)/n S beta (plus the root's rotation when root != 0).
"""
from __future__ import annotations

from ..core.schedule import IN, OUT, TMP, Copy, compact, recv_segments, send_segments
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm
from .binomial_broadcast import relative


def subtree(v: int, size: int) -> int:
    """Number of relative ranks in v's subtree (v's own included)."""
    if v == 0:
        return size
    return min(v & -v, size - v)


class BinomialGather(ScheduleAlgorithm):
    name = "binomial"
    collective = "gather"
    out_of_place = True
    even_only = True

    def program(self, rank, shape):
        n, m, root, seg = shape.size, shape.count, shape.root, shape.seg
        v, parent, children, *_ = tree = relative(rank, shape)
        real = tree.real
        if parent is None and root == 0:
            acc = OUT   # relative order is rank order: receive in place
        else:
            acc = TMP if children or parent is None else None
        if acc is None:   # a leaf: its block is its whole subtree
            return compact([send_segments(real(parent), 0, m, seg, buf=IN)])
        gather = [Copy(0, m, acc, IN, 0)]
        for c in children:
            gather += recv_segments(real(c), (c - v) * m, subtree(c, n) * m, seg, buf=acc)
        steps = [gather]
        if parent is not None:
            steps.append(send_segments(real(parent), 0, subtree(v, n) * m, seg, buf=TMP))
        elif acc == TMP:   # rotate relative order into rank order: relative i is rank (i + root) % n
            head = (n - root) * m
            steps.append([Copy(root * m, head, OUT, TMP, 0), Copy(0, root * m, OUT, TMP, head)])
        return compact(steps)

    def cost(self, nbytes, net: Network) -> float:
        n = net.size
        return log2_ceil(n) * net.alpha + (n - 1) / n * nbytes * net.beta
