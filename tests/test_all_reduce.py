"""all_reduce: every algorithm x world size 1..16 x count x dtype x op, against float64, bitwise."""
import numpy as np
import pytest

from grid import SIZES, assert_close, assert_identical, cases, make, reference, values
from ringcomm import algorithms
from ringcomm.testing import run_threads


def run_cases(size, algorithm, case_list):
    inputs = [[values(c, r, c.count) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        outs = []
        for c, v in zip(case_list, inputs[comm.rank]):
            x = make(c, v)
            assert comm.all_reduce(x, op=c.op, algorithm=algorithm) is x
            outs.append(x)
        return outs
    return inputs, run_threads(size, rank_fn, timeout=120)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("all_reduce") + [None])
def test_all_reduce(algorithm, size):
    case_list = cases(size, big=algorithm is not None)
    inputs, results = run_cases(size, algorithm, case_list)
    for i, c in enumerate(case_list):
        per_rank = [inputs[r][i] for r in range(size)]
        ref = reference(c, per_rank)
        outs = [results[r][i] for r in range(size)]
        assert_identical(outs, f"{algorithm} n={size} {c}")
        for r in range(size):
            assert_close(c, outs[r], ref, per_rank, f"{algorithm} n={size} rank {r}")


@pytest.mark.parametrize("algorithm", algorithms.names("all_reduce"))
def test_all_reduce_async_ops_complete_in_issue_order(algorithm):
    def rank_fn(comm):
        xs = [np.full(1000 + 17 * i, comm.rank + i, dtype=np.float64) for i in range(6)]
        works = [comm.all_reduce(x, algorithm=algorithm, async_op=True) for x in xs]
        blocking = comm.all_reduce(np.ones(5), algorithm=algorithm)   # queued behind the async ones
        return [w.wait(timeout=60) for w in works], blocking, [w.is_completed() for w in works]
    for outs, blocking, done in run_threads(5, rank_fn):
        for i, x in enumerate(outs):
            assert (x == sum(r + i for r in range(5))).all()
        assert (blocking == 5).all() and all(done)


def test_avg_of_half_precision_is_identical_and_close():
    def rank_fn(comm):
        x = np.full(33, 0.1 * (comm.rank + 1), dtype=np.float16)
        return comm.all_reduce(x, op="avg")
    outs = run_threads(7, rank_fn)
    assert len({o.tobytes() for o in outs}) == 1
    assert abs(float(outs[0][0]) - 0.4) < 2e-3
