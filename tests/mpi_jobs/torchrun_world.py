"""Started by torchrun, not mpirun: a plain ``import ringcomm`` and
``dist.init_process_group("ringcomm")`` give every rank the whole world (never a world of one),
its peers on this node reached through shared memory bootstrapped in torchrun's store.

    python -m torch.distributed.run --nproc_per_node=2 --master-port PORT torchrun_world.py
"""
import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the backend
from ringcomm.integrations.torch_groups import world
from ringcomm.transport.factory import describe

dist.init_process_group("ringcomm")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
comm = world().comm   # the Communicator under the default group
print(f"world size {dist.get_world_size()} on rank {dist.get_rank()}: sum {t.item()} over "
      f"{describe(comm.transport)}", flush=True)
dist.destroy_process_group()
