"""broadcast: every algorithm x world size x root x count x dtype; every rank gets root's bits."""
import pytest

from grid import SIZES, cases, make, raw_bytes, values
from ringcomm import algorithms
from ringcomm.testing import run_threads


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("broadcast") + [None])
def test_broadcast(algorithm, size):
    case_list = cases(size, ops=["sum"], big=algorithm is not None)
    roots = sorted({0, size // 2, size - 1})
    inputs = [[values(c, r, c.count) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        outs = []
        for root in roots:
            for c, v in zip(case_list, inputs[comm.rank]):
                x = make(c, v)
                assert comm.broadcast(x, root=root, algorithm=algorithm) is x
                outs.append(x)
        return outs
    results = run_threads(size, rank_fn, timeout=120)
    for k, (root, (i, c)) in enumerate((root, ic) for root in roots for ic in enumerate(case_list)):
        expected = raw_bytes(make(c, inputs[root][i]))
        for r in range(size):
            assert raw_bytes(results[r][k]) == expected, f"{algorithm} n={size} root={root} rank {r} {c}"
