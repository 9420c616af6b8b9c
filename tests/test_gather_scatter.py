"""gather and scatter: every algorithm x world size x root x count x dtype, exactly."""
import pytest

from collective_grid import run
from grid import SIZES, Case, data_cases, empty, make, raw_bytes, thin, values
from ringcomm import algorithms, collectives


def cases_with_roots(size, algorithm):
    roots = sorted({0, size // 2, size - 1})
    return [Case(c.count if c.count < 1000 else 4099, c.dtype, c.op, c.kind, (root,)) for root in roots
            for c in thin(data_cases(size, big=algorithm is not None), size)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("gather") + [None])
def test_gather(algorithm, size):
    case_list = cases_with_roots(size, algorithm)

    def call(comm, c, v):
        root = c.extra[0]
        x = make(c, v)
        keep = raw_bytes(x)
        out = empty(c, size * c.count) if comm.rank == root else None
        assert comm.gather(out, x, root=root, algorithm=algorithm) is out
        assert raw_bytes(x) == keep
        return out
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, c.count), call)):
        root = c.extra[0]
        expected = collectives.get("gather").reference(per_rank, root=root)
        assert raw_bytes(outs[root]) == raw_bytes(make(c, expected[root])), f"{algorithm} n={size} {c}"
        assert all(outs[r] is None for r in range(size) if r != root)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("scatter") + [None])
def test_scatter(algorithm, size):
    case_list = cases_with_roots(size, algorithm)

    def call(comm, c, v):
        root = c.extra[0]
        x = make(c, v) if comm.rank == root else None
        keep = None if x is None else raw_bytes(x)
        out = empty(c, c.count)
        assert comm.scatter(out, x, root=root, algorithm=algorithm) is out
        assert x is None or raw_bytes(x) == keep
        return out
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, size * c.count), call)):
        root = c.extra[0]
        expected = collectives.get("scatter").reference(per_rank, root=root)
        for r in range(size):
            assert raw_bytes(outs[r]) == raw_bytes(make(c, expected[r])), f"{algorithm} n={size} rank {r} {c}"


@pytest.mark.parametrize("compiled_on", ["1", "0"])
def test_one_shot_gather_and_scatter_of_blocks_larger_than_a_round(compiled_on, monkeypatch):
    # The grid's counts fit one round of the job's window; these take several (and the last
    # piece shorter), on the compiled core's side of a call or the Python round's alike.
    import numpy as np
    from ringcomm.testing import run_threads
    from ringcomm.transport.window import JOB_CAPACITY
    monkeypatch.setenv("RINGCOMM_COMPILED", compiled_on)
    size, count = 3, 3 * JOB_CAPACITY // 8 + 5

    def fn(comm):
        root = 1
        x = np.arange(count, dtype=np.float64) + 1e6 * comm.rank
        out = np.zeros(count * size) if comm.rank == root else None
        comm.gather(out, x, root=root, algorithm="one_shot")
        whole = np.arange(count * size, dtype=np.float64) * 3 if comm.rank == root else None
        mine = np.zeros(count)
        comm.scatter(mine, whole, root=root, algorithm="one_shot")
        return out, mine
    for rank, (out, mine) in enumerate(run_threads(size, fn)):
        if rank == 1:
            expected = np.concatenate([np.arange(count, dtype=np.float64) + 1e6 * r for r in range(size)])
            assert out.tobytes() == expected.tobytes()
        assert mine.tobytes() == (np.arange(count * rank, count * (rank + 1), dtype=np.float64) * 3).tobytes()


