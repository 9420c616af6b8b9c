"""broadcast: every algorithm x world size x root x count x dtype; every rank gets root's bits."""
import pytest

from collective_grid import run
from grid import SIZES, Case, data_cases, make, raw_bytes, thin, values
from ringcomm import algorithms


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("broadcast") + [None])
def test_broadcast(algorithm, size):
    roots = sorted({0, size // 2, size - 1})
    case_list = [Case(c.count, c.dtype, c.op, c.kind, (root,)) for root in roots
                 for c in thin(data_cases(size, big=algorithm is not None), size)]

    def call(comm, c, v):
        x = make(c, v)
        assert comm.broadcast(x, root=c.extra[0], algorithm=algorithm) is x
        return x
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, c.count), call)):
        expected = raw_bytes(make(c, per_rank[c.extra[0]]))
        for r in range(size):
            assert raw_bytes(outs[r]) == expected, f"{algorithm} n={size} rank {r} {c}"
