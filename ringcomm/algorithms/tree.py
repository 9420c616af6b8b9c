"""Double binary tree all-reduce, pipelined (after NCCL's trees).

The data is split in two halves. Half 0 is reduced up binary tree A (a heap over ranks: parent of
r is (r-1)//2) and broadcast back down it; half 1 does the same on tree B, the mirror image
(rank r sits where rank n-1-r sits in A). A rank that is interior in one tree is a leaf in the
other, so every rank's links carry about the same load. Each half moves in segments: a node
reduces segment t from its children while it forwards segment t-1 to its parent, so the tree's
depth costs latency once, not once per segment. The two trees run as independent lanes: neither
waits for the other's steps.

Steps: about 2(depth + segments). Bytes sent per rank: about S (S/2 up and S/2 down per tree,
and a rank sends up in one tree, down in the other). Cost: about 2 log2(n) alpha + 2 S beta
+ S gamma plus one alpha per segment and level. Wins over ring at mid sizes as n grows, because
its latency grows with log2(n) instead of n. The root of each tree computes every element of
its half, in the fixed order (node, left child, right child): identical bits everywhere.
"""
from __future__ import annotations

import math

from ..core.schedule import (
    DEFAULT_SEGMENT_BYTES,
    Lanes,
    Recv,
    RecvReduce,
    Send,
    chunk,
    compact,
    segments,
)
from ..selection.cost import Network, log2_ceil
from .base import ScheduleAlgorithm


def heap_links(label: int, size: int) -> tuple:
    parent = (label - 1) // 2 if label else None
    children = [c for c in (2 * label + 1, 2 * label + 2) if c < size]
    return parent, children


def tree_steps(parent, children, off, count, seg, channel) -> list:
    """Pipelined reduce up to the root, then broadcast down, of W[off:off+count]."""
    segs = segments(off, count, seg)
    up, down = [], []
    for t in range(len(segs) + 1):
        ops = []
        if t < len(segs):
            ops += [RecvReduce(c, *segs[t], channel) for c in children]
        if t and parent is not None:
            ops.append(Send(parent, *segs[t - 1], channel))
        up.append(ops)
    for t in range(len(segs) + 1):
        ops = []
        if t < len(segs) and parent is not None:
            ops.append(Recv(parent, *segs[t], channel))
        if t:
            ops += [Send(c, *segs[t - 1], channel) for c in children]
        down.append(ops)
    return compact(up + down)


class TreeAllReduce(ScheduleAlgorithm):
    name = "tree"
    collective = "all_reduce"

    def program(self, rank, shape):
        size, count, seg = shape.size, shape.count, shape.seg
        if size == 1:
            return []
        half_a, half_b = chunk(count, 2, 0), chunk(count, 2, 1)
        parent_a, children_a = heap_links(rank, size)
        # Tree B is tree A with every label l standing for rank n-1-l.
        parent_b, children_b = heap_links(size - 1 - rank, size)
        parent_b = None if parent_b is None else size - 1 - parent_b
        children_b = [size - 1 - c for c in children_b]
        tree_a = tree_steps(parent_a, children_a, *half_a, seg, channel=0)
        tree_b = tree_steps(parent_b, children_b, *half_b, seg, channel=1)
        return Lanes(lane for lane in (tree_a, tree_b) if lane)

    def cost(self, nbytes, net: Network) -> float:
        size, link = net.size, net.link
        if size == 1:
            return 0.0
        depth = log2_ceil(size + 1) - 1
        pieces = max(1, math.ceil(nbytes / 2 / DEFAULT_SEGMENT_BYTES))
        # Two children per interior node: each stage moves twice a segment's bytes into a node.
        stage = link.alpha + 2 * (nbytes / 2 / pieces) * link.beta
        return 2 * (depth + pieces) * stage + (depth + pieces) * (nbytes / 2 / pieces) * 2 * link.gamma
