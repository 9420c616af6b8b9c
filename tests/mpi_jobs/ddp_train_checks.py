"""ddp.DistributedDataParallel under mpirun, every check in one launch.

Each check trains a float64 model on N ranks for K steps and compares with one process that
trains a copy of rank 0's initial model on the concatenated batch (every rank builds the same
global data from a fixed seed, so each rank can run the reference itself). After every step the
parameters must be bitwise identical on all ranks. Prints "check NAME ok" per passed check.

    mpirun -n N python ddp_train_checks.py [backend]
"""
import copy
import json
import os
import sys

import torch
from torch import nn

import ddp
import ringcomm

torch.set_default_dtype(torch.float64)
BACKEND = sys.argv[1] if len(sys.argv) > 1 else "ringcomm"
comm = ringcomm.init(BACKEND)   # every backend ships with ringcomm: one that fails to start fails the test
R, N = comm.rank, comm.size
STEPS, PER_RANK = 4, 6


class Net(nn.Module):
    def __init__(self, unused: bool = False):
        super().__init__()
        self.embed = nn.Linear(10, 24)
        self.hidden = nn.Linear(24, 24)
        self.head = nn.Linear(24, 3)
        self.norm = nn.BatchNorm1d(24)       # a buffer that DDP broadcasts
        self.extra = nn.Linear(24, 3) if unused else None

    def forward(self, x, use_extra=False):
        h = torch.tanh(self.norm(self.embed(x)))
        h = torch.relu(self.hidden(h))
        out = self.head(h)
        return out + self.extra(h) if use_extra else out


def batches(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(N * PER_RANK, 10, generator=g), torch.randn(N * PER_RANK, 3, generator=g))
            for _ in range(STEPS)]


def shard(t):
    return t[R * PER_RANK:(R + 1) * PER_RANK]


def assert_same_on_all_ranks(model, what):
    # Parameters only: BatchNorm running stats are rank-local after forward (as in PyTorch DDP);
    # DDP re-broadcasts them from rank 0 at the start of the next forward.
    for name, p in model.named_parameters():
        mine = p.detach().clone()
        theirs = mine.clone()
        comm.broadcast(theirs, root=0)
        assert torch.equal(mine, theirs), f"{what}: {name} differs between rank 0 and rank {R}"


def fresh_model(seed_by_rank=False, unused=False):
    torch.manual_seed(100 + (R if seed_by_rank else 0))
    return Net(unused)


