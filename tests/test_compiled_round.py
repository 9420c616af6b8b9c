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


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce_scatter"])
def test_an_absent_peer_is_named_within_the_timeout(collective, monkeypatch):
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    from test_one_shot import outcomes

    def fn(comm):
        x = np.ones(30, np.float32)
        if comm.rank != 1:
            {"all_reduce": lambda: comm.all_reduce(x, algorithm="one_shot"),
             "broadcast": lambda: comm.broadcast(x, algorithm="one_shot"),
             "reduce_scatter": lambda: comm.reduce_scatter(np.empty(10, np.float32), x, algorithm="one_shot")}[collective]()
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


# ---- one round of a plan (algorithms/_planned.py): broadcast, all-gather, all-to-all, reduce-scatter

def planned_bits(size, case, compiled_on, monkeypatch, python_ranks=()):
    """Every rank's output bytes of one call of ``case`` (collective, dtype, count, variant,
    op), forced one_shot, with the compiled round on or off (and off on ``python_ranks``)."""
    collective, name, count, variant, op = case
    monkeypatch.setenv("RINGCOMM_COMPILED", "1" if compiled_on else "0")

    def fn(comm):
        window, r = comm.transport.window, comm.rank
        if r in python_ranks:
            window.core = None
        x = inputs(name, r, count * size)
        with np.errstate(all="ignore"):
            if collective == "broadcast":
                y = x[:count].copy()
                comm.broadcast(y, root=size - 1, algorithm="one_shot")
                return y.tobytes()
            if collective == "all_gather":
                counts = [count + (k % 3) for k in range(size)] if variant == "uneven" else None
                mine = counts[r] if counts else count
                out = np.zeros(sum(counts) if counts else count * size, x.dtype)
                at = sum(counts[:r]) if counts else r * count
                if variant == "in_place":
                    out[at:at + mine] = x[:mine]
                    comm.all_gather(out, out[at:at + mine], algorithm="one_shot")
                else:
                    comm.all_gather(out, x[:mine], counts=counts, algorithm="one_shot")
                return out.tobytes()
            if collective == "all_to_all":
                out = np.zeros(count * size, x.dtype)
                comm.all_to_all(out, x, algorithm="one_shot")
                return out.tobytes()
            root = size // 2
            if collective == "gather":
                out = np.zeros(count * size, x.dtype) if r == root else None
                comm.gather(out, x[:count], root=root, algorithm="one_shot")
                return None if out is None else out.tobytes()
            if collective == "scatter":
                out = np.zeros(count, x.dtype)
                comm.scatter(out, x if r == root else None, root=root, algorithm="one_shot")
                return out.tobytes()
            counts = [count + (k % 3) for k in range(size)] if variant == "uneven" else None
            total = sum(counts) if counts else count * size
            x = x[:total].copy() if total <= x.size else np.resize(x, total)
            at = sum(counts[:r]) if counts else r * count
            mine = counts[r] if counts else count
            if variant == "in_place":   # the output is this rank's very part of x
                comm.reduce_scatter(x[at:at + mine], x, op=op.value, algorithm="one_shot")
                return x[at:at + mine].tobytes()
            out = np.zeros(mine, x.dtype)
            comm.reduce_scatter(out, x, op=op.value, counts=counts, algorithm="one_shot")
            return out.tobytes()
    return run_threads(size, fn)


PLANNED = [("broadcast", "float32", 257, "", None), ("broadcast", "int8", 1, "", None),
           ("all_gather", "float64", 100, "", None), ("all_gather", "int16", 33, "uneven", None),
           ("all_gather", "float32", 50, "in_place", None), ("all_to_all", "float32", 40, "", None),
           ("all_to_all", "uint8", 3, "", None), ("gather", "float64", 65, "", None), ("gather", "int8", 1, "", None),
           ("scatter", "float32", 129, "", None), ("scatter", "int16", 2, "", None),
           ("reduce_scatter", "float32", 101, "", ReduceOp.SUM),
           ("reduce_scatter", "float64", 7, "uneven", ReduceOp.PROD), ("reduce_scatter", "int32", 64, "", ReduceOp.MAX),
           ("reduce_scatter", "float32", 90, "in_place", ReduceOp.SUM)]


