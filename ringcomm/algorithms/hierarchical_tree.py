"""Hierarchical all-reduce with a double binary tree across nodes.

The same three phases as ``hierarchical`` (reduce-scatter inside the node, all-reduce of the
shard across nodes, all-gather inside the node), but the vector is cut in two halves that run as
independent lanes, and the inter-node all-reduce of half 0 climbs binary tree A over the nodes
while half 1 climbs tree B, its mirror (NCCL's double binary tree: a node that is interior in one
tree is a leaf in the other). Each tree is pipelined in segments, so the depth costs latency once.
Its inter-node latency grows with log2(N) rather than N, which is why it beats the ring across
nodes at small and mid sizes once there are many nodes. Identical bits everywhere: each tree's
root computes its half of the shard in a fixed order (node, left child, right child).

Cost: the intra-node phases and fold of ``hierarchical`` plus the double tree's own cost
(``tree.py``) on the shard S/m over N nodes; on one node, or with one rank per node, exactly
the cost of the flat algorithm it then amounts to, which the selector prefers on a tie.
"""
from __future__ import annotations

from ..core.schedule import Lanes, chunk, compact
from ..selection.cost import Network, flat
from .base import ScheduleAlgorithm
from .hierarchical import degenerate, hierarchical_steps, node_groups, node_terms
from .ring import RingAllReduce
from .tree import TreeAllReduce, heap_links, tree_steps


def tree_cross(mirror: bool, seg: int, channel: int):
    """Inter-node steps of a pipelined binary tree over the shard; tree B labels rank k as N-1-k."""
    def cross(k, peers, shard_off, shard_count):
        n = len(peers)
        label = n - 1 - k if mirror else k
        real = (lambda l: peers[n - 1 - l]) if mirror else (lambda l: peers[l])  # noqa: E731
        parent, children = heap_links(label, n)
        return tree_steps(None if parent is None else real(parent), [real(c) for c in children],
                          shard_off, shard_count, seg, channel)
    return cross


class HierarchicalTreeAllReduce(ScheduleAlgorithm):
    name = "hierarchical_tree"
    collective = "all_reduce"
    topology_aware = True

    def program(self, rank, shape):
        size, count, seg = shape.size, shape.count, shape.seg
        if size == 1 or count == 0:
            return []
        groups = node_groups(size, shape.nodes)
        lanes = []
        for half, channel in ((0, 0), (1, 1)):
            off, n = chunk(count, 2, half)
            lanes.append(compact(hierarchical_steps(rank, groups, off, n, seg, channel,
                                                    tree_cross(half == 1, seg, channel))))
        return Lanes(lane for lane in lanes if lane)

    def cost(self, nbytes, net: Network) -> float:
        if degenerate(net):   # one node: two half rings; one rank per node: the flat double tree
            single = RingAllReduce() if net.nodes == 1 else TreeAllReduce()
            return single.cost(nbytes, net)
        shard, inside, inter = node_terms(nbytes, net)
        return inside + TreeAllReduce().cost(shard, flat(inter, net.nodes))