def test_gather_and_scatter_are_priced_on_the_gathered_size_their_algorithms_costs_are_written_in():
    # Every gather/scatter algorithm's cost takes S, the whole gathered vector; priced on one
    # rank's block, the selector moved each crossover n times the size away.
    import numpy as np
    from ringcomm.testing import run_threads

    def job(comm):
        block = np.ones(1000, np.float32)
        gathered = np.empty(comm.size * 1000, np.float32) if comm.rank == 0 else None
        calls = (collectives.GATHER.prepare(comm, gathered, block, 0),
                 collectives.SCATTER.prepare(comm, block, gathered if comm.rank == 0 else None, 0))
        return [c.collective.nbytes(c, comm.size) for c in calls]
    assert run_threads(4, job) == [[16000, 16000]] * 4


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("algorithm", algorithms.names("gather") + [None])
def test_gather_in_place_at_the_root(algorithm, size):
    """MPI_IN_PLACE's form: root's x is its own block of out. Called four times on the same
    arrays (the implicit memo remembers a call from its second time on), with root's block and
    every peer's x changed between calls: each result is that call's, bit for bit."""
    import numpy as np
    from ringcomm.testing import run_threads
    count = 1000

    def fn(comm):
        results = []
        for root in sorted({0, size - 1}):
            out = np.full(size * count, -1.0, np.float32) if comm.rank == root else None
            x = out[root * count:(root + 1) * count] if comm.rank == root else np.empty(count, np.float32)
            for call in range(4):
                x[...] = np.arange(count) + 1000 * comm.rank + 1e5 * call
                assert comm.gather(out, x, root=root, algorithm=algorithm) is out
                results.append(None if out is None else out.copy())
        return results
    for rank, results in enumerate(run_threads(size, fn)):
        calls = iter(results)
        for root in sorted({0, size - 1}):
            for call in range(4):
                got = next(calls)
                if rank != root:
                    assert got is None
                    continue
                expected = np.concatenate([np.arange(count, dtype=np.float32) + 1000 * r + 1e5 * call
                                           for r in range(size)])
                assert got.tobytes() == expected.tobytes(), f"{algorithm} n={size} root {root} call {call}"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("algorithm", algorithms.names("scatter") + [None])
def test_scatter_in_place_at_the_root(algorithm, size):
    """MPI_IN_PLACE's form: root's out is its own block of x, which no call changes; the others'
    blocks arrive as from any scatter, call after call on the same arrays."""
    import numpy as np
    from ringcomm.testing import run_threads
    count = 1000

    def fn(comm):
        results = []
        for root in sorted({0, size - 1}):
            x = np.empty(size * count, np.float32) if comm.rank == root else None
            out = x[root * count:(root + 1) * count] if comm.rank == root else np.zeros(count, np.float32)
            for call in range(4):
                if x is not None:
                    x[...] = np.arange(size * count) + 1e5 * call
                assert comm.scatter(out, x, root=root, algorithm=algorithm) is out
                results.append((out.copy(), None if x is None else x.copy()))
        return results
    for rank, results in enumerate(run_threads(size, fn)):
        calls = iter(results)
        for root in sorted({0, size - 1}):
            for call in range(4):
                out, x = next(calls)
                whole = np.arange(size * count, dtype=np.float32) + 1e5 * call
                assert out.tobytes() == whole[rank * count:(rank + 1) * count].tobytes(), \
                    f"{algorithm} n={size} root {root} call {call} rank {rank}"
                assert x is None or x.tobytes() == whole.tobytes()   # root's x is never changed


def test_a_root_block_that_is_not_exactly_roots_is_still_refused():
    """In place means x is exactly root's block of out (scatter: out exactly root's block of x);
    any other overlap is refused before any message, on the rank that made it."""
    import numpy as np
    from ringcomm.errors import UsageError
    from ringcomm.testing import run_threads

    def fn(comm):
        if comm.rank:
            return
        out = np.zeros(8, np.float32)
        with pytest.raises(UsageError, match='"out".*overlap'):
            comm.gather(out, out[4:8], root=0)        # rank 1's block, passed by the root
        with pytest.raises(UsageError, match='"out".*overlap'):
            comm.gather(out, out[1:5], root=0)        # straddles two blocks
        with pytest.raises(UsageError, match='"out".*overlap'):
            comm.scatter(out[4:8], out, root=0)       # rank 1's block as the root's out
    run_threads(2, fn)
