"""2 pretend nodes x 2 ranks (RINGCOMM_NODE_ID from the MPI rank, set before ringcomm starts):
hierarchical all-reduce right, bitwise identical on every rank, and chosen by the selector when
the inter-node link is slow."""
import os

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{rank // 2}"

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402
from ringcomm.selection.selector import Selector  # noqa: E402
from ringcomm.selection.tuning import Tuning  # noqa: E402

comm = ringcomm.init()
assert comm.topology.node_of == (0, 0, 1, 1), comm.topology
assert comm.topology.node == rank // 2
for name in ("hierarchical", "hierarchical_tree"):
    for n in (1, 1001, 300_000):
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
        comm.all_reduce(x, algorithm=name)
        expected = sum(np.random.default_rng(r).standard_normal(n) for r in range(comm.size))
        np.testing.assert_allclose(x, expected, rtol=1e-4, atol=1e-4)
        digest = np.frombuffer(x.tobytes(), np.uint8).astype(np.uint64).sum() + n
        everyone = np.zeros(comm.size, np.float64)
        everyone[comm.rank] = float(digest)
        comm.all_reduce(everyone, algorithm="ring")
        assert (everyone == everyone[0]).all(), (name, n, everyone)
        seen = np.array(x[:64], copy=True)
        comm.broadcast(seen, root=0)
        assert seen.tobytes() == x[:64].tobytes(), (name, n)

# A slow inter-node link: the selector itself must pick a hierarchical schedule for big messages.
comm.selector = Selector(tuning=Tuning(links={"mpi": (5e-6, 1 / 3e9), "slow": (50e-6, 1 / 0.1e9)}))


class SlowBetweenNodes:
    """Stands in for a transport whose inter-node link is the slow one (the selector reads names)."""
    name = "composite"
    link_names = {"intra": "mpi", "inter": "slow"}


pick = comm.selector.choose("all_reduce", 8 << 20, comm.size, nodes=comm.topology.node_of,
                            transport=SlowBetweenNodes())
assert pick.startswith("hierarchical"), pick
x = np.ones(1 << 20, np.float64)
comm.all_reduce(x)
assert (x == comm.size).all()
print(f"rank {comm.rank} node {comm.topology.node} ok", flush=True)
