"""Jobs that need more shared memory than a small /dev/shm has (Docker's default: 64 MiB).

    mpirun -n N python shm_small.py SCENARIO      (inside tests/shm_sandbox.py's tmpfs)

Before segments reserved their pages (posix_fallocate) each of these died of SIGBUS at the first
write to a page /dev/shm could not supply. Now each completes, or (control) every rank raises a
CommError that says how much was needed, how much is free and how to fix it. Prints "rank R ok
..." on success, "rank R CommError: ..." when init refused.

  allreduce16   4 ranks x 16 MiB all-reduce (below the CMA floor: through the staging pool)
  allreduce64   a 64 MiB all-reduce (run with RINGCOMM_SHM_CMA=0: the old staging grew to 64 MiB)
  allocate100   comm.transport.allocate(100 MiB) falls back to private memory on every rank
  ddp21m        ringcomm DDP on a 21M-parameter MLP (its buckets come from allocate)
  control       not even the control segments fit: CommError on every rank, naming the fix
"""
import sys
import zlib

import numpy as np
from mpi4py import MPI

import ringcomm

scenario = sys.argv[1]
world = MPI.COMM_WORLD
try:
    comm = ringcomm.init()
except ringcomm.CommError as err:
    print(f"rank {world.Get_rank()} CommError: {err}", flush=True)
    sys.exit(0)
rank, size = comm.rank, comm.size


def same_everywhere(data, what):
    crcs = world.allgather(zlib.crc32(np.ascontiguousarray(data).view(np.uint8)))
    assert len(set(crcs)) == 1, f"{what}: results differ across ranks: {crcs}"


if scenario in ("allreduce16", "allreduce64"):
    count = (16 if scenario == "allreduce16" else 64) << 18   # float32 elements
    x = np.full(count, rank + 1, np.float32)
    for _ in range(2):
        x[...] = rank + 1
        comm.all_reduce(x)
        assert np.all(x == size * (size + 1) / 2), x[:4]
    same_everywhere(x, scenario)
    detail = f"pool share {comm.transport.node.pool_share}"
elif scenario == "allocate100":
    buf = comm.transport.allocate(100 << 20, np.float32)
    shared = comm.transport.node.owns(buf)
    buf[...] = rank + 1
    comm.all_reduce(buf)
    assert np.all(buf == size * (size + 1) / 2), buf[:4]
    detail = f"shared={shared}"
elif scenario == "ddp21m":
    import torch
    from torch import nn

    import ddp
    torch.manual_seed(0)   # the same model everywhere (DDP broadcasts rank 0's anyway)
    net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
    params = sum(p.numel() for p in net.parameters())
    assert params > 21_000_000, params
    model = ddp.DistributedDataParallel(net, comm)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)   # different data per rank
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(8, 1024)).square().mean()
        loss.backward()   # .grad averaged over ranks on return
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    same_everywhere(flat, "ddp parameters")
    detail = f"{params} parameters"
else:
    raise SystemExit(f"unknown scenario {scenario}")
comm.barrier()
print(f"rank {rank} ok {scenario} {detail}", flush=True)
