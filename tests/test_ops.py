"""Reduction kernels: bfloat16 rounding matches torch bit for bit, avg finishes identically."""
import numpy as np
import pytest
import torch

from ringcomm.core.ops import DTYPES, ReduceOp, bf16_to_f32, divide_by_size, f32_to_bf16, reducer


def test_bf16_rounding_matches_torch_including_specials():
    rng = np.random.default_rng(0)
    f = np.concatenate([rng.standard_normal(100_000).astype(np.float32) * 10.0 ** rng.integers(-40, 38, 100_000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8],
                                 np.float32)]).astype(np.float32)
    mine = np.empty(f.size, np.uint16)
    f32_to_bf16(f, mine)
    theirs = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (mine == theirs).all()
    nan = np.empty(1, np.uint16)
    f32_to_bf16(np.array([np.nan], np.float32), nan)
    assert np.isnan(bf16_to_f32(nan))[0]


def test_bf16_sum_is_one_rounding_of_the_float32_sum():
    a = torch.randn(1000).to(torch.bfloat16)
    b = torch.randn(1000).to(torch.bfloat16)
    dst = a.view(torch.int16).numpy().view(np.uint16).copy()
    reducer(ReduceOp.SUM, DTYPES["bfloat16"])(dst, b.view(torch.int16).numpy().view(np.uint16))
    expected = (a.float() + b.float()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (dst == expected).all()


def test_divide_by_size_for_every_float_dtype():
    for name in ("float16", "float32", "float64"):
        x = np.full(5, 6, dtype=name)
        divide_by_size(x, DTYPES[name], 3)
        assert (x == 2).all()
    bf = np.full(5, 0x40C0, np.uint16)   # 6.0 in bfloat16
    divide_by_size(bf, DTYPES["bfloat16"], 3)
    assert (bf16_to_f32(bf) == 2.0).all()


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_dtype_and_op_matches_torch_gloo_or_both_refuse(tmp_path, n):
    """ringcomm against torch's own ProcessGroupGloo, same inputs. The documented differences:
    gloo refuses int16 altogether and has no premul_sum (NCCL's); ringcomm accepts both."""
    import json

    from mpi_util import run_mpi
    run_mpi(n, "ops_vs_gloo.py", tmp_path / "ops.json", timeout=120)
    report = json.loads((tmp_path / "ops.json").read_text())
    assert report["ranks_agree"]
    for pair, entry in report["pairs"].items():
        dtype, op = pair.split()
        gloo_ok, ours_ok = entry["gloo"] == "ok", entry["ringcomm"] == "ok"
        if dtype == "int16" and op not in ("avg", "premul_sum"):
            assert not gloo_ok and ours_ok, (pair, entry)
        elif op == "premul_sum" and dtype in ("float16", "bfloat16", "float32", "float64"):
            assert not gloo_ok and ours_ok, (pair, entry)
        else:
            assert gloo_ok == ours_ok, (pair, entry)
            if ours_ok:   # bool sums: gloo leaves non-canonical bytes (2 for True+True)
                assert entry["equal"] == ("close" if dtype == "bool" and op == "sum" else "bitwise"), (pair, entry)
