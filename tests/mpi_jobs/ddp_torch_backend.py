"""torch.distributed over the "ringcomm" backend, every check in one launch.

The dist collectives are checked against closed-form results; torch's own
DistributedDataParallel over the ringcomm group is checked against torch's DDP over gloo (a
gloo sub-group built on the same store), float64, step by step.

    mpirun -n N python ddp_torch_backend.py [backend]
"""
import copy
import sys

import torch
import torch.distributed as dist
from torch import nn

from ringcomm.integrations.torch_backend import init_process_group
from job_exit import exit_now

torch.set_default_dtype(torch.float64)
BACKEND = sys.argv[1] if len(sys.argv) > 1 else "ringcomm"
comm = init_process_group(BACKEND)   # every backend ships with ringcomm: one that fails to start fails the test
R, N = dist.get_rank(), dist.get_world_size()
assert (R, N) == (comm.rank, comm.size)
assert dist.get_backend() == "ringcomm", dist.get_backend()
print("check backend_name ok", flush=True)

t = torch.full((5,), float(R + 1))
dist.all_reduce(t)
assert (t == N * (N + 1) / 2).all(), t
t = torch.full((3,), float(R + 1))
dist.all_reduce(t, op=dist.ReduceOp.MAX)
assert (t == N).all(), t
t = torch.full((5,), float(R)).to(torch.bfloat16)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
assert (t.double() == (N - 1) / 2).all(), t
t = torch.full((4,), float(R))
dist.broadcast(t, src=N - 1)
assert (t == N - 1).all(), t
flags = torch.tensor([R == 0, True])
dist.broadcast(flags, src=0)
assert flags.tolist() == [True, True], flags
outs = [torch.empty(3, dtype=torch.int64) for _ in range(N)]
dist.all_gather(outs, torch.full((3,), R, dtype=torch.int64))
assert [o.tolist() for o in outs] == [[r] * 3 for r in range(N)], outs
out = torch.empty(2 * N)
dist.all_gather_into_tensor(out, torch.full((2,), float(R)))
assert out.tolist() == [float(r) for r in range(N) for _ in range(2)], out
out = torch.empty(2)
dist.reduce_scatter_tensor(out, torch.arange(2.0 * N))
assert out.tolist() == [N * 2.0 * R, N * (2.0 * R + 1)], out
out = torch.empty(2)
dist.reduce_scatter(out, [torch.full((2,), float(r)) for r in range(N)])
assert (out == N * R).all(), out
strided = torch.arange(12.0).reshape(3, 4).t()          # non-contiguous: staged and written back
dist.all_reduce(strided)
assert torch.equal(strided, N * torch.arange(12.0).reshape(3, 4).t()), strided
works = [dist.all_reduce(torch.full((1000,), 1.0), async_op=True) for _ in range(4)]
for w in works:
    w.wait()
assert works[-1].get_future().value()[0].sum().item() == 1000.0 * N
dist.barrier()
again = dist.new_group(backend="ringcomm")     # all ranks: shares the world communicator
t = torch.full((2,), float(R))
dist.all_reduce(t, group=again)
assert (t == N * (N - 1) / 2).all() and dist.get_backend(again) == "ringcomm", t
print("check collectives ok", flush=True)

gloo = dist.new_group(backend="gloo")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.tanh(self.a(x)))))


torch.manual_seed(R)        # different on each rank: DDP's construction broadcast must fix it
base = Net()
models = {}
for name, group in (("ringcomm", None), ("gloo", gloo)):
    net = copy.deepcopy(base)
    models[name] = (net, nn.parallel.DistributedDataParallel(net, process_group=group, bucket_cap_mb=0.01))
opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, (_, m) in models.items()}
g = torch.Generator().manual_seed(7 + R)
for step in range(4):
    x, y = torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)
    for name, (_, m) in models.items():
        opts[name].zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opts[name].step()
    for (pn, p), q in zip(models["ringcomm"][0].named_parameters(), models["gloo"][0].parameters()):
        err = (p - q).abs().max().item()
        assert err <= 1e-12, f"step {step}: {pn} differs by {err:g} between ringcomm and gloo DDP"
        mine = p.detach().clone()
        dist.broadcast(mine, 0)
        assert torch.equal(mine, p), f"step {step}: {pn} differs across ranks"
print("check torch_ddp_matches_gloo ok", flush=True)
dist.destroy_process_group()
print(f"rank {R} done", flush=True)
exit_now()   # every check above has passed; see job_exit.py for why teardown is skipped
