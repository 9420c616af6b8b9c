"""Hierarchical all-reduce: schedules verified for many node layouts, results right and bitwise
identical on every rank (threads transport with pretend topologies, and under mpirun)."""
import random
import re
import threading

import numpy as np
import pytest

from mpi_util import run_mpi
from ringcomm import algorithms
from ringcomm.algorithms.hierarchical import node_groups
from ringcomm.communicator import Communicator
from ringcomm.selection.cost import Link, Network
from ringcomm.core.schedule import RecvReduce, Send, Shape, verify
from ringcomm.topology import Topology
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld

NAMES = ("hierarchical", "hierarchical_tree")
LAYOUTS = [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1), (0, 1, 1, 1, 2), (0, 0, 0, 0, 1, 1, 1, 1),
           (0, 1, 2, 0, 1, 2), (0, 0, 1, 1, 1, 2, 2, 2, 2), (0,), (0, 1), (5, 5, 3, 3, 3, 3)]
_rng = random.Random(7)
LAYOUTS += [tuple(_rng.randrange(4) for _ in range(_rng.randint(2, 12))) for _ in range(20)]


@pytest.mark.parametrize("name", NAMES)
def test_schedules_pair_up_and_cannot_deadlock_for_any_node_layout(name):
    for nodes in LAYOUTS:
        for count in (0, 1, 5, 101):
            for seg in (2, 1000):
                shape = Shape(len(nodes), count, 0, seg, nodes=nodes)
                verify([algorithms.program("all_reduce", name, r, shape) for r in range(len(nodes))])


def test_only_a_shard_crosses_nodes():
    """2 nodes x 4 ranks: a rank's shard is S/4, and a ring of N=2 nodes sends 2(N-1)/N of it."""
    nodes, count = (0, 0, 0, 0, 1, 1, 1, 1), 4000
    shard = count // 4
    for rank in range(8):
        steps = algorithms.program("all_reduce", "hierarchical", rank, Shape(8, count, 0, count, nodes=nodes))
        crossing = sum(op.count for step in steps for op in step
                       if isinstance(op, Send) and nodes[op.peer] != nodes[rank])
        reduced = sum(op.count for step in steps for op in step if isinstance(op, RecvReduce))
        assert crossing == 2 * (2 - 1) * shard // 2
        assert reduced == 3 * count // 4 + shard // 2   # node reduce-scatter, then half the shard


def run_ranks(nodes, fn):
    """fn(comm) on one thread per rank, each with its own view of the pretend topology."""
    world, out, errors = ThreadsWorld(len(nodes)), {}, {}

    def main(rank):
        comm = Communicator(ThreadsTransport(world, rank), timeout=30, topology=Topology(rank, tuple(nodes)))
        try:
            out[rank] = fn(comm)
        except BaseException as err:   # surfaced below with the rank
            errors[rank] = err
            world.abort(repr(err))
    threads = [threading.Thread(target=main, args=(r,)) for r in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return [out[r] for r in range(len(nodes))]


def contribution(rank, n, dtype):
    return np.random.default_rng(rank).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("nodes", [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1), (0, 0, 1, 1, 1, 2),
                                   (0, 1, 2, 0, 1, 2, 0, 1), (0, 0, 0, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_right_and_bitwise_identical_on_every_rank(name, nodes, dtype):
    n = 1003   # not a multiple of any group size: uneven chunks and shards

    def body(comm):
        x = contribution(comm.rank, n, dtype)
        comm.all_reduce(x, algorithm=name)
        return x
    results = run_ranks(nodes, body)
    expected = sum(contribution(r, n, np.float64) for r in range(len(nodes)))
    for r, x in enumerate(results):
        assert x.tobytes() == results[0].tobytes(), f"rank {r} differs from rank 0"
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-4)


def test_integers_and_tiny_vectors():
    nodes = (0, 0, 1, 1, 1)

    def body(comm):
        out = []
        for n in (0, 1, 2, 7):
            x = np.full(n, comm.rank + 1, np.int64)
            comm.all_reduce(x, algorithm="hierarchical_tree")
            out.append(x.tolist())
        return out
    for got in run_ranks(nodes, body):
        assert got == [[], [15], [15, 15], [15] * 7]


def test_node_groups_follow_first_appearance():
    assert node_groups(5, (3, 1, 3, 1, 2)) == [[0, 2], [1, 3], [4]]
    assert node_groups(3, None) == [[0, 1, 2]]


def test_cost_prices_each_phase_on_its_own_link():
    fast, slow = Link(1e-6, 1 / 100e9, 1 / 50e9), Link(10e-6, 1 / 10e9, 1 / 50e9)
    net = Network(fast, slow, (8, 8, 8, 8))
    ring = algorithms.get("all_reduce", "ring").cost(64 << 20, net)
    hier = algorithms.get("all_reduce", "hierarchical").cost(64 << 20, net)
    assert hier < ring / 3      # a quarter of the inter-node bytes of a ring, about
    lopsided = Network(fast, slow, (7, 1, 8, 8))
    assert algorithms.get("all_reduce", "hierarchical").cost(64 << 20, lopsided) > hier


def test_on_one_node_it_states_the_ring_cost_and_ring_wins_the_tie():
    from ringcomm.selection.selector import Selector
    sel = Selector()
    for nbytes in (1 << 10, 1 << 24):
        choice = sel.explain("all_reduce", nbytes, 4, nodes=(0, 0, 0, 0))
        assert choice.predicted["hierarchical"] == choice.predicted["ring"]
        assert choice.algorithm != "hierarchical"


@pytest.mark.mpi
def test_two_pretend_nodes_of_two_ranks_under_mpirun():
    out = run_mpi(4, "selector_hierarchical.py").stdout
    # Ranks share one stdout pipe: lines can run together, so match the reports, not lines.
    assert sorted(re.findall(r"rank \d+ node \d+ ok", out)) == [f"rank {r} node {r // 2} ok" for r in range(4)]
