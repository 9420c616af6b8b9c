"""The compiled window round (ringcomm/core/_round.c) against the Python round it replaces.

Both must give the same bits for every (op, dtype) the compiled round takes, on every rank,
including ranks that mix the two; the compiled round's slow paths (a late peer, a rank in
another call, an absent peer) must end as the Python round's do. The mpirun job that mixes
compiled and Python ranks across processes is in test_mpi_collectives.py."""
import shutil
import time

import numpy as np
import pytest

from ringcomm import CommTimeoutError, MismatchError, ReduceOp
from ringcomm.core import compiled
from ringcomm.core.ops import DTYPES, check_op, reducer, round_code
from ringcomm.testing import run_threads
from ringcomm.transport.window import JOB_CAPACITY

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled round was not built (no C compiler)")

def allowed(op, name) -> bool:
    try:
        check_op("all_reduce", op, DTYPES[name])
    except ValueError:
        return False
    return True


PAIRS = [(op, name) for op in ReduceOp if op is not ReduceOp.PREMUL_SUM for name in DTYPES
         if allowed(op, name) and round_code(op, DTYPES[name]) >= 0]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_an_install_with_a_compiler_built_it():
    assert compiled.available(), "pip install -e . ran with a C compiler on PATH but ringcomm/core/_round.c is not built"


def test_the_codes_cover_what_the_c_side_accepts():
    # Floats get only sum and prod (and avg/premul_sum, summed on the wire); ints get every op.
    assert {(op.value, name) for op, name in PAIRS if DTYPES[name].is_float} == {
        (op, name) for op in ("sum", "avg", "prod") for name in ("float32", "float64")}
    assert all(round_code(ReduceOp.SUM, DTYPES[name]) < 0 for name in ("float16", "bfloat16", "bool"))
    assert all(round_code(op, DTYPES["float32"]) < 0 for op in (ReduceOp.MIN, ReduceOp.MAX))


def inputs(name: str, rank: int, count: int) -> np.ndarray:
    """Values that stress the arithmetic: overflow and wrap-around, NaN, infinities, signed zeros,
    subnormals, values whose sum depends on the order of addition."""
    dtype = DTYPES[name].storage
    rng = np.random.default_rng(rank * 7919 + count)
    if DTYPES[name].is_float:
        x = rng.standard_normal(count) * 10.0 ** rng.integers(-30, 30, count)
        specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, 1e308, -1e308]
        x[: min(count, 8)] = specials[: min(count, 8)] if rank % 2 else x[: min(count, 8)]
        with np.errstate(over="ignore"):   # float32: the largest values become infinities, on purpose
            return x.astype(dtype)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    x[: min(count, 2)] = [info.max, info.min][: min(count, 2)]
    return x


def all_reduce_bits(size, op, name, count, compiled_on, monkeypatch, python_ranks=()):
    monkeypatch.setenv("RINGCOMM_COMPILED", "1" if compiled_on else "0")

    def fn(comm):
        window = comm.transport.window
        if comm.rank in python_ranks:
            window.core = None
        assert (window.core is not None) == (compiled_on and comm.rank not in python_ranks)
        x = inputs(name, comm.rank, count)
        with np.errstate(all="ignore"):
            comm.all_reduce(x, op=op.value, algorithm="one_shot")
        return x.tobytes()
    return run_threads(size, fn)