@pytest.mark.parametrize("case", PLANNED, ids=["-".join(str(v) for v in c[:4] if v != "") for c in PLANNED])
def test_planned_rounds_give_the_python_rounds_bits_on_every_rank(case, monkeypatch):
    for size in (2, 3, 5):
        fast = planned_bits(size, case, True, monkeypatch)
        slow = planned_bits(size, case, False, monkeypatch)
        mixed = planned_bits(size, case, True, monkeypatch, python_ranks=(1,))
        assert fast == slow == mixed, f"{size} ranks: compiled, Python and mixed rounds differ"
        if case[0] in ("broadcast", "all_gather"):
            assert len(set(fast)) == 1, f"{size} ranks: ranks differ"


def test_planned_rounds_take_the_compiled_core(monkeypatch):
    # The grid above would pass if the planned path were never taken: count the core's rounds.
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    from ringcomm.algorithms import _planned
    taken = []
    run = _planned.run
    monkeypatch.setattr(_planned, "run", lambda window, *a: (taken.append(window.rank), run(window, *a)))
    for case in PLANNED:
        planned_bits(3, case, True, monkeypatch)
    assert len(taken) == 3 * len(PLANNED)


@pytest.mark.parametrize("collective", ["broadcast", "all_gather", "all_to_all", "reduce_scatter"])
def test_planned_rounds_of_ranks_in_different_calls_raise_on_every_rank(collective, monkeypatch):
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    from test_one_shot import outcomes

    def fn(comm):
        n = 12 + 3 * (comm.rank == 1)
        x, out = np.ones(n * 3, np.float32), np.full(n * 3, -1.0, np.float32)
        {"broadcast": lambda: comm.broadcast(x, algorithm="one_shot"),
         "all_gather": lambda: comm.all_gather(out, x[:n], algorithm="one_shot"),
         "all_to_all": lambda: comm.all_to_all(out, x, algorithm="one_shot"),
         "reduce_scatter": lambda: comm.reduce_scatter(out[:n], x, algorithm="one_shot")}[collective]()
    for err in outcomes(3, fn):
        assert isinstance(err, MismatchError), err


def test_the_core_refuses_a_malformed_plan():
    from ringcomm.algorithms._planned import COPY, pack
    region = np.zeros(64 + 2 * (64 + 1024), np.uint8)
    regions = [np.zeros_like(region), np.zeros_like(region)]
    core = compiled.Core(0, 1024, tuple(r.ctypes.data for r in regions))
    x, out = np.ones(64, np.uint8), np.zeros(64, np.uint8)
    sum32 = reducer(ReduceOp.SUM, DTYPES["float32"]).code
    bad = [(np.zeros(3, np.int64).tobytes(), COPY),                 # counts that do not match its length
           (b"\0" * 12, COPY),                                       # not whole int64s
           (pack([(0, 0, 65)], []), COPY),                           # more than the input holds
           (pack([(0, 1000, 64)], []), COPY),                        # past the slot
           (pack([], [(2, 0, 0, 8)]), COPY),                         # no rank 2
           (pack([], [(-2, 0, 0, 8)]), COPY),
           (pack([], [(1, 0, 60, 8)]), COPY),                        # past the output
           (pack([], [(-1, 0, 0, 8)]), sum32),                       # a reduction of one operand on 2 ranks
           (pack([], [(-1, 0, 0, 8), (1, 0, 8, 8)]), sum32),         # operands with different places
           (pack([], [(-1, 0, 0, 6), (1, 0, 0, 6)]), sum32),         # not whole float32s
           (pack([], [(-1, 0, 0, 8), (-1, 8, 0, 8)]), sum32),        # this rank's input twice
           (pack([], []), 99)]                                       # no such reduction
    for plan, code in bad:
        with pytest.raises(ValueError):
            core.round(1, x, out, plan, code, 0, 0, 0.0)
        with pytest.raises(ValueError):
            core.finish(1, x, out, plan, code)
    assert regions[0][:8].tobytes() == bytes(8), "a refused plan posted its round"
    # A good one: a copy of the input through this rank's slot, read back by a plan of rank 0's.
    assert core.round(1, x, out, pack([(0, 0, 64)], []), COPY, 7, 0, 0.0) == 2   # rank 1 has not posted
    core.finish(1, x, out, pack([], [(0, 0, 0, 64)]), COPY)
    assert (out == 1).all()


