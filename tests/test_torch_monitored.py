"""ProcessGroup.monitored_barrier on "ringcomm": gloo's semantics (torch_monitored.py).

In-process cases call ``RingcommProcessGroup.monitored_barrier`` over thread ranks; the mpirun
job (tests/mpi_jobs/torch_monitored_barrier.py) calls it through torch.distributed's groups.
"""
import time
from datetime import timedelta

import pytest
import torch

from mpi_util import run_mpi
from ringcomm import ArgumentTypeError, CommTimeoutError, UsageError
from ringcomm.integrations import torch_monitored
from ringcomm.integrations.torch_backend import RingcommProcessGroup
from ringcomm.integrations.torch_groups import Shared
from ringcomm.integrations.torch_monitored import MonitoredBarrierError
from ringcomm.testing import run_threads

GROUP_TIMEOUT = 5.0


def group_of(comm, timeout=GROUP_TIMEOUT):
    return RingcommProcessGroup(Shared(comm, owned=False), comm.rank, comm.size, timeout, name="g")


def outcome(call):
    """("ok" | the error's type and message, seconds taken)."""
    t0 = time.monotonic()
    try:
        call()
        result = "ok"
    except MonitoredBarrierError as err:
        result = f"MonitoredBarrierError: {err}"
    return result, time.monotonic() - t0


@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_passes_and_the_groups_collectives_go_on(n):
    def body(comm):
        pg = group_of(comm)
        times = []
        for i in range(3):
            if comm.rank == i % n:
                time.sleep(0.2)       # each rank in turn comes last: the others wait for it
            t0 = time.monotonic()
            pg.monitored_barrier(timedelta(seconds=5), wait_all_ranks=i == 1)
            times.append(time.monotonic() - t0)
            t = torch.ones(3)
            pg.allreduce([t]).wait()
            assert t.tolist() == [float(n)] * 3
        pg.monitored_barrier()                         # the group's timeout
        return times
    results = run_threads(n, body, timeout=30)
    for i in range(3):
        late = i % n
        assert all(results[r][i] >= 0.15 for r in range(n) if r != late), (i, results)   # they waited


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_never_comes_is_named_by_rank_0_and_every_other_rank_raises(n):
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 1:
            time.sleep(1.5)    # past rank 0's deadline: arrives after it failed
        first = outcome(lambda: pg.monitored_barrier(timedelta(seconds=0.5)))
        again = outcome(lambda: pg.monitored_barrier(timedelta(seconds=0.5)))
        t = torch.ones(2)
        pg.allreduce([t]).wait()                     # the group itself still works, as on gloo
        return first, again, t.tolist()
    results = run_threads(n, body, timeout=30)
    (text0, took0), _, _ = results[0]
    assert text0.startswith("MonitoredBarrierError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 500 ms"), text0
    assert "monitored_barrier #0 of group 'g'" in text0 and 0.4 < took0 < 2.0, (text0, took0)
    for r in range(2, n):   # arrived in time: told at once, with rank 0's reason
        (text, took), _, _ = results[r]
        assert text.startswith(f"MonitoredBarrierError: Rank {r} successfully reached monitoredBarrier, but received "
                               f"errors while waiting for send/recv from rank 0"), text
        assert "rank 0 reports: [Rank 0]: Rank 1 failed to pass" in text and took < 2.0, (text, took)
    (text1, took1), _, _ = results[1]    # late: rank 0's abort notice tells it why, without waiting
    assert "Rank 1 successfully reached monitoredBarrier" in text1 and "Rank 1 failed to pass" in text1, text1
    assert took1 < 2.0, took1
    for r, (_, (again, took), reduced) in enumerate(results):
        assert "not run: an earlier monitored_barrier of this group failed" in again and took < 0.5, again
        assert reduced == [float(n)] * 2


