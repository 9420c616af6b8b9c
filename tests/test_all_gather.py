"""all_gather: out holds every rank's x, rank-major, exactly; in place and out of place."""
import numpy as np
import pytest
import torch

from grid import SIZES, cases, make, raw_bytes, values
from ringcomm import algorithms
from ringcomm.testing import run_threads


def empty_like_n(x, n):
    if isinstance(x, torch.Tensor):
        return torch.empty(n * x.numel(), dtype=x.dtype)
    return np.empty(n * x.size, dtype=x.dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("all_gather") + [None])
def test_all_gather(algorithm, size):
    case_list = cases(size, ops=["sum"], big=algorithm is not None)
    inputs = [[values(c, r, c.count) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        outs = []
        for c, v in zip(case_list, inputs[comm.rank]):
            x = make(c, v)
            out = empty_like_n(x, comm.size)
            assert comm.all_gather(out, x, algorithm=algorithm) is out
            outs.append(out)
            inplace = empty_like_n(x, comm.size)       # x is out's own chunk
            own = inplace[comm.rank * c.count:(comm.rank + 1) * c.count]
            own[...] = x
            comm.all_gather(inplace, own, algorithm=algorithm)
            outs.append(inplace)
        return outs
    results = run_threads(size, rank_fn, timeout=120)
    for i, c in enumerate(case_list):
        expected = b"".join(raw_bytes(make(c, inputs[r][i])) for r in range(size))
        for r in range(size):
            for k in (2 * i, 2 * i + 1):
                assert raw_bytes(results[r][k]) == expected, f"{algorithm} n={size} rank {r} {c} ({k % 2=})"