def test_repeated_calls_take_the_planned_round_from_the_memo(monkeypatch):
    # The memo's road (persistent.WindowCall) asks for the plan once and runs it straight away:
    # every call runs the compiled round, and only the ordinary road's two calls and the road's
    # building ask for a plan.
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    monkeypatch.setenv("RINGCOMM_ALGO", "broadcast=one_shot,all_gather=one_shot,all_to_all=one_shot,"
                                        "reduce_scatter=one_shot")
    from ringcomm.algorithms import _planned, base
    taken, asked = [], []
    run = _planned.run
    monkeypatch.setattr(_planned, "run", lambda window, *a: (taken.append(window.rank), run(window, *a)))
    planned = {cls: cls.planned for cls in _planned_algorithms(base.PlannedAlgorithm)}
    for cls, plan in planned.items():
        monkeypatch.setattr(cls, "planned", lambda self, window, *a, plan=plan: (asked.append(window.rank),
                                                                                  plan(self, window, *a))[1])

    def fn(comm):
        x, out, part = np.zeros(8, np.float32), np.zeros(24, np.float32), np.zeros(8, np.float32)
        blocks = np.zeros(24, np.float32)
        for step in range(4):
            x[...] = step + comm.rank
            comm.broadcast(x, root=2)
            assert (x == step + 2).all()
            comm.all_gather(out, x)
            comm.reduce_scatter(part, out)
            assert (part == 3 * x[0]).all()
            blocks[...] = np.repeat(np.arange(3, dtype=np.float32) + 10 * comm.rank + step, 8)
            comm.all_to_all(out, blocks)
            assert (out == np.repeat(np.arange(3, dtype=np.float32) * 10 + comm.rank + step, 8)).all()
    run_threads(3, fn)
    assert len(taken) == 3 * 4 * 4   # 3 ranks x 4 collectives x every call
    assert len(asked) == 3 * 4 * 3   # the first two calls, and the road built at the third


def _planned_algorithms(cls) -> list:
    found = [cls] if "planned" in vars(cls) else []
    for sub in cls.__subclasses__():
        found += _planned_algorithms(sub)
    return found


