"""all_to_all: block j of every rank's x lands at rank j, in rank order, exactly; even and uneven
splits (zeros included); x never changes."""
import threading

import numpy as np
import pytest

from collective_grid import run
from grid import SIZES, Case, data_cases, empty, make, raw_bytes, thin, values
from ringcomm import Communicator, MismatchError, PeerAbortedError, UsageError, algorithms, collectives
from ringcomm.testing import run_threads
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld

REF = collectives.get("all_to_all")


def splits_matrix(size: int, seed: int, even: int = None) -> list:
    """M[i][j]: elements rank i sends to rank j (zeros among them)."""
    if even is not None:
        return [[even] * size for _ in range(size)]
    rng = np.random.default_rng([seed, size])
    m = rng.integers(0, 4, (size, size))
    m[rng.integers(0, size), :] = 0   # a rank that sends nothing
    return m.tolist()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("all_to_all") + [None])
def test_all_to_all(algorithm, size):
    uneven_ok = algorithm is None or not algorithms.get("all_to_all", algorithm).even_only
    case_list = []
    for i, c in enumerate(thin(data_cases(size, big=algorithm is not None), size)):
        block = c.count if c.count < 1000 else 4099
        uneven = uneven_ok and i % 2 == 1
        case_list.append(Case(block, c.dtype, c.op, c.kind, (uneven, tuple(map(tuple, splits_matrix(
            size, i, None if uneven else block))))))

    def call(comm, c, v):
        uneven, m = c.extra
        x = make(c, v)
        keep = raw_bytes(x)
        sends, recvs = m[comm.rank], [m[i][comm.rank] for i in range(comm.size)]
        out = empty(c, sum(recvs))
        if uneven:
            comm.all_to_all(out, x, out_splits=recvs, in_splits=sends, algorithm=algorithm)
        else:
            comm.all_to_all(out, x, algorithm=algorithm)
        assert raw_bytes(x) == keep
        return out

    def inputs(c, r):
        return values(c, r, sum(c.extra[1][r]))
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, inputs, call)):
        expected = REF.reference(per_rank, in_splits=list(c.extra[1]))
        for r in range(size):
            assert raw_bytes(outs[r]) == raw_bytes(make(c, expected[r])), f"{algorithm} n={size} rank {r} {c}"


def test_an_uneven_call_never_reuses_the_plan_of_an_even_call_with_the_same_splits():
    # Rank 0's splits for the uneven call equal its earlier even call's; rank 1's do not. Reusing
    # the even call's plan ran Bruck (equal blocks only) on rank 0 and pairwise on rank 1.
    def fn(comm):
        comm.transport.window = None   # schedules only: where the two plans differ
        comm.all_to_all(np.empty(4, np.float32), np.ones(4, np.float32))
        sends = (2, 2) if comm.rank == 0 else (2, 3)
        recvs = (2, 2) if comm.rank == 0 else (2, 3)
        out = np.empty(sum(recvs), np.float32)
        comm.all_to_all(out, np.full(sum(sends), comm.rank, np.float32), recvs, sends)
        return out
    outs = run_threads(2, fn, timeout=5)
    assert outs[0].tolist() == [0, 0, 1, 1] and outs[1].tolist() == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("algorithm", ["direct", "one_shot"])
def test_window_all_to_all_refuses_a_block_of_another_length_on_every_rank(algorithm):
    world, got = ThreadsWorld(3), [None] * 3

    def main(rank):
        comm = Communicator(ThreadsTransport(world, rank), timeout=5)
        sends = (1, 1, 1)
        recvs = (1, 2, 1) if rank == 0 else (1, 1, 1)   # rank 0 expects 2 from rank 1, which sends 1
        try:
            comm.all_to_all(np.empty(sum(recvs)), np.ones(3), recvs, sends, algorithm=algorithm)
        except BaseException as err:   # collected, then asserted on
            got[rank] = err
    threads = [threading.Thread(target=main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(got[0], MismatchError) and "rank 1 sends 1 elements to this rank, which expects 2" in str(got[0])
    # named as every other error of the call: collective, sequence number, algorithm (it once said "all_to_all on")
    assert str(got[0]).startswith(f"all_to_all #0 ({algorithm}, "), got[0]
    assert all(isinstance(e, (MismatchError, PeerAbortedError)) for e in got[1:]), got



def test_a_rank_whose_own_splits_disagree_about_its_own_block_is_refused_before_any_message():
    """Its in_splits and out_splits disagree about the block it sends itself: a local argument
    error (UsageError, raised before communication), not a MismatchError after a round trip."""
    def body(comm):
        with pytest.raises(UsageError, match=r'argument "out_splits" \(expected out_splits\[%d\] equal' % comm.rank):
            comm.all_to_all(np.zeros(5, np.float32), np.zeros(4, np.float32), out_splits=[3, 2] if comm.rank == 0
                            else [2, 3], in_splits=[2, 2])
        x = np.arange(4, dtype=np.float32) + 10 * comm.rank
        out = np.empty(4, np.float32)
        comm.all_to_all(out, x)   # nothing was sent: the communicator goes on
        return out.tolist()
    assert run_threads(2, body) == [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("algorithm", algorithms.names("all_to_all") + [None])
def test_all_to_all_in_place(algorithm, size):
    """MPI_IN_PLACE's form: out is x itself. Even calls four times on the same array (the
    implicit memo remembers a call from its second time on), with x refilled between calls;
    then uneven ones whose splits differ but add up alike (a symmetric matrix)."""
    block = 257
    even_only = algorithm is not None and algorithms.get("all_to_all", algorithm).even_only
    m = [[(i + j) % 3 + (i * j) % 2 for j in range(size)] for i in range(size)]   # M[i][j] == M[j][i]

    def fn(comm):
        r, got = comm.rank, []
        x = np.empty(size * block, np.float64)
        for call in range(4):
            x[...] = np.arange(size * block) + 1e4 * r + 1e6 * call
            assert comm.all_to_all(x, x, algorithm=algorithm) is x
            got.append(x.copy())
        if not even_only:
            y = np.arange(sum(m[r]), dtype=np.float64) + 1e4 * r
            comm.all_to_all(y, y, out_splits=[m[i][r] for i in range(size)], in_splits=m[r], algorithm=algorithm)
            got.append(y)
        return got
    for r, got in enumerate(run_threads(size, fn)):
        for call in range(4):
            ins = [np.arange(size * block, dtype=np.float64) + 1e4 * q + 1e6 * call for q in range(size)]
            assert got[call].tobytes() == REF.reference(ins)[r].tobytes(), f"{algorithm} n={size} call {call}"
        if not even_only:
            ins = [np.arange(sum(m[q]), dtype=np.float64) + 1e4 * q for q in range(size)]
            assert got[4].tobytes() == REF.reference(ins, in_splits=m)[r].tobytes(), f"{algorithm} n={size} uneven"
