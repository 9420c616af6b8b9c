"""reduce: root gets the reduction (reference); no other rank's input changes; in and out of place."""
import pytest

from collective_grid import run
from grid import (FACTOR, SIZES, Case, assert_close, empty, make, op_arg, raw_bytes, reduction_cases, thin,
                  values)
from ringcomm import algorithms, collectives

REF = collectives.get("reduce")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("reduce") + [None])
def test_reduce(algorithm, size):
    roots = sorted({0, size - 1})
    case_list = [Case(c.count, c.dtype, c.op, c.kind, (root, "out" if i % 2 else "in"))
                 for root in roots for i, c in enumerate(thin(reduction_cases(size, big=algorithm is not None), size))]

    def call(comm, c, v):
        root, where = c.extra
        x = make(c, v)
        keep = raw_bytes(x)
        if where == "out":
            out = empty(c, c.count) if comm.rank == root else None
            assert comm.reduce(x, root=root, op=op_arg(c), out=out, algorithm=algorithm) is (out if out is not None else x)
            assert raw_bytes(x) == keep, "out of place: x must not change"
            return out if comm.rank == root else x
        assert comm.reduce(x, root=root, op=op_arg(c), algorithm=algorithm) is x
        return x
    for c, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, c.count), call)):
        root = c.extra[0]
        expected = REF.reference(per_rank, root=root, op=c.op, dtype=c.dtype, factor=FACTOR)
        assert_close(c, outs[root], expected[root], per_rank, f"{algorithm} n={size} root={root}")
        for r in range(size):
            if r != root:
                assert raw_bytes(outs[r]) == raw_bytes(make(c, per_rank[r])), \
                    f"{algorithm} n={size}: reduce changed non-root rank {r}'s input {c}"