def test_wait_all_ranks_names_every_rank_missing_at_the_deadline():
    def body(comm):
        pg = group_of(comm)
        if comm.rank in (1, 3):
            time.sleep(1.5)
            return None
        return outcome(lambda: pg.monitored_barrier(timedelta(seconds=0.5), wait_all_ranks=comm.rank == 0))
    results = run_threads(4, body, timeout=30)
    text0, took0 = results[0]
    # One deadline for all: 0.5 s in all, not 0.5 s per missing rank as on gloo.
    assert text0.startswith("MonitoredBarrierError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 500 ms"), \
        text0
    assert "ranks that arrived: 2" in text0 and took0 < 1.0, (text0, took0)
    text2, took2 = results[2]
    assert "Rank 2 successfully reached" in text2 and "Ranks 1, 3 failed to pass" in text2 and took2 < 1.0, text2


def test_without_wait_all_ranks_rank_0_names_the_first_missing_rank():
    def body(comm):
        pg = group_of(comm)
        if comm.rank in (2, 3):
            time.sleep(1.0)
            return None
        return outcome(lambda: pg.monitored_barrier(timedelta(seconds=0.3)))
    text0, _ = run_threads(4, body, timeout=30)[0]
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 300 ms" in text0, text0


def test_a_zero_timeout_gives_no_time_and_says_so_as_gloo_does():
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 0:
            return outcome(lambda: pg.monitored_barrier(timedelta(0)))
        time.sleep(0.5)
    text, took = run_threads(2, body, timeout=30)[0]
    assert "Rank 1 failed to pass monitoredBarrier in 0 ms" in text and took < 0.5, text
    assert "Rank 0 timed out in monitoredBarrier after 0 ms" in text, text   # the words of torch's own test


def test_without_rank_0_the_others_raise_after_the_groups_timeout_plus_grace(monkeypatch):
    monkeypatch.setattr(torch_monitored, "ABORT_GRACE", 0.5)
    def body(comm):
        pg = group_of(comm, timeout=1.0)
        if comm.rank == 0:
            time.sleep(2.5)
            return None
        return outcome(lambda: pg.monitored_barrier(timedelta(seconds=0.2)))
    for text, took in run_threads(3, body, timeout=30)[1:]:
        assert "no verdict from rank 0 within 1.5 s" in text and "rank 0 has not reached" in text, text
        assert 1.4 < took < 2.5, took


def test_the_error_is_a_ringcomm_timeout_and_a_runtime_error_as_on_gloo():
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 0:
            with pytest.raises(RuntimeError, match="Rank 1 failed to pass monitoredBarrier"):
                pg.monitored_barrier(0.1)
            with pytest.raises(CommTimeoutError):
                pg.monitored_barrier(0.1)
        else:
            time.sleep(0.5)
    run_threads(2, body, timeout=30)


def test_bad_arguments_raise_on_the_calling_rank_before_any_message():
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 0:   # the other rank never calls: a message would leave rank 0 waiting
            with pytest.raises(UsageError, match=r'monitored_barrier got unexpected value for argument "timeout" '
                                                 r'\(expected a finite timeout >= 0'):
                pg.monitored_barrier(timedelta(seconds=-1))
            with pytest.raises(ArgumentTypeError, match=r'argument "timeout" \(expected a datetime.timedelta'):
                pg.monitored_barrier("5s")
            with pytest.raises(ArgumentTypeError, match=r'argument "wait_all_ranks" \(expected a bool, got int\)'):
                pg.monitored_barrier(1.0, wait_all_ranks=1)
        return comm.rank
    assert run_threads(2, body, timeout=30) == [0, 1]


def test_one_rank_passes_at_once():
    def body(comm):
        group_of(comm).monitored_barrier(timedelta(0))
        return "passed"
    assert run_threads(1, body) == ["passed"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_monitored_barrier_through_torch_distributed_groups(n):
    proc = run_mpi(n, "torch_monitored_barrier.py", timeout=240)
    names = ["passes", "subgroup passes", "absent rank named", "wait_all_ranks", "dist.monitored_barrier refused"]
    for name in names:
        assert proc.stdout.count(f"check {name} ok") == n, \
            f"check {name} not passed on {n} ranks:\n{proc.stdout}\n{proc.stderr[-4000:]}"
