"""Sub-communicators: comm.split() with MPI_Comm_split semantics and comm.dup(), on the threads
transport: shapes (odd/even, singleton, everyone, nested), every collective on them, and
collectives in flight at once on siblings and on the parent, which must not interfere; under
mpirun, a rank a split leaves alone, random calls interleaved across several communicators,
threads each on a communicator of their own, and splits on one node of a job that spans nodes."""
import threading
import time

import numpy as np
import pytest

from ringcomm import UsageError
from ringcomm.testing import run_threads

import shm_sandbox
from mpi_util import run_mpi
from thread_util import in_thread


def test_split_groups_by_color_orders_by_key_then_rank_and_none_opts_out():
    def body(comm):
        color = None if comm.rank == 5 else comm.rank % 2
        sub = comm.split(color, key=-comm.rank if comm.rank % 2 else 0)
        if sub is None:
            return None
        total = sub.all_reduce(np.array([float(comm.rank)]))
        return sub.rank, sub.size, float(total[0])
    got = run_threads(7, body)
    assert got[5] is None
    evens = [0, 2, 4, 6]                        # odd ranks' keys descend: rank 3 comes first
    for r in evens:
        assert got[r] == (evens.index(r), 4, 12.0)
    assert got[3] == (0, 2, 4.0) and got[1] == (1, 2, 4.0)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_singletons_everyone_and_nested_splits(size):
    def body(comm):
        alone = comm.split(comm.rank)
        everyone = comm.split(7)
        halves = everyone.split(int(comm.rank < size // 2))
        quarter = halves.split(halves.rank % 2, key=halves.rank)   # a split of a split of a split
        x = np.full(3, comm.rank + 1.0)
        return (alone.size, float(alone.all_reduce(x.copy())[0]), everyone.size,
                float(everyone.all_reduce(x.copy())[0]), float(halves.all_reduce(x.copy())[0]),
                float(quarter.all_reduce(x.copy())[0]), quarter.size)
    got = run_threads(size, body)
    for r, (alone_size, alone, every_size, every, half, quarter, qsize) in enumerate(got):
        assert (alone_size, alone, every_size, every) == (1, r + 1.0, size, sum(range(1, size + 1)))
        members = [k for k in range(size) if (k < size // 2) == (r < size // 2)]
        assert half == sum(k + 1.0 for k in members)
        mine = [k for i, k in enumerate(members) if i % 2 == members.index(r) % 2]
        assert (quarter, qsize) == (sum(k + 1.0 for k in mine), len(mine))


def test_every_collective_runs_on_a_sub_communicator():
    def body(comm):
        sub = comm.split(comm.rank % 2)
        n, r = sub.size, sub.rank
        out = {}
        out["all_reduce"] = sub.all_reduce(np.full(4, r + 1.0))
        out["broadcast"] = sub.broadcast(np.full(3, float(r)), root=n - 1)
        gathered = np.zeros(2 * n)
        out["all_gather"] = sub.all_gather(gathered, np.full(2, float(r)))
        part = np.zeros(2)
        out["reduce_scatter"] = sub.reduce_scatter(part, np.arange(2.0 * n))
        a2a = np.zeros(n)
        out["all_to_all"] = sub.all_to_all(a2a, np.arange(n, dtype=np.float64) + 10 * r)
        g = np.zeros(n) if r == 0 else None
        out["gather"] = sub.gather(g, np.array([float(r)]), root=0)
        out["scatter"] = sub.scatter(np.zeros(1), np.arange(float(n)) if r == 0 else None, root=0)
        if n > 1:
            if r == 0:
                sub.send(np.array([42.0]), 1, tag=3)
            elif r == 1:
                out["recv"] = sub.recv(np.zeros(1), 0, tag=3)
        sub.barrier()
        return n, r, out
    for n, r, out in run_threads(5, body):
        assert (out["all_reduce"] == n * (n + 1) / 2).all()
        assert (out["broadcast"] == n - 1).all()
        assert (out["all_gather"] == np.repeat(np.arange(float(n)), 2)).all()
        assert (out["reduce_scatter"] == n * np.arange(2 * r, 2 * r + 2)).all()
        assert (out["all_to_all"] == np.arange(n) * 10 + r).all()
        assert r != 0 or (out["gather"] == np.arange(float(n))).all()
        assert out["scatter"][0] == r
        assert r != 1 or out["recv"][0] == 42.0


def test_collectives_in_flight_on_siblings_and_parent_do_not_interfere():
    """Async calls on two siblings and the parent, issued in different orders on different ranks:
    each communicator matches its own calls."""
    def body(comm):
        a = comm.split(0)                # everyone
        b = comm.split(comm.rank % 2)    # odd/even
        order = [(a, 0), (b, 1), (comm, 2)] * 3
        if comm.rank % 2:
            order.reverse()
        calls = [0, 0, 0]   # each communicator's k-th call has the same size on every rank
        works = []
        for c, which in order:
            works.append((which, c.all_reduce(np.full(1000 + calls[which], comm.rank + 1.0), async_op=True)))
            calls[which] += 1
        return [(which, w.wait(timeout=60)[0]) for which, w in works]
    got = run_threads(6, body)
    total = sum(range(1, 7))
    for r, results in enumerate(got):
        same_parity = sum(k + 1 for k in range(6) if k % 2 == r % 2)
        for which, value in results:
            assert value == (same_parity if which == 1 else total)


def test_dup_gives_a_thread_its_own_collectives():
    """Two threads of each rank, each on its own dup: every result is that thread's own sum."""
    def body(comm):
        comms = [comm.dup(), comm.dup()]
        results = [[], []]

        def worker(t):
            for i in range(30):
                results[t].append(float(comms[t].all_reduce(np.full(8, 100.0 * t + i + comm.rank))[0]))
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return results
    n = 3
    for results in run_threads(n, body):
        for t in range(2):
            assert results[t] == [n * (100.0 * t + i) + sum(range(n)) for i in range(30)]


def test_a_second_thread_on_one_communicator_is_refused_naming_both_threads():
    intruded = threading.Barrier(2)

    def body(comm):
        # A receive the peer answers only after both intruders ran: in flight, however slow the machine.
        peer, inbox = 1 - comm.rank, np.zeros(4)
        works = [comm.recv(inbox, src=peer, async_op=True)]
        _, caught = in_thread(lambda: comm.all_reduce(np.ones(4)))
        intruded.wait(60)
        comm.send(np.ones(4), dst=peer)
        for w in works:
            w.wait(60)
        return caught
    for caught in run_threads(2, body):
        assert isinstance(caught, UsageError) and "intruder" in str(caught) and "MainThread" not in str(caught) \
            and "comm.dup()" in str(caught)


def test_split_of_a_communicator_whose_ranks_disagree_on_the_call_is_an_error():
    from ringcomm import MismatchError
    def body(comm):
        if comm.rank == 0:
            return comm.split(0)
        return comm.all_reduce(np.zeros(3))
    with pytest.raises(MismatchError):
        run_threads(2, body, timeout=10)


def test_a_dup_against_another_call_is_named_dup_and_a_dup_meets_a_split_of_one_color():
    """dup() is a split of one color: its errors say dup (they said split #0), and it pairs with a
    peer's split(0, key=rank) as MPI's would."""
    from ringcomm import MismatchError, PeerAbortedError

    def body(comm):
        try:
            return comm.dup() if comm.rank == 0 else comm.barrier()
        except (MismatchError, PeerAbortedError) as err:
            return err
    caught = run_threads(2, body, timeout=10)
    # whichever rank finds the difference first, rank 0's error names its dup, and the words for
    # the dup's envelope are "split or dup" in its own check or in the peer's it carries
    assert isinstance(caught[0], (MismatchError, PeerAbortedError)), caught[0]
    assert str(caught[0]).startswith("dup #0 on rank 0: ") and "split or dup" in str(caught[0]), caught[0]

    def mixed(comm):
        sub = comm.dup() if comm.rank == 0 else comm.split(0, comm.rank)
        return sub.all_reduce(np.array([comm.rank + 1.0]))
    assert [float(x[0]) for x in run_threads(2, mixed)] == [3.0, 3.0]


def test_two_live_sub_communicators_never_share_a_context_id(monkeypatch):
    """Context ids are hashes of the split path; should two collide on one transport, the second
    split fails instead of reading the first one's messages."""
    from ringcomm import CommError, subcommunicators

    def body(comm):
        first = comm.split(0)
        monkeypatch.setattr(subcommunicators, "_context_id", lambda path: first.transport.context)
        try:
            comm.split(0)
        except CommError as err:
            return str(err)
        return "no error"
    for text in run_threads(2, body):
        assert "already in use" in text and "collision" in text, text


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,forced", [(3, "one_shot"), (1, "direct")])
def test_a_rank_left_alone_runs_every_algorithm_even_a_forced_window_one(ranks, forced):
    """A one-rank communicator moves nothing, so no algorithm needs a window there: forcing a
    window algorithm (RINGCOMM_ALGO, algorithm=) once raised UsageError on the rank a split left
    alone, and only there, while its peers went on to a timeout; a single process refused it too."""
    proc = run_mpi(ranks, "forced_alone.py", env={"RINGCOMM_ALGO": forced})
    assert "forced-alone ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,extra", [(3, "nodes"), (4, "")])
def test_threads_each_on_a_dup_or_split_of_their_own_get_exact_results_under_mpirun(ranks, extra):
    """Four threads per rank at once, on three dups and a parity split, over the real transport
    (one staging pool, one set of rings and windows for all): blocking collectives and send/recv,
    every result exact (mpi_jobs/threads_on_dups.py); with pretend nodes the split is a node's
    own group and the dups span both."""
    calls = 120
    proc = run_mpi(ranks, "threads_on_dups.py", calls, 20261204 + ranks, *([extra] if extra else []), timeout=240)
    assert f"threads-on-dups: 4 threads x {calls} calls, 0 wrong" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
def test_a_split_on_one_node_of_a_job_that_spans_nodes_gets_the_nodes_window():
    """Two pretend nodes: the split of each node's ranks runs one-shot (it once had no window,
    because the parent, spanning nodes, offered no window slots), a split across nodes refuses a
    forced window algorithm, and every result is exact (mpi_jobs/node_split.py)."""
    proc = run_mpi(4, "node_split.py")
    assert "node-split ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,extra,backend", [(3, "", "ringcomm"), (4, "", "ringcomm"), (3, "nodes", "ringcomm"),
                                                 (3, "", "mpi"), (3, "", "gloo")])
def test_random_calls_interleaved_across_world_splits_and_dups_are_exact(ranks, extra, backend):
    """Several communicators, outstanding Works waited in random order, buffers used again (the
    memo road) and forced algorithms, under mpirun on every backend; every result checked exactly
    (mpi_jobs/interleaved.py)."""
    calls = 400
    proc = run_mpi(ranks, "interleaved.py", calls, 20261204 + ranks, *([extra] if extra else []),
                   env={"RINGCOMM_BACKEND": backend}, timeout=300)
    assert f"interleaved: {calls} calls checked, 0 wrong" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
def test_messages_a_closed_sub_communicator_never_received_do_not_stall_the_world():
    """A refused receive, a collective whose ranks disagreed, or a send nobody received on a dup
    once held a slot of the pair's shared descriptor ring for good: 255 messages later the
    world's sends between those ranks timed out (mpi_jobs/closed_sub_messages.py)."""
    proc = run_mpi(2, "closed_sub_messages.py", timeout=120)
    assert "closed-sub-messages ok" in proc.stdout, proc.stdout + proc.stderr


def test_a_group_made_again_under_its_name_gets_a_context_of_its_own():
    """The same two ranks make a group under one name four times, each running a 1 KiB
    all_reduce and closing, rank 1 late into every group but the first. Before round forty-three
    every remake reused its predecessor's context id, whose closed window regions still read
    "closed": rank 0 raised PeerAbortedError naming rank 1's close while rank 1 returned the sum.
    Two live groups of one name and members get two contexts too."""
    def body(comm):
        sums = []
        for i in range(4):
            group = comm._group([0, 1], "again")
            x = np.full(256, float(i + 1) * (comm.rank + 1), np.float32)
            if comm.rank == 1 and i:
                time.sleep(0.1)
            group.all_reduce(x)
            sums.append(float(x[0]))
            group.close()
            comm.barrier()
        first, second = comm._group([0, 1], "twice"), comm._group([0, 1], "twice")
        y = np.ones(8, np.float32)
        second.all_reduce(y)
        first.all_reduce(y)
        return sums, first.transport.context != second.transport.context, y[0]
    for sums, apart, y in run_threads(2, body, timeout=30):
        assert sums == [3.0, 6.0, 9.0, 12.0] and apart and y == 4.0, (sums, apart, y)


@pytest.mark.mpi
def test_a_group_made_again_under_its_name_is_exact_when_a_member_is_late_to_its_window():
    """The same under mpirun on the shared-memory window, rank 1 late to open each of five
    groups' windows (mpi_jobs/regroup.py)."""
    proc = run_mpi(2, "regroup.py", timeout=120)
    assert "regroup ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_window_slots_of_closed_sub_communicators_serve_new_ones_with_their_own_rounds(ranks):
    """The eighth sub-communicator made and closed on a rank once had no window (its small
    all-reduces ran recursive doubling); a reused slot must not let the new window take the old
    one's flags for its rounds, nor go to a communicator while a peer of the old one still has
    it open (mpi_jobs/reused_window_slots.py)."""
    proc = run_mpi(ranks, "reused_window_slots.py", timeout=120)
    assert "reused-window-slots ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("backend, mode, rounds, where", [
    ("ringcomm", "closed", 2100, ""), ("ringcomm", "closed", 2100, "across-nodes"), ("gloo", "closed", 40, ""),
    ("mpi", "closed", 2100, ""), ("ringcomm", "open", 2100, ""), ("mpi", "open", 2100, ""),
    ("mpi", "unreceived", 20, ""), ("ringcomm", "unreceived", 20, "across-nodes")])
