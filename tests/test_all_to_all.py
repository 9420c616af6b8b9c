"""all_to_all: block j of every rank's x lands at rank j, in rank order, exactly; even and uneven
splits (zeros included); x never changes."""
import numpy as np
import pytest

from collective_grid import run
from grid import SIZES, Case, data_cases, empty, make, raw_bytes, thin, values
from ringcomm import algorithms, collectives

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
