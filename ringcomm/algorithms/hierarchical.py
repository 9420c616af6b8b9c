"""Hierarchical all-reduce: reduce-scatter inside each node, ring across nodes, all-gather inside.

With m ranks on every node and N nodes, local rank i of each node:
1. ring reduce-scatter among its node's ranks: it ends owning shard i (S/m bytes) reduced over
   the node;
2. ring all-reduce of shard i with local rank i of every other node (N ranks, one per node), so
   the slow inter-node link carries only S/m per rank, and m such rings run side by side;
3. ring all-gather among its node's ranks.
Every element is computed once, in a fixed order, by one rank (the intra-node owner, then the
inter-node ring's owner) and copied verbatim afterwards: identical bits on every rank.

Unequal nodes (say 3 ranks on one node, 1 on another): only the first m_min = min ranks-per-node
local ranks of each node take part in the three phases. The others ("extras") first send their
whole vector to local rank (i mod m_min), which reduces them in, in ascending rank order, and
get the result back at the end: the fold of recursive doubling, done inside a node where links
are fast. A node layout that is very lopsided is then priced higher and the selector drops it.

Cost (intra link a_i, b_i; inter link a_e, b_e; S bytes; m ranks per node; N nodes):
  (m-1) a_i + (m-1)/m S (b_i + g)                          reduce-scatter in the node
  + 2(N-1) a_e + 2(N-1)/N (S/m) b_e + (N-1)/N (S/m) g      ring all-reduce of the shard
  + (m-1) a_i + (m-1)/m S b_i                              all-gather in the node
  + e (2 a_i + 2 S b_i + S g) with e = ceil((M - m)/m)      folding extras, if M > m
On one node, or one rank per node, this is a flat ring: it then states the ring's cost exactly,
and the selector, which keeps the first of equal candidates in registry order, runs "ring".
Against a flat ring, it pays 2(N-1) + 2(m-1) latencies instead of 2(Nm-1), and only S/m of
each rank's bytes cross nodes: it wins when the inter-node link is much slower than the intra.
"""
from __future__ import annotations

import math

from ..core.schedule import compact, recv_segments, send_segments
from ..core.schedule import Shape, chunk
from ..selection.cost import Link, Network, flat
from . import ring_all_gather, ring_reduce_scatter
from .base import ScheduleAlgorithm
from .ring import RingAllReduce
from .ring_all_gather import RingAllGather
from .ring_reduce_scatter import RingReduceScatter


def node_groups(size: int, nodes) -> list:
    """Ranks of each node, nodes in order of first appearance, ranks ascending."""
    if nodes is None:
        return [list(range(size))]
    if len(nodes) != size:
        raise ValueError(f"node map has {len(nodes)} entries for {size} ranks")
    groups: dict = {}
    for rank, node in enumerate(nodes):
        groups.setdefault(node, []).append(rank)
    return list(groups.values())


def relocate(steps, peers, offset: int = 0, channel: int = 0) -> list:
    """Steps written for ranks 0..k-1 of a sub-group over W[0:n], moved onto the real ranks
    ``peers`` and the range W[offset:offset+n], on ``channel``."""
    return [[op._replace(peer=peers[op.peer], off=op.off + offset, channel=channel) for op in step]
            for step in steps]   # (ring steps of a whole node range use OUT only: no own offsets)


def hierarchical_steps(rank: int, groups: list, off: int, count: int, seg: int, channel: int,
                       cross) -> list:
    """The three phases (plus the fold of extras) for W[off:off+count], as one list of steps.

    ``cross(index, peers, shard_off, shard_count)`` gives this rank's inter-node steps, where
    ``peers`` are the ranks (one per node) that all-reduce the same shard."""
    node = next(g for g in groups if rank in g)
    i, m = node.index(rank), min(len(g) for g in groups)
    if i >= m:   # an extra: hand the vector to its leader, take the result back
        leader = node[i % m]
        return [send_segments(leader, off, count, seg, channel),
                recv_segments(leader, off, count, seg, channel)]
    extras = node[m + i::m]
    leaders = node[:m]
    steps = [recv_segments(e, off, count, seg, channel, reduce=True) for e in extras]
    parts = [chunk(count, m, k) for k in range(m)]
    steps += relocate(ring_reduce_scatter.steps(i, parts, seg), leaders, off, channel)
    # After the ring reduce-scatter local rank i owns chunk i of the node's range.
    shard_off, shard_count = (i * count // m), ((i + 1) * count // m - i * count // m)
    peers = [g[i] for g in groups]
    steps += cross(peers.index(rank), peers, off + shard_off, shard_count)
    steps += relocate(ring_all_gather.steps(i, parts, seg), leaders, off, channel)
    steps += [send_segments(e, off, count, seg, channel) for e in extras]
    return steps


def degenerate(net: Network) -> bool:
    """On one node, or with one rank per node, the phases collapse into a flat algorithm that
    the registry already offers (registered earlier) under its own name."""
    return net.nodes == 1 or max(net.local_sizes) == 1


def node_terms(nbytes: float, net: Network) -> tuple:
    """(shard bytes per rank, seconds of the intra-node phases and the fold, the inter Link as
    each rank sees it while m rings share the node's network cards)."""
    m, big = min(net.local_sizes), max(net.local_sizes)
    intra = net.intra
    inside = RingReduceScatter().cost(nbytes, flat(intra, m)) + RingAllGather().cost(nbytes, flat(intra, m))
    extras = math.ceil((big - m) / m)
    inside += extras * (2 * intra.alpha + 2 * nbytes * intra.beta + nbytes * intra.gamma)
    inter = net.inter
    if net.nics:   # m ranks cross at once through nics cards: each gets a share
        inter = Link(inter.alpha, inter.beta * max(1.0, m / net.nics), inter.gamma, inter.call)
    return nbytes / m, inside, inter


class HierarchicalAllReduce(ScheduleAlgorithm):
    name = "hierarchical"
    collective = "all_reduce"
    topology_aware = True   # program() reads shape.nodes

    def program(self, rank, shape):
        size, count, seg = shape.size, shape.count, shape.seg
        if size == 1 or count == 0:
            return []
        groups = node_groups(size, shape.nodes)

        def cross(k, peers, shard_off, shard_count):
            return relocate(RingAllReduce().program(k, Shape(len(peers), shard_count, seg=seg)), peers, shard_off)
        return compact(hierarchical_steps(rank, groups, 0, count, seg, 0, cross))

    def cost(self, nbytes, net: Network) -> float:
        if degenerate(net):   # the same steps as a flat ring: the same price, and ring wins the tie
            return RingAllReduce().cost(nbytes, net)
        shard, inside, inter = node_terms(nbytes, net)
        return inside + RingAllReduce().cost(shard, flat(inter, net.nodes))
