"""Splits of a job that spans nodes: a split whose members all sit on one node gets that node's
shared window, so its small collectives take the one-shot road (it once ran recursive doubling
over point-to-point: 1 KiB all-reduce 600 us instead of 3 us here); a split that reaches off the
node gets none and takes no window slot. Ranks pretend to sit on two nodes (even ranks on one,
odd on the other), set before ringcomm starts. Every result is checked exactly.

    mpirun -n 4 python node_split.py      (prints "node-split ok" on rank 0)
"""
import os

os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{int(os.environ.get('PMI_RANK', 0)) % 2}"

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402

world = ringcomm.init()
rank, size = world.rank, world.size
assert world.node_count == 2, world.node_count


def chosen(comm) -> str:
    """The algorithm the communicator's latest collective ran (its flight recorder says)."""
    return comm.recorder.entries[-1].algorithm


def check_all_reduce(comm, members, count):
    x = np.arange(count, dtype=np.float32) + 10 * rank
    comm.all_reduce(x)
    expected = sum(np.arange(count, dtype=np.float32) + 10 * r for r in members)
    assert np.array_equal(x, expected), (rank, members, count)


on_node = world.split(rank % 2)                     # the ranks of this rank's node
across = world.split(int(rank < 2), key=-rank)      # {1, 0} and {3, 2}: one rank of each node
nested = on_node.split(0).dup()                     # a split of a split, then a dup: still one node
node_members = [r for r in range(size) if r % 2 == rank % 2]
across_members = [r for r in reversed(range(size)) if (r < 2) == (rank < 2)]   # ordered by key

for comm, members, window in ((on_node, node_members, True), (nested, node_members, True),
                              (across, across_members, False)):
    assert comm.node_count == (1 if window else 2), (rank, comm.node_count)
    for count in (1, 4099, 300_001, 256):           # 1 KiB last: the selector's pick for a small call
        check_all_reduce(comm, members, count)
    small = chosen(comm)
    assert (small == "one_shot") == window, (rank, members, small)
    # A window algorithm forced where there is no window is refused on every member, before any message.
    try:
        comm.all_reduce(np.ones(8, np.float32), algorithm="one_shot")
        refused = False
    except ringcomm.UsageError as err:
        refused = "one_shot" in str(err)
    assert refused == (not window), (rank, members, refused)
    gathered = np.empty(3 * comm.size, np.int64)
    comm.all_gather(gathered, np.full(3, rank, np.int64))
    assert gathered.tolist() == [r for r in members for _ in range(3)], (rank, gathered)

# Window slots run out: on_node, on_node.split(0) and nested took three of the seven; four more
# dups take the rest, and the next one runs without a window. Its refusal of a forced one_shot
# names that cause (it once said only "this job's shm transport offers no window"), and its
# small calls stay exact on a schedule algorithm.
more = [on_node.dup() for _ in range(4)]
for comm in more:
    check_all_reduce(comm, node_members, 256)
    assert chosen(comm) == "one_shot", (rank, chosen(comm))
spent = on_node.dup()
check_all_reduce(spent, node_members, 256)
assert chosen(spent) != "one_shot", (rank, chosen(spent))
try:
    spent.all_reduce(np.ones(8, np.float32), algorithm="one_shot")
    raise AssertionError("one_shot ran without a window")
except ringcomm.UsageError as err:
    assert "slot" in str(err) and "7 per rank" in str(err), err
for comm in more + [spent]:
    comm.close()

world.all_reduce(np.ones(5, np.float32))           # the parent goes on beside its splits
world.barrier()
if rank == 0:
    print("node-split ok", flush=True)