def reference(init, data, accumulate=1, use_extra=False):
    """One process, whole batch: what N ranks must reproduce."""
    model = copy.deepcopy(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(0, len(data), accumulate):
        opt.zero_grad()
        group = data[step:step + accumulate]
        for x, y in group:
            # BatchNorm normalises per rank-local batch in DDP; the reference does the same
            # (train mode statistics of each rank's shard) by running the shards separately.
            loss = sum(nn.functional.mse_loss(model(x[r * PER_RANK:(r + 1) * PER_RANK], use_extra),
                                              y[r * PER_RANK:(r + 1) * PER_RANK]) for r in range(N)) / N
            (loss / len(group)).backward()
        opt.step()
    return model


def train(name, *, seed_by_rank=False, hook=None, accumulate=1, tol=1e-10, use_extra=False,
          unused=False, **kwargs):
    net = fresh_model(seed_by_rank, unused)
    init0 = copy.deepcopy(net)
    for t in init0.state_dict().values():   # the reference starts from rank 0's parameters
        comm.broadcast(t, root=0)
    model = ddp.DistributedDataParallel(net, comm, **kwargs)
    if hook is not None:
        model.register_comm_hook(ddp.CommState(comm), hook)
    assert_same_on_all_ranks(net, f"{name} after construction")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches()
    for step in range(0, STEPS, accumulate):
        opt.zero_grad()
        for k in range(accumulate):
            x, y = data[step + k]
            sync = k == accumulate - 1
            ctx = model.no_sync() if not sync else _null()
            with ctx:
                loss = nn.functional.mse_loss(model(shard(x), use_extra), shard(y)) / accumulate
                loss.backward()
        opt.step()
        assert_same_on_all_ranks(net, f"{name} step {step}")
    ref = reference(init0, data, accumulate, use_extra)
    # BatchNorm running stats follow rank 0's shard (buffers are broadcast from rank 0 each forward)
    for (pname, p), q in zip(net.named_parameters(), ref.parameters()):
        err = (p - q).abs().max().item()
        assert err <= tol, f"{name}: {pname} off by {err:g} from single-process training"
    print(f"check {name} ok", flush=True)
    return model


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


train("default")
train("bucket_view", gradient_as_bucket_view=True, first_bucket_mb=0.001, bucket_cap_mb=0.004)
train("tiny_buckets", first_bucket_mb=1e-5, bucket_cap_mb=1e-5)
train("seeded_differently", seed_by_rank=True)
train("no_sync", accumulate=2)
train("no_sync_bucket_view", accumulate=2, gradient_as_bucket_view=True)
train("fp16_hook", hook=ddp.fp16_compress_hook, tol=2e-3)
train("bf16_hook", hook=ddp.bf16_compress_hook, tol=2e-2)
train("fp16_wrapper", hook=ddp.fp16_compress_wrapper(ddp.allreduce_hook), tol=2e-3)

# A sparse embedding: its gradient stays sparse rows, summed apart from the buckets (reducer.py),
# and training matches one process on the whole batch.
class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(20, 6, sparse=True), nn.Linear(6, 3)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


torch.manual_seed(7)
net = Lookup()
init0 = copy.deepcopy(net)
model = ddp.DistributedDataParallel(net, comm)
g = torch.Generator().manual_seed(3)
data = [(torch.randint(0, 20, (N * PER_RANK,), generator=g), torch.randn(N * PER_RANK, 3, generator=g))
        for _ in range(STEPS)]
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (ids, y) in enumerate(data):
    opt.zero_grad()
    nn.functional.mse_loss(model(shard(ids)), shard(y)).backward()
    assert net.emb.weight.grad.layout is torch.sparse_coo, net.emb.weight.grad.layout
    opt.step()
    assert_same_on_all_ranks(net, f"sparse_embedding step {step}")
ref = copy.deepcopy(init0)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for ids, y in data:
    ref_opt.zero_grad()
    (sum(nn.functional.mse_loss(ref(ids[r * PER_RANK:(r + 1) * PER_RANK]), y[r * PER_RANK:(r + 1) * PER_RANK])
         for r in range(N)) / N).backward()
    ref_opt.step()
for (pname, p), q in zip(net.named_parameters(), ref.parameters()):
    err = (p - q).abs().max().item()
    assert err <= 1e-10, f"sparse_embedding: {pname} off by {err:g} from single-process training"
print("check sparse_embedding ok", flush=True)

# find_unused_parameters=True: `extra` unused everywhere -> no hang, and its .grad stays None, as
# in torch's DDP (zeros once, which momentum and weight decay then moved: mpi_jobs/ddp_vs_torch.py).
m = train("unused_found", unused=True, find_unused_parameters=True, first_bucket_mb=1e-5)
assert m.module.extra.weight.grad is None, "a parameter no rank used got a .grad"
print("check unused_zero_grad ok", flush=True)

# find_unused_parameters=False: a clear error naming the parameter, then the comm still works.
m = ddp.DistributedDataParallel(fresh_model(unused=True), comm)
try:
    m(torch.randn(4, 10)).sum().backward()
except ringcomm.UsageError as err:
    assert "extra.weight" in str(err) and "find_unused_parameters=True" in str(err), err
else:
    raise AssertionError("an unused parameter without find_unused_parameters did not raise")
x = torch.ones(3)
comm.all_reduce(x)
assert (x == N).all(), "communicator unusable after the unused-parameter error"
print("check unused_error ok", flush=True)

# Bucket order rebuilt from observed ready order; identical on every rank.
m = ddp.DistributedDataParallel(fresh_model(), comm, first_bucket_mb=1e-5, bucket_cap_mb=1e-5)
for _ in range(2):
    m(torch.randn(4, 10)).sum().backward()
layout = torch.tensor([i for b in m.bucket_members() for i in b] + [len(b) for b in m.bucket_members()])
theirs = layout.clone()
comm.broadcast(theirs, root=0)
assert m.reducer.rebuilt and torch.equal(layout, theirs), "bucket layout differs across ranks"
print("check rebuild_agreed ok", flush=True)

# Timeline: each rank writes its own Chrome trace with forward, backward and bucket events.
path = os.environ.get("RINGCOMM_TIMELINE")
if path:
    written = m.write_timeline()
    events = json.load(open(written))["traceEvents"]
    names = {e["name"] for e in events}
    assert written.endswith(f".rank{R}.json"), written
    assert {"forward", "backward"} <= names, names
    assert any(n.startswith("all_reduce bucket") for n in names), names
    assert any(n.endswith("ready") for n in names) and any(n.endswith("launch") for n in names), names
    print("check timeline ok", flush=True)
print(f"rank {R} done", flush=True)