def test_the_direct_round_reads_and_stops_where_python_must_take_over():
    """The direct all-to-all's compiled call (core/_round.c, ``direct``) in one process, as rank 0
    of two, reading "rank 1" (this process too, by CMA) whose rounds the test posts by hand."""
    import os
    from ringcomm.algorithms._direct import CHECK, DONE, POSTED, READ
    cap = 1024
    regions = [np.zeros(64 + 2 * (64 + cap), np.uint8) for _ in range(2)]
    me = os.getpid()
    core = compiled.Core(0, cap, tuple(r.ctypes.data for r in regions), (me, me))
    words = [r.view(np.int64) for r in regions]

    def payload(rank, k):   # int64 index of round k's payload in a region (window.py's layout)
        return (64 + (k & 1) * (64 + cap) + 64) // 8

    def post(k, table, stamp=7, word=0, upto=None):   # "rank 1" posts round k (flag: upto)
        w, at = words[1], payload(1, k)
        w[at:at + len(table)] = table
        head = at - 8
        w[head], w[head + 1] = stamp, word
        w[0] = k if upto is None else upto

    theirs = np.arange(6, dtype=np.float32) * 10      # rank 1's x: its 2 elements for rank 0 start at 3
    peer_table = [theirs.ctypes.data, 3, 2, 0, 3]     # address, then (offset, count) per destination
    x = np.array([1, 2, 3, 4], np.float32)            # rank 0's: 1 element to itself, 3 to rank 1
    # plan: nt, nc, nr, item; table (offset, count per destination); own copy; one read from rank 1
    plan = np.array([4, 1, 1, 4, 0, 1, 1, 3, 0, 0, 4, 1, 1, 2, 4, 2], np.int64).tobytes()
    out = np.full(3, -1, np.float32)

    assert core.direct(1, x, out, plan, 7, 0, 0.0) == POSTED     # rank 1 has not posted
    assert words[0][0] == 1 and words[0][payload(0, 1):payload(0, 1) + 5].tolist() == [x.ctypes.data, 0, 1, 1, 3]
    assert out.tolist() == [1, -1, -1]                           # its own block, copied while it waited
    post(3, peer_table)
    assert core.direct(3, x, out, plan, 7, 0, 0.0) == READ       # read; rank 1 has not posted round 4
    assert out.tolist() == [1, 30, 40] and words[0][0] == 4
    post(5, peer_table, upto=6)
    words[1][payload(1, 6) - 8] = 7                              # round 6's stamp
    out[:] = -1
    assert core.direct(5, x, out, plan, 7, 0, 0.0) == DONE and out.tolist() == [1, 30, 40]
    post(7, [theirs.ctypes.data, 3, 5, 0, 3])                    # 5 elements for rank 0, which expects 2
    out[:] = -1
    assert core.direct(7, x, out, plan, 7, 0, 0.0) == CHECK and out.tolist() == [1, -1, -1]
    post(9, [8, 3, 2, 0, 3])                                     # an address nobody can read
    assert core.direct(9, x, out, plan, 7, 0, 0.0) == CHECK and out.tolist() == [1, -1, -1]
    post(11, peer_table, stamp=8)                                # rank 1 in another call
    assert core.direct(11, x, out, plan, 7, 0, 0.0) == POSTED and out.tolist() == [1, -1, -1]

    def bad(**change):
        v = dict(nt=4, nc=1, nr=1, item=4, table=[0, 1, 1, 3], copies=[0, 0, 4], reads=[1, 1, 2, 4, 2])
        v.update(change)
        return np.array([v["nt"], v["nc"], v["nr"], v["item"], *v["table"], *v["copies"], *v["reads"]],
                        np.int64).tobytes()
    for plan in (bad(nt=5), bad(nt=200, table=[0] * 200), bad(item=0), bad(copies=[0, 0, 17]),
                 bad(copies=[0, 9, 4]), bad(reads=[0, 1, 2, 4, 2]), bad(reads=[2, 1, 2, 4, 2]),
                 bad(reads=[1, 5, 2, 4, 2]), bad(reads=[1, 1, 2, 4, 3]), bad(reads=[1, 1, 2, -4, 2]), b"\0" * 12):
        with pytest.raises(ValueError, match="malformed plan"):
            core.direct(13, x, out, plan, 7, 0, 0.0)
    assert words[0][0] == 11, "a refused plan posted its round"
    with pytest.raises(RuntimeError, match="not read by CMA"):
        compiled.Core(0, cap, tuple(r.ctypes.data for r in regions)).direct(13, x, out, plan, 7, 0, 0.0)
    with pytest.raises(ValueError, match="pids"):
        compiled.Core(0, cap, tuple(r.ctypes.data for r in regions), (me,))


