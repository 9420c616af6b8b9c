"""all_reduce: every algorithm x world size 1..16 x count x dtype x op, in place and out of place,
against the collective's reference (float64 or exact), bitwise identical on every rank."""
import numpy as np
import pytest
import torch

import ringcomm
from collective_grid import run
from grid import (FACTOR, SIZES, assert_close, assert_identical, empty, make, op_arg, raw_bytes,
                  reduction_cases, thin, values)
from ringcomm import algorithms, collectives
from ringcomm.testing import run_threads

REF = collectives.get("all_reduce")


def call(comm, case, v, algorithm):
    x = make(case, v)
    if case.extra == ("out",):
        keep, out = raw_bytes(x), empty(case, case.count)
        assert comm.all_reduce(x, op=op_arg(case), out=out, algorithm=algorithm) is out
        assert raw_bytes(x) == keep, "out of place: x must not change"
        return out
    assert comm.all_reduce(x, op=op_arg(case), algorithm=algorithm) is x
    return x


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", algorithms.names("all_reduce") + [None])
def test_all_reduce(algorithm, size):
    case_list = [c if i % 2 else type(c)(c.count, c.dtype, c.op, c.kind, ("out",))
                 for i, c in enumerate(thin(reduction_cases(size, big=algorithm is not None), size))]
    for case, (outs, per_rank) in zip(case_list, run(size, case_list, lambda c, r: values(c, r, c.count),
                                                         lambda comm, c, v: call(comm, c, v, algorithm))):
        ref = REF.reference(per_rank, op=case.op, dtype=case.dtype, factor=FACTOR)[0]
        assert_identical(outs, f"{algorithm} n={size} {case}")
        assert_close(case, outs[0], ref, per_rank, f"{algorithm} n={size}")


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


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("size", [2, 3, 5])
def test_half_precision_avg_never_overflows_when_the_average_is_representable(dtype, size):
    def rank_fn(comm):
        x = torch.full((9,), 60000.0 if dtype == "float16" else 3e38, dtype=getattr(torch, dtype))
        return comm.all_reduce(x, op="avg")
    outs = run_threads(size, rank_fn)
    assert len({o.view(torch.uint8).numpy().tobytes() for o in outs}) == 1
    expected = 60000.0 if dtype == "float16" else 3e38
    got = outs[0].float()
    assert torch.isfinite(got).all() and torch.allclose(got, torch.full_like(got, expected), rtol=2 ** -7)


def test_premul_sum_scales_every_input_once():
    def rank_fn(comm):
        return comm.all_reduce(np.full(4, comm.rank + 1.0, np.float32), op=ringcomm.premul_sum(0.5))
    assert all((o == 0.5 * 6).all() for o in run_threads(3, rank_fn))


def _signed_zeros_and_nans(dtype: str, rank: int) -> np.ndarray:
    """Values on which ops that commute in value do not commute in bits: -0.0 against 0.0 (max and
    min return their first operand on a tie) and NaNs whose sign and payload differ by rank (a
    sum or product of two NaNs keeps its first operand's)."""
    bits = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    width = np.dtype(bits).itemsize * 8
    mant = {16: 10, 32: 23, 64: 52}[width]
    sign, exp_all = bits(1) << bits(width - 1), ((bits(1) << bits(width - 1 - mant)) - bits(1)) << bits(mant)
    quiet = bits(1) << bits(mant - 1)
    zero = sign if rank % 2 else bits(0)
    nan = exp_all | quiet | bits(rank + 1) | (sign if rank % 3 == 1 else bits(0))
    one = np.array([1.0], dtype).view(bits)[0]
    pattern = [zero, zero ^ sign, nan, one, nan, zero]
    return np.array(pattern * 7, dtype=bits).view(dtype)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("algorithm", algorithms.names("all_reduce") + [None])
def test_every_rank_holds_the_same_bits_where_signed_zeros_and_nans_meet(algorithm, size):
    """Recursive doubling once had each rank of a pair compute own OP peer: max of -0.0 and 0.0 was
    0.0 on one rank and -0.0 on the other, and sums of NaNs kept each rank's own NaN."""
    def rank_fn(comm):
        outs = []
        for dtype in ("float16", "float32", "float64"):
            for op in ("sum", "prod", "max", "min"):
                x = _signed_zeros_and_nans(dtype, comm.rank)
                outs.append(comm.all_reduce(x, op=op, algorithm=algorithm).tobytes())
        return outs
    outs = run_threads(size, rank_fn)
    for i, got in enumerate(outs[0]):
        assert all(o[i] == got for o in outs[1:]), f"{algorithm} n={size} case {i}: ranks differ bitwise"
