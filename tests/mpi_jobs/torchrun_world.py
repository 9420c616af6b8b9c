"""Started by torchrun, not mpirun: a plain ``import ringcomm`` and
``dist.init_process_group("ringcomm")`` give every rank the whole world (never a world of one),
its peers on this node reached through shared memory bootstrapped in torchrun's store; three
times over, destroy_process_group between (the second init once read the first's handshakes).

    python -m torch.distributed.run --nproc_per_node=2 --master-port PORT torchrun_world.py
"""
import datetime

import torch
import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the backend
from ringcomm.integrations.torch_groups import world
from ringcomm.transport.factory import describe

for init in range(3):   # destroyed and made again: torch hands each init the same store
    dist.init_process_group("ringcomm", timeout=datetime.timedelta(seconds=30))
    t = torch.tensor([float(dist.get_rank() + 1 + init)])
    dist.all_reduce(t)
    comm = world().comm   # the Communicator under the default group
    print(f"init {init}: world size {dist.get_world_size()} on rank {dist.get_rank()}: sum {t.item()} over "
          f"{describe(comm.transport)}", flush=True)
    dist.destroy_process_group()