@pytest.mark.parametrize("detour", [False, True])
def test_the_direct_round_leaves_reads_at_a_slow_distance_to_python_with_detour(detour):
    """A Core told to take the detour (cma.PeerMemory: hosts whose kernel copies slowly between
    buffers a few bytes apart modulo a page) returns CHECK before reading anything when one of
    its reads lies at such a distance, so that the Python road makes them all through its
    buffer; reads at any other distance it makes itself, as a Core without the detour makes all."""
    import os
    from ringcomm.algorithms._direct import CHECK, DONE, POSTED
    from ringcomm.core import copying
    cap = 1024
    regions = [np.zeros(64 + 2 * (64 + cap), np.uint8) for _ in range(2)]
    me = os.getpid()
    core = compiled.Core(0, cap, tuple(r.ctypes.data for r in regions), (me, me), detour)
    words = [r.view(np.int64) for r in regions]
    n = 4096   # bytes per block: past the pieces (copying.PIECE) a slow distance matters from
    out = np.zeros(2 * n + 2 * copying.PAGE, np.uint8)
    dst = out[:2 * n]                                   # own block first, rank 1's at n
    x = np.full(2 * n, 1, np.uint8)
    store = np.zeros(4 * n + 2 * copying.PAGE, np.uint8)

    def rank1_x(distance):   # rank 1's x, its block for rank 0 first, `distance` bytes apart from dst[n:]
        start = (copying.array_address(dst[n:]) - distance - copying.array_address(store)) % copying.PAGE
        theirs = store[start:start + 2 * n]
        theirs[:n] = np.arange(n) % 251
        assert (copying.array_address(dst[n:]) - copying.array_address(theirs)) % copying.PAGE == distance
        return theirs

    # plan: nt, nc, nr, item; table (offset, count per destination); own copy; one read from rank 1
    plan = np.array([4, 1, 1, 1, 0, n, n, n, 0, 0, n, 1, 1, 2, n, n], np.int64).tobytes()
    for k, distance, slow in ((1, 16, True), (3, 0, False), (5, 256, False)):
        assert copying.slow_distance(16, 0) and not copying.slow_distance(256, 0)
        theirs = rank1_x(distance)
        at = (64 + (k & 1) * (64 + cap) + 64) // 8    # round k's payload in rank 1's region (window.py)
        words[1][at:at + 5] = [theirs.ctypes.data, 0, n, n, n]
        words[1][at - 8], words[1][at - 7] = 7, 0     # its stamp and word
        words[1][0] = k + 1                           # and round k + 1 posted as well
        at1 = (64 + ((k + 1) & 1) * (64 + cap) + 64) // 8
        words[1][at1 - 8], words[1][at1 - 7] = 7, 0
        dst[:] = 0
        status = core.direct(k, x, dst, plan, 7, 0, 0.0)
        if slow and detour:
            assert status == CHECK and not dst[n:].any(), "a read at a slow distance was made, not left"
        else:
            assert status == DONE and (dst[n:] == theirs[:n]).all()
        assert (dst[:n] == 1).all() and status != POSTED


