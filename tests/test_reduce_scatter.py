"""reduce_scatter: rank r gets chunk r reduced (float64 reference), bitwise like its peers would."""
import numpy as np
import pytest
import torch

from grid import SIZES, assert_close, cases, make, raw_bytes, reference, values
from ringcomm import algorithms
from ringcomm.testing import run_threads


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("reduce_scatter") + [None])
def test_reduce_scatter(algorithm, size):
    case_list = [c for c in cases(size, big=algorithm is not None) if c.count < 1000] + \
        [c for c in cases(size, big=algorithm is not None) if c.count >= 1000][:1]
    inputs = [[values(c, r, c.count * size) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        outs = []
        for c, v in zip(case_list, inputs[comm.rank]):
            x = make(c, v)
            before = raw_bytes(x)
            out = torch.empty(c.count, dtype=x.dtype) if isinstance(x, torch.Tensor) else np.empty(c.count, x.dtype)
            assert comm.reduce_scatter(out, x, op=c.op, algorithm=algorithm) is out
            assert raw_bytes(x) == before, "reduce_scatter changed its input"
            outs.append(out)
            own = x[comm.rank * c.count:(comm.rank + 1) * c.count]   # in place: out is x's chunk
            comm.reduce_scatter(own, x, op=c.op, algorithm=algorithm)
            outs.append(own.clone() if isinstance(own, torch.Tensor) else own.copy())
        return outs
    results = run_threads(size, rank_fn, timeout=120)
    for i, c in enumerate(case_list):
        per_rank = [inputs[r][i] for r in range(size)]
        full = reference(c, per_rank)
        for r in range(size):
            chunk = slice(r * c.count, (r + 1) * c.count)
            for k in (2 * i, 2 * i + 1):
                assert_close(c, results[r][k], full[chunk], [p[chunk] for p in per_rank],
                             f"{algorithm} n={size} rank {r}")
            assert raw_bytes(results[r][2 * i]) == raw_bytes(results[r][2 * i + 1])
