"""Persistent all_reduce (comm.all_reduce_init) and the implicit fast road of small in-place calls:
the same bits as the ordinary road, interchangeable across ranks, and every fault still caught."""
import numpy as np
import pytest
import torch

from ringcomm import CommTimeoutError, MismatchError, UsageError
from ringcomm.testing import run_threads


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("size", [2, 3, 5])
def test_persistent_and_fast_calls_give_the_ordinary_bits(kind, size):
    def body(comm):
        rng = np.random.default_rng(comm.rank)
        data = [rng.standard_normal(300).astype(np.float32) for _ in range(12)]
        mk = (lambda a: torch.from_numpy(a.copy())) if kind == "torch" else (lambda a: a.copy())
        x = mk(data[0])
        p = comm.all_reduce_init(x, op="sum")
        persistent, repeated, ordinary = [], [], []
        for d in data:   # the same buffer, refilled: p() and the implicit fast road of all_reduce(x)
            x[...] = mk(d)
            persistent.append(np.asarray(p()).copy())
            x[...] = mk(d)
            repeated.append(np.asarray(comm.all_reduce(x)).copy())
            ordinary.append(np.asarray(comm.all_reduce(mk(d), algorithm="one_shot")).copy())
        return persistent, repeated, ordinary
    results = run_threads(size, body)
    for r in range(size):
        for i in range(12):
            assert results[r][0][i].tobytes() == results[r][1][i].tobytes() == results[r][2][i].tobytes()
            assert results[r][0][i].tobytes() == results[0][0][i].tobytes()


def test_ranks_may_mix_persistent_fast_and_ordinary_calls():
    def body(comm):
        x = np.full(64, comm.rank + 1.0)
        p = comm.all_reduce_init(x)
        out = []
        for i in range(9):
            x[...] = comm.rank + 1.0
            road = (i + comm.rank) % 3
            if road == 0:
                out.append(p()[0])
            elif road == 1:
                out.append(comm.all_reduce(x)[0])          # fast road after the first time
            else:
                out.append(comm.all_reduce(x.copy())[0])   # a new array: the ordinary road
        return out
    for out in run_threads(3, body):
        assert out == [6.0] * 9


def test_start_and_wait_run_it_asynchronously():
    def body(comm):
        x = np.full(1000, float(comm.rank))
        p = comm.all_reduce_init(x, op="max")
        work = p.start()
        return work.wait(30)[0]
    assert run_threads(4, body) == [3.0] * 4


def test_a_buffer_that_changed_since_init_is_refused():
    def body(comm):
        t = torch.ones(16)
        p = comm.all_reduce_init(t)
        p()
        t.resize_(32)   # re-pointed storage: the validated memory is gone
        with pytest.raises(UsageError, match="changed since all_reduce_init"):
            p()
        return True
    assert run_threads(2, body) == [True, True]


def test_a_count_mismatch_on_the_fast_road_is_a_mismatch_on_every_rank():
    def body(comm):
        x = np.ones(256 + comm.rank * 512)   # equal mod 512: only the window stamp's exact count differs
        p = comm.all_reduce_init(x, algorithm="one_shot")
        return p()
    with pytest.raises(MismatchError, match="count"):
        run_threads(2, body, timeout=10)


def test_an_absent_peer_times_out_on_the_fast_road_naming_it():
    def body(comm):
        x = np.ones(8)
        p = comm.all_reduce_init(x, algorithm="one_shot")
        p()
        p()
        if comm.rank == 1:
            return None
        return p()
    with pytest.raises(CommTimeoutError, match=r"all_reduce #2 \(one_shot.*rank 1"):
        run_threads(2, body, timeout=1.0)