def test_the_moves_round_reads_writes_and_leaves_to_python_what_it_must():
    """The direct gather/scatter/all-gather/broadcast compiled call (core/_round.c, ``moves``) in
    one process, as rank 0 of two, reaching "rank 1" (this process too, by CMA), whose rounds
    the test posts by hand: it posts the row it is given, copies, reads and writes at the
    addresses rank 1 posted, and returns CHECK, with nothing moved, where Python must move: rank
    1's buffer is a ringcomm.empty block (its inode word), a move at a slow distance (detour),
    a peer written to that gave up (its poison)."""
    import os
    from ringcomm.algorithms._direct import CHECK, DONE, POSTED, READ
    from ringcomm.transport.window import POISON
    cap = 1024
    regions = [np.zeros(64 + 2 * (64 + cap), np.uint8) for _ in range(2)]
    me = os.getpid()
    words = [r.view(np.int64) for r in regions]

    def at(k):   # int64 index of round k's payload in a region (window.py's layout)
        return (64 + (k & 1) * (64 + cap) + 64) // 8

    def post(k, row, stamp=7, upto=None):   # "rank 1" posts round k (flag: upto)
        w = words[1]
        w[at(k):at(k) + len(row)] = row
        w[at(k) - 8], w[at(k) - 7] = stamp, 0
        w[0] = k if upto is None else upto

    def plan(copies=(), reads=(), writes=(), block=2):
        flat = [len(copies), len(reads), len(writes), block]
        for e in (*copies, *reads, *writes):
            flat.extend(e)
        return np.array(flat, np.int64).tobytes()

    theirs = np.arange(8, dtype=np.uint8) + 100       # rank 1's buffer: read from, written to
    x = np.arange(8, dtype=np.uint8)                  # rank 0's
    out = np.zeros(8, np.uint8)
    row = np.array([x.ctypes.data, 0, 0, 0, 0], np.int64).tobytes()   # as Window.address_words posts
    moves = plan(copies=[(0, 0, 2)], reads=[(1, 2, 2, 3)], writes=[(1, 5, 5, 3)])
    core = compiled.Core(0, cap, tuple(r.ctypes.data for r in regions), (me, me))

    assert core.moves(1, x, out, row, moves, 7, 0, 0.0) == POSTED      # rank 1 has not posted
    assert words[0][0] == 1 and words[0][at(1):at(1) + 5].tolist() == [x.ctypes.data, 0, 0, 0, 0]
    assert out.tolist() == [0, 1, 0, 0, 0, 0, 0, 0]                    # its copy, made while it waited
    post(3, [theirs.ctypes.data, 0, 0, 0, 0])
    assert core.moves(3, x, out, row, moves, 7, 0, 0.0) == READ       # rank 1 has not posted round 4
    assert out.tolist() == [0, 1, 102, 103, 104, 0, 0, 0] and theirs.tolist()[5:] == [5, 6, 7]
    assert words[0][0] == 4
    theirs[5:] = 0
    post(5, [theirs.ctypes.data, 0, 0, 0, 0], upto=6)
    words[1][at(6) - 8] = 7
    assert core.moves(5, x, out, row, moves, 7, 0, 0.0) == DONE and theirs.tolist()[5:] == [5, 6, 7]

    theirs[5:] = 0
    out[:] = 0
    post(7, [theirs.ctypes.data, 9, 41, theirs.ctypes.data, 8])        # a ringcomm.empty block
    assert core.moves(7, x, out, row, moves, 7, 0, 0.0) == CHECK
    assert out.tolist() == [0, 1, 0, 0, 0, 0, 0, 0] and not theirs[5:].any()
    assert core.moves(9, x, out, row, plan(reads=[(1, 2, 2, 3)], block=-1), 7, 0, 0.0) == POSTED
    post(9, [theirs.ctypes.data, 9, 41, theirs.ctypes.data, 8])        # the same row, no block word
    assert core.moves(9, x, out, row, plan(reads=[(1, 2, 2, 3)], block=-1), 7, 0, 0.0) == READ
    post(11, [theirs.ctypes.data, 0, 0, 0, 0], upto=12)                # gave up after posting round 11
    words[1][at(12) - 8] = POISON
    assert core.moves(11, x, out, row, plan(writes=[(1, 5, 5, 3)]), 7, 0, 0.0) == CHECK and not theirs[5:].any()
    post(13, [theirs.ctypes.data, 0, 0, 0, 0], stamp=8)                # rank 1 in another call
    assert core.moves(13, x, out, row, moves, 7, 0, 0.0) == POSTED and not theirs[5:].any()

    # a detouring Core leaves a move at a slow distance, past the pieces (copying.PIECE), to Python
    from ringcomm.core import copying
    n = 4096
    far = np.zeros(n + 2 * copying.PAGE, np.uint8)
    big_out = np.zeros(n, np.uint8)
    start = (copying.array_address(big_out) - 16 - copying.array_address(far)) % copying.PAGE
    src1 = far[start:start + n]
    src1[:] = 9
    for detour, expected in ((True, CHECK), (False, READ)):
        core = compiled.Core(0, cap, tuple(r.ctypes.data for r in regions), (me, me), detour)
        words[0][0] = 14
        big_out[:] = 0
        post(15, [src1.ctypes.data, 0, 0, 0, 0])
        assert core.moves(15, x, big_out, row, plan(reads=[(1, 0, 0, n)]), 7, 0, 0.0) == expected
        assert (big_out == (9 if expected == READ else 0)).all()

    for bad in (plan(reads=[(0, 0, 0, 1)]), plan(reads=[(2, 0, 0, 1)]), plan(reads=[(1, 0, 6, 3)]),
                plan(writes=[(1, 6, 0, 3)]), plan(copies=[(0, 6, 3)]), plan(block=5), plan()[:-8], b"\0" * 12):
        with pytest.raises(ValueError, match="malformed plan"):
            core.moves(17, x, out, row, bad, 7, 0, 0.0)
    with pytest.raises(ValueError, match="malformed plan"):
        core.moves(17, x, out, row[:4], moves, 7, 0, 0.0)
    with pytest.raises(RuntimeError, match="not reached by CMA"):
        compiled.Core(0, cap, tuple(r.ctypes.data for r in regions)).moves(17, x, out, row, moves, 7, 0, 0.0)