@pytest.mark.parametrize("op,name", PAIRS, ids=[f"{op.value}-{name}" for op, name in PAIRS])
def test_same_bits_as_the_python_round_on_every_rank(op, name, monkeypatch):
    for size, count in ((2, 1), (3, 257), (5, 4099), (2, JOB_CAPACITY // DTYPES[name].itemsize),
                        (3, 5 * JOB_CAPACITY // DTYPES[name].itemsize // 2 + 3)):   # pieces
        fast = all_reduce_bits(size, op, name, count, True, monkeypatch)
        slow = all_reduce_bits(size, op, name, count, False, monkeypatch)
        assert len(set(fast)) == 1, f"{size} ranks, {count} elements: ranks differ"
        assert fast[0] == slow[0], f"{size} ranks, {count} elements: compiled and Python rounds differ"


@pytest.mark.parametrize("op,name", [(ReduceOp.SUM, "float32"), (ReduceOp.PROD, "float64"), (ReduceOp.MAX, "int8"),
                                     (ReduceOp.BXOR, "int64")])
def test_ranks_mixing_compiled_and_python_rounds_agree(op, name, monkeypatch):
    reference = all_reduce_bits(7, op, name, 1001, False, monkeypatch)[0]
    mixed = all_reduce_bits(7, op, name, 1001, True, monkeypatch, python_ranks=(1, 4, 5))
    assert set(mixed) == {reference}


def test_a_late_peer_is_waited_for_and_counted_in(monkeypatch):
    # Threads never spin (window.spin == 0): rank 0's compiled round returns with rank 2 late,
    # the Python wait takes over, then the compiled reduction finishes the round.
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")

    def fn(comm):
        x = np.full(300, comm.rank + 1, np.float32)
        if comm.rank == 2:
            time.sleep(0.2)
        comm.all_reduce(x, algorithm="one_shot")
        return x
    for x in run_threads(3, fn):
        assert (x == 6).all()


def test_ranks_in_different_calls_raise_on_every_rank(monkeypatch):
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    from test_one_shot import outcomes

    def fn(comm):
        assert comm.transport.window.core is not None
        comm.all_reduce(np.ones(100 + (comm.rank == 1), np.float32), algorithm="one_shot")
    for err in outcomes(3, fn):
        assert isinstance(err, MismatchError) and "count" in str(err), err


def test_an_absent_peer_is_named_within_the_timeout(monkeypatch):
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    from test_one_shot import outcomes

    def fn(comm):
        if comm.rank != 1:
            comm.all_reduce(np.ones(10, np.float32), algorithm="one_shot")
    started = time.monotonic()
    out = outcomes(3, fn, timeout=1.0)
    assert time.monotonic() - started < 20
    for rank in (0, 2):
        assert isinstance(out[rank], CommTimeoutError) and "rank 1" in str(out[rank]), out[rank]


def test_the_core_refuses_what_it_cannot_do():
    region = np.zeros(64 + 2 * (64 + 1024), np.uint8)
    core = compiled.Core(0, 1024, (region.ctypes.data,))
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="reduction code"):
        core.all_reduce(1, x, x, 99, 0, 0, 0.0)
    with pytest.raises(ValueError, match="bytes"):
        core.all_reduce(1, x, np.ones(4, np.float32), reducer(ReduceOp.SUM, DTYPES["float32"]).code, 0, 0, 0.0)
    with pytest.raises(ValueError, match="window slot"):
        big = np.ones(512, np.float32)
        core.all_reduce(1, big, big, 0, 0, 0, 0.0)
    with pytest.raises(ValueError):
        compiled.Core(3, 1024, (region.ctypes.data,))
    with pytest.raises(RuntimeError, match="not initialised"):
        compiled.Core.__new__(compiled.Core).reduce(1, x, 0)
    # One rank: the round is a copy through its own slot.
    y = np.arange(8, dtype=np.float32)
    out = np.empty_like(y)
    assert core.all_reduce(1, y, out, 0, 5, 0, 0.0) == 0 and (out == y).all()


@pytest.mark.parametrize("compiled_address", [True, False])
def test_array_address_is_numpys_for_every_layout(compiled_address, monkeypatch):
    if not compiled_address:
        monkeypatch.setattr(compiled, "_address", None)   # an install without a compiler
    elif compiled._address is None:
        pytest.skip("the extension was not built")
    base = np.arange(60, dtype=np.float64)
    read_only = base.copy()
    read_only.flags.writeable = False
    for a in (base, base[7:], base[::-3], base.reshape(6, 10)[:, 2:5], read_only, np.empty(0, np.int8),
              np.frombuffer(bytearray(16), np.uint8)):
        assert compiled.array_address(a) == a.ctypes.data
