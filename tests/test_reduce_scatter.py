"""reduce_scatter: rank r gets part r of the reduction (reference); even and uneven counts; x is
never changed; out may be exactly x's own part, on every rank or on some."""
import pytest
import torch

from collective_grid import run
from grid import (FACTOR, SIZES, Case, assert_close, empty, make, op_arg, raw_bytes, reduction_cases, thin,
                  uneven_counts, values)
from ringcomm import algorithms, collectives

REF = collectives.get("reduce_scatter")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("reduce_scatter") + [None])
def test_reduce_scatter(algorithm, size):
    base = thin(reduction_cases(size, big=algorithm is not None), size)
    case_list = []
    for i, c in enumerate(base):
        counts = uneven_counts(size, i) if i % 3 == 1 else (c.count if c.count < 1000 else 4099,) * size
        # "mixed": the odd ranks in place, the others not (each rank's road is its own affair)
        case_list.append(Case(c.count, c.dtype, c.op, c.kind, (("out", "in", "out", "mixed")[i % 4], counts,
                                                                  i % 3 == 1)))

    def call(comm, c, v):
        where, counts, uneven = c.extra
        x = make(c, v)
        keep = raw_bytes(x)
        off = sum(counts[:comm.rank])
        in_place = where == "in" or (where == "mixed" and comm.rank % 2)
        if in_place:
            out = x[off:off + counts[comm.rank]]
        else:
            out = empty(c, counts[comm.rank])
        assert comm.reduce_scatter(out, x, op=op_arg(c), counts=counts if uneven else None, algorithm=algorithm) is out
        if not in_place:
            assert raw_bytes(x) == keep, "reduce_scatter changed its input"
        return out.clone() if isinstance(out, torch.Tensor) else out.copy()

    for c, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, sum(c.extra[1])), call)):
        counts = c.extra[1]
        expected = REF.reference(per_rank, op=c.op, dtype=c.dtype, factor=FACTOR, counts=counts)
        for r in range(size):
            off = sum(counts[:r])
            assert_close(c, outs[r], expected[r], [p[off:off + counts[r]] for p in per_rank],
                         f"{algorithm} n={size} rank {r}")
