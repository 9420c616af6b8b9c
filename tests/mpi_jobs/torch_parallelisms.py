"""torch's own parallelism libraries trained over the "ringcomm" process group, each against the
same model trained in one process on the whole batch (float64, so that only the order of
summation may differ).

    mpirun -n 2 python torch_parallelisms.py     FSDP2 (an uneven shard), pipelining (2 stages)
    mpirun -n 4 python torch_parallelisms.py     FSDP2 x tensor parallel on a 2-D DeviceMesh,
                                                 pipelining (4 stages: two in the middle)

These are what a torch user runs on a process group, and each drives it its own way: FSDP2
all-gathers and reduce-scatters padded shards, tensor parallelism all-reduces inside forward
and backward on one dimension of the mesh while FSDP2 works on the other, pipelining sends
activations and gradients with batch_isend_irecv. Prints "check NAME ok" per check on every
rank; a mismatch prints "check NAME FAILED" and the job exits non-zero.
"""
import copy
import gc
import sys
import threading
import warnings
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

import ringcomm  # noqa: F401  - registers the torch.distributed backend "ringcomm"

warnings.filterwarnings("ignore")   # DTensor's advice on redistribution order, torch deprecations
torch.set_default_dtype(torch.float64)
dist.init_process_group("ringcomm", timeout=timedelta(seconds=60))
RANK, SIZE = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "ringcomm", dist.get_backend()
TOLERANCE = 1e-12
failed = []


def report(name: str, worst: float, same_on_every_rank: Optional[bool] = None) -> None:
    """``same_on_every_rank``: None where the ranks hold different parts (pipeline stages)."""
    ok = worst <= TOLERANCE and same_on_every_rank is not False
    if not ok:
        failed.append(name)
    replicas = "" if same_on_every_rank is None else f", same on every rank: {same_on_every_rank}"
    print(f"check {name} {'ok' if ok else 'FAILED'} (largest difference {worst:.3g}{replicas})", flush=True)


def batch(step: int, rows: int, width: int, out: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, width, generator=g), torch.randn(rows, out, generator=g)


def identical_everywhere(tensors: dict) -> bool:
    """Whether every rank holds the same bits (the full tensors, gathered)."""
    flat = torch.cat([t.reshape(-1) for t in tensors.values()])
    every = [torch.empty_like(flat) for _ in range(SIZE)]
    dist.all_gather(every, flat)
    return all(torch.equal(every[0], e) for e in every)


def train_sharded(name: str, model: nn.Module, reference: nn.Module, dp_rank: int, dp_size: int,
                  width: int, out: int) -> None:
    """Three SGD steps: the sharded model on this rank's rows of the batch, the reference on all."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, reference)]
    rows = 4 * dp_size
    for step in range(3):
        x, y = batch(step, rows, width, out)
        mine = slice(4 * dp_rank, 4 * dp_rank + 4)
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        nn.functional.mse_loss(reference(x), y).backward()
        for o in opts:
            o.step()
            o.zero_grad()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    worst = max((full[k] - v).abs().max().item() for k, v in reference.state_dict().items())
    report(name, worst, identical_everywhere(full))


class Mlp(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 24, out: int = 7):
        super().__init__()
        self.up, self.down, self.head = nn.Linear(width, hidden), nn.Linear(hidden, width), nn.Linear(width, out)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def fsdp() -> None:
    """Every layer its own FSDP2 unit; the head's 7 rows shard unevenly over 2 ranks."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Mlp()
    reference = copy.deepcopy(model)
    for layer in (model.up, model.down, model.head):
        fully_shard(layer)
    fully_shard(model)
    train_sharded("fsdp2", model, reference, RANK, SIZE, 16, 7)


def fsdp_by_tensor_parallel() -> None:
    """FSDP2 over the mesh's "dp" dimension, up/down split column- and row-wise over "tp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (2, SIZE // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Mlp()
    reference = copy.deepcopy(model)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    train_sharded("fsdp2 x tensor parallel", model, reference, mesh["dp"].get_local_rank(), 2, 16, 7)


def pipelining() -> None:
    """One stage of two layers per rank, 4 micro-batches, under GPipe and 1F1B; the gradients
    must be the whole model's (torch divides each micro-batch's loss by their number)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(2 * SIZE)]
    whole = nn.Sequential(*copy.deepcopy(layers))
    mine = nn.Sequential(*layers[2 * RANK:2 * RANK + 2])
    stage = PipelineStage(mine, RANK, SIZE, torch.device("cpu"))
    loss = nn.functional.mse_loss
    micro = 4
    for schedule in (ScheduleGPipe, Schedule1F1B):
        x, y = batch(7, 16, 8, 8)
        for p in list(mine.parameters()) + list(whole.parameters()):
            p.grad = None
        run = schedule(stage, n_microbatches=micro, loss_fn=loss)
        if RANK == 0:
            run.step(x)
        elif RANK == SIZE - 1:
            run.step(target=y)
        else:
            run.step()
        for part_x, part_y in zip(x.chunk(micro), y.chunk(micro)):
            (loss(whole(part_x), part_y) / micro).backward()
        expected = list(whole[2 * RANK:2 * RANK + 2].parameters())
        worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(mine.parameters(), expected))
        report(f"pipelining {schedule.__name__}", worst)


if SIZE == 2:
    fsdp()
if SIZE == 4:
    fsdp_by_tensor_parallel()
pipelining()
dist.barrier()
# FSDP2's modules and the pipeline's stage sit in reference cycles that hold the process group
# and its tensors: collected now, while the interpreter is whole, not during its exit.
gc.collect()
dist.destroy_process_group()
gc.collect()
# The group's own threads end before destroy_process_group returns (integrations/torch_engine.py,
# Engine.close): one ending during the interpreter's exit is what aborts a process there.
left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
if left:
    failed.append("threads")
    print(f"check no threads after destroy_process_group FAILED: {left}", flush=True)
print(f"rank {RANK} done, {len(failed)} failed", flush=True)
sys.exit(1 if failed else 0)
