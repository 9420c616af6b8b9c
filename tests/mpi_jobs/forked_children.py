"""Children forked from a rank (os.fork, torch DataLoader workers) beside a communicator.

A child shares its parent's shared memory, sockets and sequence numbers, but the peers pair
every call with the parent: two children's all_reduces once summed each other's data and put
the parents out of step. Here every call a child makes raises UsageError naming the fork (the
blocking call on a buffer seen before, a persistent call, send, recv, split, a sub-communicator,
torch.distributed on the "ringcomm" group), a child's close() lets go of nothing the parent
uses, and the parents go on to the right results; then torch's DDP trains over the group with a
DataLoader of two forked workers and ends bitwise equal on every rank.

    mpirun -n 2 python forked_children.py [backend]

Prints "check NAME ok" per check and "rank R done" on each rank.
"""
import os
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ringcomm.integrations.torch_backend import init_process_group
from job_exit import exit_now

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "ringcomm"
comm = init_process_group(BACKEND)
rank, size = comm.rank, comm.size
small = np.ones(4, np.float32)
for _ in range(3):   # remembered from the third call on: the blocking call's own road (persistent.py)
    comm.all_reduce(small)
plan = comm.all_reduce_init(small)
sub = comm.split(rank % 2)
tensor = torch.ones(3)
CALLS = {
    "all_reduce": lambda: comm.all_reduce(small),
    "persistent": plan,
    "persistent_start": lambda: plan.start().wait(),
    "send": lambda: comm.send(small, (rank + 1) % size),
    "recv": lambda: comm.recv(small, (rank - 1) % size, async_op=True),
    "split": lambda: comm.split(0),
    "sub_all_reduce": lambda: sub.all_reduce(small),
    "dist_all_reduce": lambda: dist.all_reduce(tensor),
}


def child() -> int:
    """What a forked child finds: every call refused before it moves a byte; 0 if so."""
    wrong = []
    for name, call in CALLS.items():
        try:
            call()
            wrong.append(f"{name} returned")
        except Exception as err:   # torch wraps the backend's error in its own
            if "is a fork of the one that created the communicator" not in str(err):
                wrong.append(f"{name}: {type(err).__name__}: {err}")
    comm.close()   # the child's copy only: the parent's peers still use what it shares
    sub.close()
    if wrong:
        print(f"rank {rank}'s child: {wrong}", flush=True)
    return 1 if wrong else 0


pid = os.fork()
if pid == 0:
    os._exit(child())
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, f"rank {rank}: the child saw a call go through"
for i in range(5):   # the parents, on every road the children tried
    x = np.full(1 << 18, rank + 1.0 + i, np.float32)
    comm.all_reduce(x)
    assert (x == size * (size + 1) / 2 + size * i).all(), (i, x[:3])
    small[:] = rank + 1
    plan()
    assert (small == size * (size + 1) / 2).all(), small
    part = np.full(5, 1.0)
    sub.all_reduce(part)
    assert (part == sub.size).all(), part
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    assert (t == size * (size - 1) / 2).all(), t
    mine, theirs = np.full(7, rank + i, np.int64), np.zeros(7, np.int64)
    work = comm.send(mine, (rank + 1) % size, async_op=True)
    comm.recv(theirs, (rank - 1) % size)
    work.wait()
    assert (theirs == (rank - 1) % size + i).all(), theirs
print(f"rank {rank} check children_refused ok", flush=True)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 * rank + i)
        return torch.randn(8, generator=g), torch.randn(2, generator=g)


torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=2,
                                     multiprocessing_context="fork", persistent_workers=False)
for epoch in range(2):   # the workers are forked anew each epoch
    for inputs, targets in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        opt.step()
crc = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
crcs = [None] * size
dist.all_gather_object(crcs, crc)
assert len(set(crcs)) == 1, f"replicas differ after training with forked DataLoader workers: {crcs}"
print(f"rank {rank} check dataloader_workers ok", flush=True)
sub.close()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
exit_now()
