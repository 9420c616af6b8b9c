"""The one-shot all-reduce and its shared window: what the grid in test_all_reduce.py does not
cover (its results are checked there, on every world size, dtype and op).

Here: pieces larger than the window, slots reused round after round, disagreeing ranks caught
from the window's stamps (never reading bytes a peer did not write), a peer in a one-shot round
seen by a rank stalled in a point-to-point collective, and choosing one-shot only where ranks
share a window."""
import math
import os
import threading

import numpy as np
import pytest

from ringcomm import Communicator, MismatchError, PeerAbortedError, UsageError, algorithms
from ringcomm.selection.cost import DEFAULT_LINK, Network
from ringcomm.selection.selector import Selector
from ringcomm.testing import run_threads
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
from ringcomm.transport.window import CAPACITY, Window, region_bytes


def outcomes(size, fn, timeout=10):
    """Every rank's result or exception (run_threads would raise the first)."""
    world = ThreadsWorld(size)
    out = [None] * size

    def main(rank):
        try:
            out[rank] = fn(Communicator(ThreadsTransport(world, rank), timeout=timeout))
        except BaseException as err:   # collected, then asserted on
            out[rank] = err
    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return out


@pytest.mark.parametrize("size", [2, 3, 5])
def test_many_pieces_and_many_rounds_stay_exact_and_identical(size):
    # 3.5 windows' worth of float64, twenty times: every slot is reused many times over.
    count = (7 * CAPACITY // 2) // 8

    def fn(comm):
        rng = np.random.default_rng(comm.rank)
        results = []
        for _ in range(20):
            x = rng.standard_normal(count)
            mine = x.copy()
            comm.all_reduce(x, algorithm="one_shot")
            results.append((mine, x))
        return results
    per_rank = run_threads(size, fn)
    for call in range(20):
        inputs = [per_rank[r][call][0] for r in range(size)]
        expected = inputs[0].copy()   # rank order, as one-shot reduces
        for x in inputs[1:]:
            expected += x
        for r in range(size):
            assert per_rank[r][call][1].tobytes() == expected.tobytes()


def test_counts_that_agree_mod_1024_still_mismatch_instead_of_reading_garbage():
    def fn(comm):
        comm.all_reduce(np.ones(1000 + (1024 if comm.rank == 1 else 0), np.float32), algorithm="one_shot")
    out = outcomes(3, fn)
    assert all(isinstance(e, MismatchError) for e in out), out
    assert "differs in count: expected 1000, received 2024" in str(out[0])


def test_dtype_mismatch_names_the_field_on_every_rank():
    def fn(comm):
        comm.all_reduce(np.ones(10, np.int32 if comm.rank == 2 else np.float32), algorithm="one_shot")
    out = outcomes(3, fn)
    assert all(isinstance(e, MismatchError) and "dtype" in str(e) for e in out), out


def test_a_rank_stalled_in_a_point_to_point_collective_sees_a_peer_in_a_one_shot_round():
    # Rank 1 skips the all-reduce: it waits in the broadcast for the root, which sends nothing
    # (it is in the one-shot round); the root's window stamp tells rank 1 what went wrong.
    def fn(comm):
        if comm.rank != 1:
            comm.all_reduce(np.ones(10), algorithm="one_shot")
        comm.broadcast(np.ones(10), algorithm="binomial")
    out = outcomes(3, fn)
    assert isinstance(out[1], MismatchError), out
    assert "collective: expected broadcast, received all_reduce" in str(out[1])
    assert all(isinstance(e, (MismatchError, PeerAbortedError)) for e in out), out


def test_forcing_one_shot_without_a_window_is_a_usage_error_before_any_communication():
    world = ThreadsWorld(2)
    transport = ThreadsTransport(world, 0)
    transport.window = None   # as on the MPI transport, or across nodes
    comm = Communicator(transport, timeout=1)
    with pytest.raises(UsageError, match='"algorithm".*one_shot.*window'):
        comm.all_reduce(np.ones(4, np.float32), algorithm="one_shot")
    assert "one_shot" not in algorithms.names("all_reduce", transport)
    assert "one_shot" in algorithms.names("all_reduce", ThreadsTransport(world, 1))
    os.environ["RINGCOMM_ALGO"] = "one_shot"
    try:
        with pytest.raises(UsageError, match="RINGCOMM_ALGO.*one_shot.*window"):
            Communicator(transport, timeout=1)
    finally:
        del os.environ["RINGCOMM_ALGO"]


def test_the_selector_picks_one_shot_for_small_messages_on_shared_memory_only():
    sel = Selector()
    shm = Window(0, [np.zeros(region_bytes(), np.uint8)] * 2)

    class Shm:   # what the selector reads of a transport: its name and its window
        name, rank, size, window = "shm", 0, 2, shm

    class Mpi:
        name, rank, size, window = "mpi", 0, 2, None
    assert sel.choose("all_reduce", 1024, 2, transport=Shm()) == "one_shot"
    assert sel.choose("all_reduce", 1024, 2, transport=Shm(), window=False) != "one_shot"   # device memory
    assert sel.choose("all_reduce", 1024, 2, transport=Mpi()) != "one_shot"
    assert sel.choose("all_reduce", 64 << 20, 2, transport=Shm()) != "one_shot"
    table = sel.explain("all_reduce", 1024, 2, routes=("shm", "shm")).predicted
    assert math.isinf(table["one_shot"])   # no window described: not a candidate


def test_one_shot_cost_counts_every_peer_read():
    one_shot = algorithms.get("all_reduce", "one_shot")
    net = {n: Network(DEFAULT_LINK, DEFAULT_LINK, (n,), window=DEFAULT_LINK, window_bytes=CAPACITY) for n in (2, 8)}
    # (n-1) S of reads: from 2 to 8 ranks the bandwidth part grows 7-fold, the latency not at all.
    s = CAPACITY
    bandwidth = {n: one_shot.cost(s, net[n]) - DEFAULT_LINK.alpha for n in (2, 8)}
    assert bandwidth[8] == pytest.approx(bandwidth[2] * (s * DEFAULT_LINK.beta + 7 * s * (DEFAULT_LINK.beta + DEFAULT_LINK.gamma))
                                         / (s * DEFAULT_LINK.beta + s * (DEFAULT_LINK.beta + DEFAULT_LINK.gamma)))
