"""all_gather: out holds every rank's x, rank-major, exactly; even and uneven counts (zeros among
them), in place, out of place, and in place on some ranks only."""
import pytest

from collective_grid import run
from grid import SIZES, Case, data_cases, empty, make, raw_bytes, thin, uneven_counts, values
from ringcomm import algorithms


def counts_of(case, size):
    return case.extra[1] if case.extra[1] is not None else (case.count,) * size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("all_gather") + [None])
def test_all_gather(algorithm, size):
    base = thin(data_cases(size, big=algorithm is not None), size)
    case_list = []
    for i, c in enumerate(base):
        uneven = uneven_counts(size, i) if i % 3 == 1 else None
        # "mixed": the odd ranks in place, the others not (each rank's road is its own affair)
        case_list.append(Case(c.count, c.dtype, c.op, c.kind, (("out", "in", "out", "mixed")[i % 4], uneven)))

    def call(comm, c, v):
        where, uneven = c.extra
        counts = counts_of(c, comm.size)
        x = make(c, v)
        out = empty(c, sum(counts))
        if where == "in" or (where == "mixed" and comm.rank % 2):   # x is out's own part
            off = sum(counts[:comm.rank])
            own = out[off:off + counts[comm.rank]]
            own[...] = x
            x = own
        assert comm.all_gather(out, x, counts=uneven, algorithm=algorithm) is out
        return out

    def inputs(c, r):
        return values(c, r, counts_of(c, size)[r])
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, inputs, call)):
        expected = b"".join(raw_bytes(make(c, per_rank[r])) for r in range(size))
        for r in range(size):
            assert raw_bytes(outs[r]) == expected, f"{algorithm} n={size} rank {r} {c}"
