"""One rank of a job started by hand (no mpirun, no torchrun), as torch's own harness starts
them: ``dist.init_process_group("ringcomm", init_method=URL, rank=R, world_size=N)``.

    python init_method.py URL RANK SIZE      (URL: env:// with MASTER_* set, tcp://..., file://...)
"""
import sys

import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the backend

url, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("ringcomm", init_method=url, rank=rank, world_size=size)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} via {url.split(':')[0]}: sum {t.item()}", flush=True)
dist.destroy_process_group()
