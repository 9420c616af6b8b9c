"""reduce: root gets the reduction (float64 reference); other ranks' inputs stay untouched."""
import pytest

from grid import SIZES, assert_close, cases, make, raw_bytes, reference, values
from ringcomm import algorithms
from ringcomm.testing import run_threads


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("reduce") + [None])
def test_reduce(algorithm, size):
    case_list = cases(size, big=algorithm is not None)
    roots = sorted({0, size - 1})
    inputs = [[values(c, r, c.count) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        outs = []
        for root in roots:
            for c, v in zip(case_list, inputs[comm.rank]):
                x = make(c, v)
                assert comm.reduce(x, root=root, op=c.op, algorithm=algorithm) is x
                outs.append(x)
        return outs
    results = run_threads(size, rank_fn, timeout=120)
    k = 0
    for root in roots:
        for i, c in enumerate(case_list):
            per_rank = [inputs[r][i] for r in range(size)]
            assert_close(c, results[root][k], reference(c, per_rank), per_rank, f"{algorithm} n={size} root={root}")
            for r in range(size):
                if r != root:
                    assert raw_bytes(results[r][k]) == raw_bytes(make(c, inputs[r][i])), \
                        f"{algorithm} n={size}: reduce changed non-root rank {r}'s input {c}"
            k += 1