def test_closed_dups_give_back_what_they_can_and_running_out_of_mpis_communicators_says_so(backend, mode, rounds,
                                                                                          where):
    """Before round thirty-seven the 2,045th dup on the ringcomm backend died of a raw mpi4py
    exception, closed or not, and a closed gloo dup kept five descriptors; before round
    thirty-nine the 2,045th closed dup on the mpi and gloo backends was refused. A dup closed with
    a message unreceived stays held (mpi_jobs/many_dups.py)."""
    proc = run_mpi(2, "many_dups.py", backend, mode, rounds, *([where] if where else []), timeout=180)
    assert "many-dups ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("backend, mode, rounds, where", [
    ("ringcomm", "closed", 60, ""), ("ringcomm", "closed", 60, "across-nodes"), ("mpi", "closed", 60, ""),
    ("gloo", "closed", 6, ""), ("mpi", "unreceived", 20, ""), ("ringcomm", "unreceived", 20, "across-nodes"),
    ("mpi", "raced", 3, ""), ("gloo", "raced", 2, ""), ("ringcomm", "raced", 3, ""), ("ringcomm", "overflow", 10, "")])
def test_closed_inits_give_their_mpi_communicators_back_unless_a_message_is_unreceived(backend, mode, rounds, where):
    """Before round forty every init held its MPI communicators for the life of the process, and
    the 1,024th init-close round of a loop raised CommunicatorLimitError (mpi_jobs/many_inits.py)."""
    env = {"RINGCOMM_SHM_CMA": "0"} if mode == "overflow" else None
    proc = run_mpi(2, "many_inits.py", backend, mode, rounds, *([where] if where else []), env=env, timeout=120)
    assert "many-inits ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, extra", [(2, None), (4, "pretend-nodes")])
def test_what_an_init_made_goes_once_the_world_and_its_dups_have_closed(ranks, extra):
    """A dup outliving the world's close, gloo's groups and stores given back, and init's
    refusal when MPI has no communicator left (mpi_jobs/world_release.py)."""
    proc = run_mpi(ranks, "world_release.py", *([extra] if extra else []), timeout=180)
    assert "world-release ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.skipif(shm_sandbox.unavailable() is not None, reason=str(shm_sandbox.unavailable()))
def test_inits_and_closes_in_a_64_mib_dev_shm_give_its_pages_back(tmp_path):
    """Each init's staging pool takes three quarters of what /dev/shm has free; closed
    communicators held theirs until the collector ran, and the fifth init of world_release.py
    found no room (transport/shm ShmTransport.forget)."""
    job = shm_sandbox.run(2, "world_release.py", out_dir=tmp_path, size="64m", timeout=180)
    assert "world-release ok" in job.stdout, job.stdout + job.stderr
    assert job.after_job == [], job.after_job
