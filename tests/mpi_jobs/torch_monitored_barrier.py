"""ProcessGroup.monitored_barrier on "ringcomm" groups, through torch.distributed, under mpirun.

Plain ``dist.init_process_group("ringcomm")`` (MPI's rendezvous). Each failing case runs on a
group of its own (a failed monitored barrier stays failed on its group); the world group's
collectives and barriers keep the ranks in step between cases. A case prints
"check <name> ok" on each rank where it held.

    mpirun -n 3 python torch_monitored_barrier.py
"""
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the backend
from job_exit import exit_now

dist.init_process_group("ringcomm", timeout=timedelta(seconds=20))
R, N = dist.get_rank(), dist.get_world_size()
world = dist.distributed_c10d._get_default_group()


def raises(call, *needles):
    """call() must raise a RuntimeError naming every needle; returns the seconds it took."""
    t0 = time.monotonic()
    try:
        call()
    except RuntimeError as err:
        text = str(err)
        missing = [n for n in needles if n not in text]
        assert not missing, f"rank {R}: error does not name {missing}: {text}"
        print(f"  rank {R} raised {type(err).__name__}: {text[:300]}", flush=True)
        return time.monotonic() - t0
    raise AssertionError(f"rank {R}: monitored_barrier returned normally")


def passes():
    for i in range(3):
        if R == i % N:
            time.sleep(0.3)   # each rank in turn comes last
        world.monitored_barrier(timedelta(seconds=10), wait_all_ranks=i == 2)
        t = torch.full((4,), float(R))
        dist.all_reduce(t)
        assert t.tolist() == [float(sum(range(N)))] * 4, t
    world.monitored_barrier()   # the group's timeout
    print("check passes ok", flush=True)


def subgroup_passes():
    members = [N - 2, N - 1]  # at 3 ranks, global ranks 1 and 2: group rank 0 is global rank 1
    sub = dist.new_group(ranks=members, backend="ringcomm")
    if R in members:
        sub.monitored_barrier(timedelta(seconds=10))
        sub.monitored_barrier(timedelta(seconds=10), wait_all_ranks=True)
    dist.barrier()
    print("check subgroup passes ok", flush=True)


def absent_rank_named():
    group = dist.new_group(backend="ringcomm")
    timeout = 1.0
    if R == 0:
        took = raises(lambda: group.monitored_barrier(timedelta(seconds=timeout)),
                      "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms")
        assert timeout * 0.9 < took < timeout + 3, took
    elif R != 1:          # rank 1 never calls
        took = raises(lambda: group.monitored_barrier(timedelta(seconds=timeout)),
                      f"Rank {R} successfully reached monitoredBarrier, but received errors while waiting for "
                      f"send/recv from rank 0", "rank 0 reports: [Rank 0]: Rank 1 failed to pass")
        assert took < timeout + 3, took
    dist.barrier()        # the world group is untouched
    print("check absent rank named ok", flush=True)


def wait_all_ranks():
    group = dist.new_group(backend="ringcomm")
    if R == 0:            # nobody else calls
        others = ", ".join(str(r) for r in range(1, N))
        took = raises(lambda: group.monitored_barrier(timedelta(seconds=0.5), wait_all_ranks=True),
                      f"[Rank 0]: Ranks {others} failed to pass monitoredBarrier in 500 ms")
        assert took < 3, took
    dist.barrier()
    print("check wait_all_ranks ok", flush=True)


def torch_refuses_by_name():
    """What still cannot work: torch's own dist.monitored_barrier checks the backend's name."""
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=5))
    except ValueError as err:
        assert "only implemented for GLOO" in str(err), err
    else:
        raise AssertionError("dist.monitored_barrier ran on ringcomm: update docs/ddp.md and this check")
    print("check dist.monitored_barrier refused ok", flush=True)


passes()
subgroup_passes()
absent_rank_named()
wait_all_ranks()
torch_refuses_by_name()
dist.destroy_process_group()
print(f"rank {R} done", flush=True)
exit_now()   # see job_exit.py: torch's gloo/TCPStore teardown is not what is tested
