"""torch's own DDP comm hooks on "ringcomm" train like on gloo, within seconds, in one launch.

For each hook, torch's DistributedDataParallel trains the same float32 model twice per rank, once
over the ringcomm world group and once over a gloo group on the same store, step by step on
the same data; after every step the parameters must agree within the hook's tolerance (two
ranks: every sum is a + b, so the reductions themselves agree bit for bit; the tolerance is for
the hooks' own arithmetic) and be identical across ranks where the hook synchronises them.

PowerSGD runs its compression from step 2 on (start_powerSGD_iter=2); its callbacks wait on
further all-reduces, which must not deadlock the completion of later ones. gloo itself hangs
when that happens in more than one bucket at a time (its two worker threads block in the
callbacks), so the many-bucket PowerSGD run is ringcomm's alone and checked across ranks.

    mpirun -n 2 python torch_comm_hooks.py
"""
import copy
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import DDPCommHookType, register_ddp_comm_hook
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from ringcomm.integrations.torch_backend import init_process_group
from job_exit import exit_now

comm = init_process_group(timeout=30)
R, N = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
STEPS = 5
SECONDS = 30.0    # each hook's ringcomm run; it takes well under one on an idle machine


def python_hook(kind):
    def attach(model, group):
        register_ddp_comm_hook(kind, model, state=group)
    return attach


def builtin_hook(kind):
    def attach(model, group):
        model._register_builtin_comm_hook(kind)
    return attach


def bf16_compress(state, bucket):
    # torch's own hook, called under another name: DDP refuses to register one named
    # bf16_compress_hook unless CUDA + NCCL are present, though it runs on any backend.
    return default_hooks.bf16_compress_hook(state, bucket)


def plain_hook(hook):
    def attach(model, group):
        model.register_comm_hook(group, hook)
    return attach


def powersgd_hook(hook):
    def attach(model, group):
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   random_seed=11)
        model.register_comm_hook(state, hook)
    return attach


# name: (attach, tolerance on parameters vs gloo, parameters synchronised across ranks)
HOOKS = {
    "allreduce": (python_hook(DDPCommHookType.ALLREDUCE), 0.0, True),
    "fp16_compress": (python_hook(DDPCommHookType.FP16_COMPRESS), 1e-6, True),
    "bf16_compress": (plain_hook(bf16_compress), 1e-6, True),
    "builtin_allreduce": (builtin_hook(dist.BuiltinCommHookType.ALLREDUCE), 0.0, True),
    "builtin_fp16_compress": (builtin_hook(dist.BuiltinCommHookType.FP16_COMPRESS), 1e-6, True),
    "powersgd": (powersgd_hook(psgd.powerSGD_hook), 1e-5, True),
    "noop": (python_hook(DDPCommHookType.NOOP), 0.0, False),
}


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 4))


def same_across_ranks(model) -> bool:
    for p in model.parameters():
        mine = p.detach().clone()
        dist.broadcast(mine, 0)
        if not torch.equal(mine, p.detach()):
            return False
    return True


def train(name, attach, groups, bucket_cap_mb=25.0):
    """One DDP model per group, trained in lockstep; yields (step, {group: model}, ringcomm seconds)."""
    torch.manual_seed(0)
    base = net()
    models = {}
    for label, group in groups.items():
        model = nn.parallel.DistributedDataParallel(copy.deepcopy(base), process_group=group,
                                                    bucket_cap_mb=bucket_cap_mb)
        attach(model, group if group is not None else dist.group.WORLD)
        models[label] = model
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    g = torch.Generator().manual_seed(100 + R)
    ringcomm_s = 0.0
    for step in range(STEPS):
        x, y = torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)
        for label, model in models.items():
            t0 = time.monotonic()
            opts[label].zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opts[label].step()
            if label == "ringcomm":
                ringcomm_s += time.monotonic() - t0
        yield step, models, ringcomm_s


for name, (attach, tol, synced) in HOOKS.items():
    for step, models, took in train(name, attach, {"ringcomm": None, "gloo": gloo}):
        for (pn, p), q in zip(models["ringcomm"].module.named_parameters(), models["gloo"].module.parameters()):
            err = (p - q).abs().max().item()
            assert err <= tol, f"{name} step {step}: {pn} differs by {err:g} between ringcomm and gloo"
        assert not synced or same_across_ranks(models["ringcomm"]), f"{name} step {step}: ranks differ"
    assert took < SECONDS, f"{name}: {STEPS} steps on ringcomm took {took:.1f} s"
    print(f"check {name} ok ({took * 1000:.0f} ms for {STEPS} steps)", flush=True)

# Many buckets, so several PowerSGD callbacks wait on their next all-reduce at once.
for step, models, took in train("powersgd", HOOKS["powersgd"][0], {"ringcomm": None}, bucket_cap_mb=0.0005):
    assert same_across_ranks(models["ringcomm"]), f"powersgd, many buckets, step {step}: ranks differ"
assert took < SECONDS, f"powersgd, many buckets: {STEPS} steps took {took:.1f} s"
print(f"check powersgd_many_buckets ok ({took * 1000:.0f} ms)", flush=True)


def first_failure(label, group):
    """(step, error text) where batched PowerSGD first fails on ``group``; agrees with gloo before."""
    steps = train("batched_powersgd", powersgd_hook(psgd.batched_powerSGD_hook), {label: group})
    try:
        for step, models, took in steps:
            pass
    except AssertionError as err:
        return step + 1, "".join(traceback.format_exception(err)[-2:])
    return None, None


# torch 2.13's batched_powerSGD_hook hands _orthogonalize a 2-D matrix where it asserts 3-D, so it
# fails on every backend once compression starts (start_powerSGD_iter=2). ringcomm must fail the
# same way at the same step: the hook's arithmetic, not the communication.
ours, theirs = first_failure("ringcomm", None), first_failure("gloo", gloo)
assert ours == theirs and ours[0] == 2 and "_orthogonalize" in ours[1], (ours, theirs)
print("check batched_powersgd ok (fails in torch's _orthogonalize at step 2, as on gloo)", flush=True)

dist.barrier()   # batched PowerSGD fails before step 2 communicates: no rank leaves early
dist.destroy_process_group()
print(f"rank {R} done", flush=True)
exit_now()   # see job_exit.py: torch's gloo/TCPStore teardown is not what is tested
