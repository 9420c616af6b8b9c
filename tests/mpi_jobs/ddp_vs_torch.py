"""ddp.DistributedDataParallel against torch's DistributedDataParallel over gloo, in one job: the
same model, data and optimizer (SGD with momentum and weight decay, which move any parameter
whose .grad is not None), and the cases where they once parted. After each case the parameters,
buffers and .grad (None included) must equal torch's, and the parameters must be bitwise equal
across ranks. Prints "check NAME ok" per case on rank 0.

    mpirun -n 2 python ddp_vs_torch.py
"""
import copy

import torch
import torch.distributed as dist
from torch import nn

import ddp
import ringcomm

torch.set_default_dtype(torch.float64)
comm = ringcomm.init()
dist.init_process_group("gloo")
R, N = comm.rank, comm.size


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x, use_c=False):
        h = torch.tanh(self.norm(self.a(x)))
        return self.b(h) + (self.c(h) if use_c else 0)


class Rechecked(Net):
    """``a`` again inside a reentrant checkpoint: two gradients per backward (static_graph's case)."""

    def forward(self, x, use_c=False):
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(lambda t: torch.tanh(self.a(t)), torch.tanh(self.norm(self.a(x))), use_reentrant=True)
        return self.b(h) + (self.c(h) if use_c else 0)


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + R)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def step_fn(model, opt, step, plan):
    """plan(step) -> list of (use_c, synchronised) micro-batches."""
    opt.zero_grad(set_to_none=False)
    dtype = next(model.parameters()).dtype
    for micro, (use_c, synced) in enumerate(plan(step)):
        x, y = (t.to(dtype) for t in batch(step, micro))
        if synced:
            nn.functional.mse_loss(model(x, use_c=use_c), y).backward()
        else:
            with model.no_sync():
                nn.functional.mse_loss(model(x, use_c=use_c), y).backward()
    opt.step()


def same(a, b) -> bool:
    return a is None and b is None or a is not None and b is not None and torch.allclose(a, b, rtol=0, atol=1e-12)


def compare(name, plan, steps=4, convert=None, net=Net, **kwargs):
    torch.manual_seed(7)
    base = net()
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    if convert is not None:   # torch's DDP, the reference, wraps the model already converted
        convert(theirs)
    wrapped = [ddp.DistributedDataParallel(ours, comm, **kwargs),
               nn.parallel.DistributedDataParallel(theirs, **kwargs)]
    if convert is not None:
        convert(wrapped[0])
    opts = [torch.optim.SGD(w.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01) for w in wrapped]
    for step in range(steps):
        for w, o in zip(wrapped, opts):
            step_fn(w, o, step, plan)
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert p.dtype == q.dtype and same(p, q), (name, R, n, p, q)
        assert same(p.grad, q.grad), (name, R, n, p.grad, q.grad)
        every = torch.empty(N * p.numel(), dtype=p.dtype)
        comm.all_gather(every, p.detach().reshape(-1).contiguous())
        assert all(torch.equal(every[:p.numel()], every[r * p.numel():(r + 1) * p.numel()]) for r in range(N)), (name, n)
    for (n, p), (_, q) in zip(ours.named_buffers(), theirs.named_buffers()):
        assert same(p.double(), q.double()), (name, R, n, p, q)
    if R == 0:
        print(f"check {name} ok", flush=True)


# A parameter no rank ever uses keeps .grad None (it became zeros, which weight decay then moved).
compare("never_used", lambda s: [(False, True)], find_unused_parameters=True)
# Used on some steps only: the steps without it leave its .grad as it was.
compare("used_some_steps", lambda s: [(s % 2 == 0, True)], find_unused_parameters=True)
# Used on one rank only, every step.
compare("used_on_one_rank", lambda s: [(R == 0, True)], find_unused_parameters=True)
# Used under no_sync, unused in the synchronised micro-batch: the accumulation is averaged (it
# was replaced by the other ranks' average of zeros and theirs).
compare("no_sync_then_unused", lambda s: [(True, False), (False, True)], find_unused_parameters=True)
compare("no_sync_then_unused_views", lambda s: [(True, False), (False, True)], find_unused_parameters=True,
        gradient_as_bucket_view=True)
# BatchNorm's running stats after a no_sync forward are not re-broadcast (torch's rule).
compare("buffers_after_no_sync", lambda s: [(True, False), (True, True)])
# A bucket per parameter.
compare("bucket_cap_0", lambda s: [(True, True)], bucket_cap_mb=0)
compare("static_graph", lambda s: [(True, True)], static_graph=True)
# A parameter given two gradients per backward by a reentrant checkpoint, and with it one never used.
compare("static_graph_reentrant", lambda s: [(True, True)], net=Rechecked, static_graph=True)
compare("static_graph_reentrant_unused", lambda s: [(False, True)], net=Rechecked, static_graph=True,
        find_unused_parameters=True)
# Converted after wrapping: float64 gradients once went through float32 buckets.
torch.set_default_dtype(torch.float32)
compare("double_after_wrap", lambda s: [(True, True)], convert=lambda w: w.double())
torch.set_default_dtype(torch.float64)

# A comm hook whose future gives something other than the reduced bucket is refused.
model = ddp.DistributedDataParallel(Net(), comm)


def scalar_hook(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(torch.ones(1))
    return fut


model.register_comm_hook(None, scalar_hook)
x, y = batch(0)
try:
    nn.functional.mse_loss(model(x, use_c=True), y).backward()
    raise AssertionError("a one-element hook result was broadcast into the gradients")
except ringcomm.UsageError as err:
    assert "scalar_hook" in str(err) and "1 elements" in str(err), err
if R == 0:
    print("check hook_result ok", flush=True)

# Ranks that wrap different models of the same total size raise on every rank, naming the entry.
odd = nn.Linear(4, 6) if R == 0 else nn.Sequential(nn.Linear(6, 4))
try:
    ddp.DistributedDataParallel(odd, comm)
    raise AssertionError("different models taken as replicas")
except ringcomm.UsageError as err:
    assert "different models" in str(err), err
    assert R == 0 or "entry 0 here is 'parameter 0.weight" in str(err), err
comm.barrier()
if R == 0:
    print("check different_models ok", flush=True)
dist.destroy_process_group()
