"""ringcomm under torch.compile: calls inside compiled functions, both DDPs compiled whole.

Each compiled result must equal, bit for bit, what the same code gives uncompiled (the "eager"
compiler backend runs the very same torch ops, so any difference is ringcomm's). Before ringcomm's
files were kept out of Dynamo's tracing (ringcomm/integrations/autoregister.py), the first
forced-ring all_reduce, ddp with a BatchNorm and torch's DDP on "ringcomm" each stopped with
Dynamo's errors.

    mpirun -n 2 python torch_compiled.py [dynamo-first]

``dynamo-first`` loads torch._dynamo before ringcomm (registered at import), otherwise it loads
at the first torch.compile (registered by the import hook).
"""
import logging
import sys

import torch

if "dynamo-first" in sys.argv:
    import torch._dynamo  # noqa: F401

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import ringcomm  # noqa: E402
from ddp import DistributedDataParallel  # noqa: E402
from job_exit import exit_now  # noqa: E402

assert ("torch._dynamo" in sys.modules) == ("dynamo-first" in sys.argv)
torch.set_num_threads(1)


class Traced(logging.Handler):
    """Every frame Dynamo starts tracing ("... start tracing NAME FILE:LINE"), from its log."""
    frames: list = []

    def emit(self, record):
        message = record.getMessage()
        if "start tracing" in message:
            self.frames.append(message.split("start tracing ", 1)[1])


torch._logging.set_logs(dynamo=logging.INFO)
logging.getLogger("torch._dynamo").addHandler(Traced())
comm = ringcomm.init_process_group()
R, N = comm.rank, comm.size
counters = None


def compiled(fn):
    return torch.compile(fn, backend="eager")


# ---- calls inside a compiled function ---------------------------------------------------------
def reduced(t, op, algorithm):
    t = t * 2
    comm.all_reduce(t, op=op, algorithm=algorithm)
    return t + 1


def gathered(t):
    out = torch.empty(t.numel() * N)
    comm.all_gather(out, t)
    comm.broadcast(t, N - 1)
    return out * 3 + t.sum()


def exchanged(t):
    out = torch.empty_like(t)
    work = comm.send(t * 2, (R + 1) % N, async_op=True)
    comm.recv(out, (R - 1) % N)
    work.wait()
    return out - 1


def through_dist(t):
    t = t * 2
    dist.all_reduce(t)
    return t + 1


for n in (10, 1000, 1 << 18):
    for op in ("sum", "max", "avg"):
        for algorithm in (None, "ring", "tree", "recursive_doubling"):
            x = torch.arange(n, dtype=torch.float32) * (R + 1) / 7
            want, got = reduced(x.clone(), op, algorithm), compiled(reduced)(x.clone(), op, algorithm)
            assert torch.equal(want, got), (n, op, algorithm, got[:4], want[:4])
    x = torch.arange(n, dtype=torch.float32) + R
    for fn in (gathered, exchanged, through_dist):
        assert torch.equal(fn(x.clone()), compiled(fn)(x.clone())), (fn.__name__, n)
print("check calls_in_compiled_functions ok", flush=True)


# ---- both DDPs, compiled whole ----------------------------------------------------------------
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def train(model, run, steps=5):
    """Each step's averaged gradients, a no_sync backward before the third."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for i in range(steps):
        g = torch.Generator().manual_seed(100 * i + R)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        if i == 2:
            with model.no_sync():
                nn.functional.cross_entropy(run(x), y).backward()
        nn.functional.cross_entropy(run(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        opt.step()
    return grads


for name, wrap in (("ringcomm ddp", lambda m: DistributedDataParallel(m, comm)),
                   ("torch ddp", nn.parallel.DistributedDataParallel)):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = wrap(net())
    model = wrap(net())
    want, got = train(eager, eager), train(model, compiled(model))
    for step, (w, g) in enumerate(zip(want, got)):
        assert torch.equal(w, g), (name, step, (w - g).abs().max())
        same = g.clone()
        comm.broadcast(same, 0)
        assert torch.equal(same, g), (name, step, "ranks differ")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= 1 or name == "torch ddp", (name, "the wrapped module was not compiled", dict(torch._dynamo.utils.counters))
    print(f"check {name.replace(' ', '_')}_compiled ok ({graphs} graphs)", flush=True)

# Of ringcomm and ddp, Dynamo traces ddp's forward and nothing else: the bookkeeping it calls
# (reducer, places) was traced frame by frame until ddp/untraced.py ran it with evaluation off.
ours = [f for f in Traced.frames if "/ringcomm/" in f or ("/ddp/" in f and "/ddp/distributed.py" not in f)]
assert not ours, ours
assert any("/ddp/distributed.py" in f for f in Traced.frames), Traced.frames
print("check only_the_forward_traced ok", flush=True)

dist.destroy_process_group()
print(f"rank {R} done", flush=True)
exit_now()
