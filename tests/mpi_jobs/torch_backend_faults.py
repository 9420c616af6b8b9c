"""Failures through torch.distributed on "ringcomm" raise, on every rank, with ringcomm's message.

Each case runs on a fresh world (init_process_group, 3 s timeout; destroy_process_group after),
because a failed collective leaves its communicator unusable by design. A case prints
"check <name> ok" on each rank where it held.

    mpirun -n 2 python torch_backend_faults.py
"""
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringcomm
from ringcomm.integrations.torch_backend import init_process_group
from ringcomm.integrations.torch_work import ABORT_GRACE
from job_exit import exit_now

TIMEOUT = 3.0


def expect_failure(run, *needles):
    """run() must raise; the message must name every needle. Returns (message, seconds)."""
    t0 = time.monotonic()
    try:
        run()
    except Exception as err:   # noqa: BLE001 - the type differs by path; the text must not
        text = f"{type(err).__name__}: {err}"
        missing = [n for n in needles if n not in text]
        assert not missing, f"error does not name {missing}: {text}"
        print(f"  rank {dist.get_rank() if dist.is_initialized() else '?'} raised {text.splitlines()[0]}",
              flush=True)
        return text, time.monotonic() - t0
    raise AssertionError("the call returned normally: the tensor would be reported as reduced")


def ways(t):
    """The three ways a caller learns how an all_reduce went."""
    return {
        "blocking": lambda: dist.all_reduce(t),
        "wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        "future": lambda: dist.all_reduce(t, async_op=True).get_future().wait(),
    }


def fresh_world():
    # The cases leave the ranks seconds apart (a rank sleeps past the timeout), and init is
    # bounded by the timeout too (bootstrap.py): the job meets outside ringcomm first.
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    comm = init_process_group(timeout=TIMEOUT)
    return comm, dist.get_rank(), dist.get_world_size()


def mismatch(way):
    comm, R, N = fresh_world()
    t = torch.ones(4 + 4 * R)                 # every rank a different count
    before = t.clone()
    text, _ = expect_failure(ways(t)[way], "all_reduce", "#")
    assert "Mismatch" in text or "abort" in text.lower(), text
    assert not torch.equal(t, before * N), "the tensor holds the reduced value after all"
    dist.destroy_process_group()
    print(f"check mismatch_{way} ok", flush=True)


def absent(way):
    """Rank 1 never calls; rank 0 times out naming it; rank 1's next collective raises too."""
    comm, R, N = fresh_world()
    t = torch.ones(16)
    if R == 0:
        text, took = expect_failure(ways(t)[way], "all_reduce", "#", "rank 1")
        assert took < 3 * TIMEOUT, f"took {took:.1f} s for a {TIMEOUT} s timeout"
        assert "Timeout" in text or "timeout" in text, text
        assert torch.equal(t, torch.ones(16)), "a rank that timed out changed its tensor"
    else:
        time.sleep(TIMEOUT + 2)
        expect_failure(lambda: dist.barrier(), "barrier")
    dist.destroy_process_group()
    print(f"check absent_{way} ok", flush=True)


def group_timeout():
    """A group's own (shorter) timeout fires, naming it; the communicator is aborted."""
    comm, R, N = fresh_world()
    quick = dist.new_group(backend="ringcomm", timeout=timedelta(seconds=1))
    t = torch.ones(8)
    if R == 0:
        # The message proves which deadline fired (ringcomm's own would say "after 3 s"); the
        # time allows for the abort's grace, in which ringcomm may add its own diagnosis.
        text, took = expect_failure(lambda: dist.all_reduce(t, group=quick), "timeout of 1 s", "all_reduce")
        assert took < 1 + ABORT_GRACE + 1, f"the group's 1 s timeout fired after {took:.1f} s"
    else:
        time.sleep(TIMEOUT)
        expect_failure(lambda: dist.barrier(), "barrier")
    dist.destroy_process_group()
    print("check group_timeout ok", flush=True)


def wait_timeout():
    """work.wait(timeout) raises when the peer is late; the work goes on and completes."""
    comm, R, N = fresh_world()
    t = torch.ones(8)
    if R == 1:
        time.sleep(1.0)
    work = dist.all_reduce(t, async_op=True)
    if R == 0:
        expect_failure(lambda: work.wait(timeout=timedelta(seconds=0.2)), "all_reduce", "0.2")
    work.wait()
    assert torch.equal(t, torch.full((8,), float(N))), t
    dist.destroy_process_group()
    print("check wait_timeout ok", flush=True)


def lifecycle():
    """set_timeout reaches comm.timeout; shutdown closes a communicator init_process_group made;
    abort aborts it and later calls raise."""
    comm, R, N = fresh_world()
    group = dist.distributed_c10d._get_default_group()
    group.set_timeout(timedelta(seconds=7))
    assert comm.timeout == 7.0, comm.timeout
    closed = []
    real_close = comm.close
    comm.close = lambda: (closed.append(True), real_close())
    dist.destroy_process_group()
    assert closed, "destroy_process_group did not close the communicator"

    mine = ringcomm.init(timeout=TIMEOUT)
    init_process_group(comm=mine)
    dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()
    mine.all_reduce(torch.ones(2))   # a communicator the caller passed in stays open

    comm, R, N = fresh_world()
    aborted = []
    real_abort = comm.abort
    comm.abort = lambda reason: (aborted.append(reason), real_abort(reason))
    dist.distributed_c10d._abort_process_group()
    assert aborted and "abort" in aborted[0], aborted
    expect_failure(lambda: comm.all_reduce(torch.ones(2)), "all_reduce")
    print("check lifecycle ok", flush=True)


for way in ("blocking", "wait", "future"):
    mismatch(way)
for way in ("blocking", "wait", "future"):
    absent(way)
group_timeout()
wait_timeout()
lifecycle()
print(f"rank {ringcomm.init(timeout=TIMEOUT).rank} done", flush=True)
exit_now()   # see job_exit.py: torch's gloo/TCPStore teardown is not what is tested
