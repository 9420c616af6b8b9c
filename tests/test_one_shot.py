"""The one-shot all-reduce and its shared window: what the grid in test_all_reduce.py does not
cover (its results are checked there, on every world size, dtype and op).

Here: pieces larger than the window, slots reused round after round, disagreeing ranks caught
from the window's stamps (never reading bytes a peer did not write), a peer in a one-shot round
seen by a rank stalled in a point-to-point collective, and choosing one-shot only where ranks
share a window."""
import math
import os

import numpy as np
import pytest

from ringcomm import CommTimeoutError, Communicator, MismatchError, PeerAbortedError, UsageError, algorithms
from ringcomm.selection.cost import DEFAULT_LINK, Network
from ringcomm.selection.selector import Selector
from ringcomm.testing import run_threads
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
from ringcomm.transport.window import CAPACITY, JOB_CAPACITY, Window, region_bytes
from thread_util import outcomes


@pytest.mark.parametrize("size", [2, 3, 5])
def test_many_pieces_and_many_rounds_stay_exact_and_identical(size):
    # 3.5 windows' worth of float64, twenty times: every slot is reused many times over.
    count = (7 * JOB_CAPACITY // 2) // 8   # the job's window

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
    if shm.core is not None:
        assert sel.choose("all_reduce", 64 << 20, 2, transport=Shm()) == "one_shot"
    # The Python round pays 3-5 us of interpreter per 64 KiB round and reduces in a second pass: a
    # ring wins at 64 MiB. The compiled round, without CMA (no reader here), beats the ring there
    # (2 ranks, 64 MiB, RINGCOMM_SHM_CMA=0: one_shot 14.1 ms, ring 19.7, rabenseifner 21.0).
    shm.core = None

    class PythonShm(Shm):
        window = shm
    assert sel.choose("all_reduce", 64 << 20, 2, transport=PythonShm()) != "one_shot"
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


# ---- the window algorithms of the other collectives: what their grids cannot show ------------

def test_ranks_that_disagree_on_the_root_of_a_window_broadcast_all_raise_instead_of_copying():
    # Equal counts, equal dtype: only the root differs, which the stamp does not hold; the shape
    # word does. Without it rank 1 would copy rank 2's bytes and return normally.
    def fn(comm):
        x = np.full(10, float(comm.rank))
        comm.broadcast(x, root=2 if comm.rank == 1 else 0, algorithm="one_shot")
        return x
    out = outcomes(3, fn)
    assert all(isinstance(e, MismatchError) for e in out), out
    assert any("differs in root: expected 0, received 2" in str(e) for e in out), out


WINDOW_CALLS = {
    "all_reduce": lambda c, a: c.all_reduce(np.full(256, c.rank + 1.0), algorithm=a),
    "broadcast": lambda c, a: c.broadcast(np.full(256, c.rank + 1.0), root=0, algorithm=a),
    "all_gather": lambda c, a: c.all_gather(np.zeros(2 * 256), np.full(256, c.rank + 1.0), algorithm=a),
    "reduce_scatter": lambda c, a: c.reduce_scatter(np.zeros(256), np.full(2 * 256, c.rank + 1.0), algorithm=a),
    "all_to_all": lambda c, a: c.all_to_all(np.zeros(2 * 256), np.full(2 * 256, c.rank + 1.0), algorithm=a),
    "gather": lambda c, a: c.gather(np.zeros(2 * 256) if c.rank == 0 else None, np.full(256, c.rank + 1.0),
                                    algorithm=a),
    "scatter": lambda c, a: c.scatter(np.zeros(256), np.full(2 * 256, 1.0) if c.rank == 0 else None, algorithm=a),
}


@pytest.mark.parametrize("collective", sorted(WINDOW_CALLS))
def test_ranks_that_run_different_window_algorithms_raise_instead_of_reading_each_others_slots(collective):
    """one_shot's slot holds data, direct's an address: a rank that read the other's as its own
    returned garbage (all_reduce at 4 KiB: 2.5e27 on one rank, while the other hit EFAULT). The
    stamp carries the window algorithm, so both refuse, naming both."""
    first, second = algorithms.window_names(collective)

    def fn(comm):
        WINDOW_CALLS[collective](comm, first if comm.rank == 0 else second)
    out = outcomes(2, fn)
    assert all(isinstance(e, MismatchError) for e in out), out
    assert f"rank 1 runs {second} where this rank runs {first}" in str(out[0]), out
    assert f"rank 0 runs {first} where this rank runs {second}" in str(out[1]), out


@pytest.mark.parametrize("bad", ["root", "count"])
def test_ranks_that_disagree_on_a_direct_gather_write_nothing_into_any_root(bad):
    # Direct gather writes into the root's memory: a rank may write only after round 1 showed
    # every rank in the same call, with the same root and count.
    def fn(comm):
        root = 1 if bad == "root" and comm.rank == 1 else 0
        count = 5 if bad == "count" and comm.rank == 2 else 4
        x = np.full(count, float(comm.rank), np.float32)
        out = np.full(3 * count, -1.0, np.float32) if comm.rank == root else None
        try:
            comm.gather(out, x, root=root, algorithm="direct")
        except MismatchError as err:
            return err, out
        return None, out
    out = run_threads(3, fn)
    assert all(isinstance(err, MismatchError) for err, _ in out), out
    assert all(o is None or (o == -1).all() for _, o in out), out


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_uneven_counts_with_the_same_total_but_another_split_raise_on_every_rank(collective):
    def fn(comm):
        counts = [1, 2, 3] if comm.rank != 2 else [2, 2, 2]
        whole, mine = np.ones(6, np.float32), np.ones(counts[comm.rank], np.float32)
        if collective == "all_gather":
            comm.all_gather(whole, mine, counts=counts, algorithm="one_shot")
        else:
            comm.reduce_scatter(mine, whole, counts=counts, algorithm="one_shot")
    out = outcomes(3, fn)
    assert all(isinstance(e, MismatchError) for e in out), out
    assert any("differs in counts" in str(e) for e in out), out


@pytest.mark.parametrize("collective", ["barrier", "broadcast", "all_gather", "reduce_scatter", "all_to_all"])
def test_a_rank_that_never_comes_is_named_by_every_waiting_rank_within_the_timeout(collective):
    calls = {"barrier": lambda c: c.barrier(algorithm="one_shot"),
             "broadcast": lambda c: c.broadcast(np.ones(8), algorithm="one_shot"),
             "all_gather": lambda c: c.all_gather(np.ones(24), np.ones(8), algorithm="one_shot"),
             "reduce_scatter": lambda c: c.reduce_scatter(np.ones(8), np.ones(24), algorithm="one_shot"),
             "all_to_all": lambda c: c.all_to_all(np.ones(24), np.ones(24), algorithm="one_shot")}

    def fn(comm):
        if comm.rank != 2:
            calls[collective](comm)
    out = outcomes(3, fn, timeout=0.5)
    # Each waiting rank times out naming rank 2, or, where a peer timed out a moment earlier, is
    # released by that peer's notice, which names rank 2 too (seen once in CI on 2 cores).
    assert any(isinstance(out[rank], CommTimeoutError) for rank in (0, 1)), out
    for rank in (0, 1):
        assert isinstance(out[rank], (CommTimeoutError, PeerAbortedError)), out
        assert f"{collective} #0 (one_shot" in str(out[rank]) and "rank 2" in str(out[rank]), out[rank]


def test_reduce_scatter_rounds_cover_every_part_even_when_parts_are_longer_than_a_round():
    # 3 ranks, uneven parts of 0, 1 and 2.5 rounds' worth: every element reduced once, in rank order.
    per = JOB_CAPACITY // 8 // 3
    counts = [0, 1, per * 5 // 2]

    def fn(comm):
        x = np.random.default_rng(comm.rank).standard_normal(sum(counts))
        out = np.empty(counts[comm.rank])
        comm.reduce_scatter(out, x, counts=counts, algorithm="one_shot")
        return x, out
    got = run_threads(3, fn)
    whole = got[0][0] + got[1][0] + got[2][0]
    for r in range(3):
        lo = sum(counts[:r])
        assert got[r][1].tobytes() == whole[lo:lo + counts[r]].tobytes()


# ---- direct algorithms: addresses through the window, payloads read in place -------------------

def test_direct_needs_a_window_that_reads_peers_and_says_so_before_any_communication():
    world = ThreadsWorld(2)
    transport = ThreadsTransport(world, 0)
    transport.window.reader = None   # as on shm where CMA is off (RINGCOMM_SHM_CMA=0, ptrace refused)
    comm = Communicator(transport, timeout=1)
    with pytest.raises(UsageError, match='"algorithm".*direct.*CMA is off'):
        comm.all_reduce(np.ones(4, np.float32), algorithm="direct")
    assert "direct" not in algorithms.names("all_reduce", transport)
    assert "one_shot" in algorithms.names("all_reduce", transport)


# The direct all-reduce and all-gather write into their peers' outputs (window.writer); the
# others read from their peers' buffers (window.reader); the all-reduce and broadcast do both.
@pytest.mark.parametrize("collective,access", [("all_reduce", "reader"), ("broadcast", "reader"),
                                               ("reduce_scatter", "reader"), ("all_reduce", "writer"),
                                               ("all_gather", "writer"), ("broadcast", "writer")])
def test_a_rank_whose_direct_read_or_write_fails_makes_every_rank_raise(collective, access):
    from ringcomm import CommError

    def fn(comm):
        if comm.rank == 1:
            def broken(rank, addr, buf):
                raise CommError(f"cannot reach rank {rank}'s memory (injected)")
            setattr(comm.transport.window, access, broken)
        x, whole = np.ones(30), np.ones(90)
        {"all_reduce": lambda: comm.all_reduce(x, algorithm="direct"),
         "broadcast": lambda: comm.broadcast(x, algorithm="direct"),
         "all_gather": lambda: comm.all_gather(whole, x, algorithm="direct"),
         "reduce_scatter": lambda: comm.reduce_scatter(x, whole, algorithm="direct")}[collective]()
    out = outcomes(3, fn, timeout=5)
    assert isinstance(out[1], CommError) and "injected" in str(out[1]), out
    for rank in (0, 2):   # told by rank 1's poison and notice, long before the 5 s deadline
        assert isinstance(out[rank], (PeerAbortedError, MismatchError)), out
        assert "injected" in str(out[rank]) or "gave up" in str(out[rank]), out[rank]


@pytest.mark.parametrize("size,root", [(2, 0), (2, 1), (3, 1), (5, 4)])
def test_direct_broadcast_has_every_rank_carry_only_its_own_part(size, root):
    # The point of the split: rank r moves part r (S/n) and nothing else, so all cores copy at
    # once. The root writes its part to every non-root; a non-root reads its part from the root
    # and writes it to every other non-root. Counted through the window's reader and writer.
    from ringcomm.algorithms._direct import CHUNK_BYTES
    from ringcomm.core.schedule import chunk
    count = size * (CHUNK_BYTES // 8) + 3   # parts of more than one chunk, uneven by 3

    def fn(comm):
        window, moved = comm.transport.window, {"read": [], "write": []}
        read, write = window.reader, window.writer
        window.reader = lambda r, addr, dst: (moved["read"].append((r, dst.nbytes)), read(r, addr, dst))
        window.writer = lambda r, addr, src: (moved["write"].append((r, src.nbytes)), write(r, addr, src))
        x = np.arange(count, dtype=np.float64) if comm.rank == root else np.zeros(count)
        comm.broadcast(x, root=root, algorithm="direct")
        assert x.tobytes() == np.arange(count, dtype=np.float64).tobytes()
        return moved
    parts = [chunk(count, size, r)[1] * 8 for r in range(size)]   # the collective's own split
    for rank, moved in enumerate(run_threads(size, fn)):
        others = [r for r in range(size) if r not in (rank, root)]
        assert {r for r, _ in moved["write"]} == set(others), (rank, moved)
        assert sum(b for _, b in moved["write"]) == parts[rank] * len(others)
        if rank == root:
            assert moved["read"] == []
        else:
            assert {r for r, _ in moved["read"]} == {root} and sum(b for _, b in moved["read"]) == parts[rank]


def test_direct_all_reduce_in_place_on_ranks_past_the_first_two_reduces_its_own_part_in_rank_order():
    # In place, rank r >= 2 must keep its own part before x0 OP x1 overwrites it: parts of several
    # chunks, every rank's part, bit for bit against a rank-order reduction.
    from ringcomm.algorithms._direct import CHUNK_BYTES
    size, count = 4, 4 * (CHUNK_BYTES // 8 * 2 + 5)

    def fn(comm):
        x = np.random.default_rng(comm.rank).standard_normal(count)
        mine = x.copy()
        comm.all_reduce(x, algorithm="direct")
        return mine, x
    got = run_threads(size, fn)
    expected = got[0][0] + got[1][0]
    for r in range(2, size):
        expected += got[r][0]
    for r in range(size):
        assert got[r][1].tobytes() == expected.tobytes()


def test_a_peer_that_finished_the_round_and_started_the_next_call_is_not_a_mismatch():
    # Rank 0 waits for round 1 and sees rank 1 lagging; before the diagnosis looks, rank 1 posts
    # round 1, finishes it (every rank posted it) and posts round 2 of its next collective. The
    # stamp in rank 1's newest slot then belongs to that next call: taken for a mismatch, it made
    # a 4-rank job raise "a rank skipped or added a collective" now and then. The round is
    # re-tested first, and settle returns.
    from ringcomm.algorithms._rounds import settle
    from ringcomm.core.envelope import Envelope, static_bits, window_stamp
    from ringcomm.core.executor import WindowGuard
    regions = [np.zeros(region_bytes(CAPACITY), np.uint8) for _ in range(2)]
    windows = [Window(r, regions) for r in range(2)]
    ours = window_stamp(7, static_bits(1, "float32", 4), 4)
    theirs = window_stamp(8, static_bits(7, "float32", 4), 4)   # the next call: another collective
    k = windows[0].publish(ours)

    class Transport:   # what the diagnosis asks of a transport: nothing arrived, and the window
        rank, window = 0, windows[0]

        def probe(self, peer, tag=None, skip=0):
            if windows[1].round == 0:   # the peer moves on while the diagnosis starts
                windows[1].publish(ours)
                windows[1].publish(theirs)
            return None

    def trouble():
        guard = WindowGuard(Transport(), Envelope(7, 1, "float32", 4), 30.0, "all_to_all #7", None, 4)
        guard.watch.next_probe = 0.0   # diagnose at the first stall
        return guard
    settle(windows[0], k, ours, 0, trouble, 0, 1)   # returns: no MismatchError
    assert windows[0].lagging(k) is None


def test_one_shot_all_to_all_runs_as_many_rounds_as_the_longest_block_of_any_rank():
    # 3 ranks, float64: a round carries 32768 elements of each block (512 KiB over 2 peers). Only
    # rank 0's block for rank 2 needs three rounds, and rank 1 sends nothing at all: every rank
    # must still run three rounds (the longest block of the whole split matrix), or they hang.
    from ringcomm import collectives
    m = [[5, 0, 80000], [0, 0, 0], [7, 40000, 1]]   # m[i][j]: elements rank i sends to rank j

    def fn(comm):
        r = comm.rank
        x = np.arange(sum(m[r]), dtype=np.float64) + 1e6 * r
        out = np.full(sum(m[i][r] for i in range(3)), -1.0)
        comm.all_to_all(out, x, [m[i][r] for i in range(3)], m[r], algorithm="one_shot")
        return x, out
    got = outcomes(3, fn, timeout=30)
    assert not any(isinstance(g, BaseException) for g in got), got
    expected = collectives.get("all_to_all").reference([g[0] for g in got], in_splits=[tuple(row) for row in m])
    for r in range(3):
        assert np.array_equal(got[r][1], expected[r]), r


def test_window_stamps_carry_any_count_as_a_non_negative_int64():
    """A stamp is an int64 beside a window slot, never negative (a rank that gave up posts -1).
    Counts below 2**30 go in exactly; larger ones as bit 30 and their low 30 bits, the rest in
    bits 32-62 of the round's word: every count is carried exactly, and never equals another."""
    from ringcomm.core.envelope import (EXACT_COUNTS, count_differs, count_word, stamp_count, stamp_parts,
                                        static_bits, window_stamp, word_detail)
    static = static_bits(1, "int8", 4)
    counts = [0, 1, 97, EXACT_COUNTS - 1, EXACT_COUNTS, (1 << 31) - 1, 1 << 31, (1 << 31) + 4099, 1 << 40,
              (1 << 61) - 1]
    regions = [np.zeros(region_bytes(CAPACITY), np.uint8) for _ in range(2)]
    window = Window(0, regions)
    root = 5   # a word of its own (a rooted call's), below bit 32
    for count in counts:
        stamp, word = window_stamp(5, static, count), root ^ count_word(count)
        assert 0 <= stamp < 1 << 63 and 0 <= word < 1 << 63, count
        window.publish(stamp, word)   # the int64 slot header took both (a ValueError from 2**31 on, before)
        assert (window.stamp(0, window.round), window.word(0, window.round)) == (stamp, word)
        tag, carried = stamp_parts(stamp)
        assert carried == stamp_count(count)
        assert (carried == count) if count < EXACT_COUNTS else carried >= EXACT_COUNTS
        assert word_detail(word) == root
        assert count_differs(1, count, carried, (word, word)) == ""
    large = [c for c in counts if c >= EXACT_COUNTS] + [(1 << 31) + (1 << k) for k in range(40)]
    assert len({(stamp_count(c), count_word(c)) for c in large}) == len(large)
    assert count_differs(1, 97, stamp_count(96)) == "rank 1 differs in count: expected 97, received 96"
    assert count_differs(1, 1 << 31, stamp_count(1)) == f"rank 1 differs in count: expected {1 << 31}, received 1"
    # Counts alike in their low 30 bits: the words tell them apart, and say the peer's count.
    mine, theirs = (1 << 30) + 7, (1 << 31) + 7
    assert stamp_count(mine) == stamp_count(theirs)
    assert count_differs(1, mine, stamp_count(theirs), (root ^ count_word(mine), root ^ count_word(theirs))) == \
        f"rank 1 differs in count: expected {mine}, received {theirs}"
    assert count_differs(1, 97, stamp_count(theirs), (root, root ^ count_word(theirs))) == \
        f"rank 1 differs in count: expected 97, received {theirs}"
    # Where the rest of the words differs too (another root), the count is judged by what the
    # stamp holds, and the root's difference is left to describe_word.
    assert count_differs(1, mine, stamp_count(theirs), (root ^ count_word(mine), 6 ^ count_word(theirs))) == ""
    assert count_differs(1, 1 << 31, stamp_count((1 << 31) + 1), (0, 0)) == \
        f"rank 1 differs in count: expected {1 << 31}, received {(1 << 31) + 1}"


@pytest.mark.parametrize("algorithm", ["one_shot", "direct"])
def test_counts_of_2_30_or_more_that_agree_in_their_low_30_bits_still_mismatch(algorithm):
    """Rank 1 passes 2**30 more elements than rank 0 (both 2**30 or more: their stamps match);
    the round's word carries the rest of the count, so both ranks raise before reading a byte
    past rank 0's array. np.zeros maps pages lazily: neither array is ever touched whole."""
    def fn(comm):
        x = np.zeros((1 << 30) + 7 + (1 << 30) * comm.rank, np.int8)
        comm.all_reduce(x, algorithm=algorithm)
    out = outcomes(2, fn, timeout=20)
    assert all(isinstance(e, MismatchError) for e in out), out
    assert f"rank 1 differs in count: expected {(1 << 30) + 7}, received {(1 << 31) + 7}" in str(out[0])
    assert f"rank 0 differs in count: expected {(1 << 31) + 7}, received {(1 << 30) + 7}" in str(out[1])
