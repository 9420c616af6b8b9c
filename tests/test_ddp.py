"""DDP bucketing, ordering, hooks and errors with in-process ranks (ringcomm.testing.run_threads)."""
import contextlib
import copy
import dataclasses
import io
import json
import re
import threading

import pytest
import torch
from torch import nn

import ddp
import ringcomm
from ddp.reducer import MiB, assign_buckets
from ringcomm.testing import run_threads

KiB = 1 << 10


def _params(*specs):
    return [torch.zeros(n, dtype=dtype, device=device) for n, dtype, device in specs]


# ---- bucket assignment (pure) -------------------------------------------------------------------
def test_buckets_reverse_order_first_small():
    params = _params(*[(256, torch.float32, "cpu")] * 8)    # 1 KiB each
    order = list(reversed(range(8)))
    buckets = assign_buckets(params, order, cap_bytes=3 * KiB, first_cap_bytes=1 * KiB)
    assert buckets == [[7], [6, 5, 4], [3, 2, 1], [0]]


def test_buckets_never_mix_dtypes():
    params = _params((256, torch.float32, "cpu"), (256, torch.float64, "cpu"), (256, torch.float32, "cpu"),
                     (256, torch.float64, "cpu"))
    buckets = assign_buckets(params, [3, 2, 1, 0], cap_bytes=MiB, first_cap_bytes=MiB)
    assert buckets == [[3, 1], [2, 0]]
    for b in buckets:
        assert len({params[i].dtype for i in b}) == 1


def test_buckets_follow_given_order():
    params = _params(*[(256, torch.float32, "cpu")] * 4)
    assert assign_buckets(params, [1, 3, 0, 2], cap_bytes=2 * KiB, first_cap_bytes=2 * KiB) == [[1, 3], [0, 2]]


def _bucket_layout(comm, **kw):
    model = ddp.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8)), comm, **kw)
    flats = [b.flat for b in model.reducer.buckets]
    return model.bucket_members(), [f.numel() for f in flats], [f.is_contiguous() for f in flats]


def test_each_bucket_one_contiguous_buffer():
    members, sizes, contiguous = run_threads(1, lambda c: _bucket_layout(c, first_bucket_mb=1e-5, bucket_cap_mb=2 / 1024))[0]
    assert members == [[3], [2], [1, 0]]          # the 32-byte bias alone (first cap 10 B), a 2 KiB weight fills a 2 KiB cap, the rest
    assert sizes == [8, 512, 64 + 64 * 64] and all(contiguous)


# ---- argument checks ---------------------------------------------------------------------------
def test_bad_arguments_raise_before_communication():
    def body(comm):
        with pytest.raises(ringcomm.ArgumentTypeError, match='"module"'):
            ddp.DistributedDataParallel("not a module", comm)
        with pytest.raises(ringcomm.UsageError, match='"bucket_cap_mb"'):
            ddp.DistributedDataParallel(nn.Linear(2, 2), comm, bucket_cap_mb=-1)
        model = ddp.DistributedDataParallel(nn.Linear(2, 2), comm)
        with pytest.raises(ringcomm.ArgumentTypeError, match='"hook"'):
            model.register_comm_hook(None, "allreduce")
        model.register_comm_hook(None, lambda state, bucket: "not a future")
        with pytest.raises(ringcomm.UsageError, match="future-like"):
            model(torch.ones(1, 2)).sum().backward()
        model.register_comm_hook(None, ddp.allreduce_hook)     # recovers: the next step works
        model.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        return model.module.weight.grad.tolist()
    assert run_threads(1, body) == [[[1.0, 1.0], [1.0, 1.0]]]


# ---- behaviour across ranks ----------------------------------------------------------------------
class Swapped(nn.Module):
    """Rank-dependent layer order: gradients become ready in a different order on each rank."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        layers = (self.a, self.b, self.c) if self.rank % 2 == 0 else (self.c, self.b, self.a)
        for layer in layers:
            x = torch.tanh(layer(x))
        return x


def _local_grads(model, x):
    model.zero_grad()
    model(x).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_grad_ready_order_differs_across_ranks():
    """Tiny buckets + different ready orders: launches stay matched, results are the true average."""
    world = 3

    def body(comm):
        net = Swapped(comm.rank).double()
        model = ddp.DistributedDataParallel(net, comm, first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        plain = Swapped(comm.rank).double()
        plain.load_state_dict(net.state_dict())      # rank 0's parameters, after the broadcast
        out = []
        for step in range(3):
            x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(step * 10 + comm.rank))
            model.zero_grad()
            model(x).sum().backward()
            out.append(([p.grad.clone() for p in net.parameters()], _local_grads(plain, x)))
        return out, model.bucket_members(), model.reducer.rebuilt

    results = run_threads(world, body)
    assert all(r[2] for r in results)
    assert all(r[1] == results[0][1] for r in results), "bucket layouts differ across ranks"
    for step in range(3):
        local = [r[0][step][1] for r in results]
        expected = [sum(g[i] for g in local) / world for i in range(len(local[0]))]
        for r in results:
            for got, want in zip(r[0][step][0], expected):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_buckets_launch_while_backward_runs():
    """The first bucket goes out before earlier layers' gradients exist: communication overlaps."""
    def body(comm):
        net = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)])
        model = ddp.DistributedDataParallel(net, comm, first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        seen = []

        def hook(state, bucket):
            seen.append(sum(p.grad is None for p in net.parameters()))
            return ddp.allreduce_hook(state, bucket)
        model.register_comm_hook(ddp.CommState(comm), hook)
        model(torch.randn(2, 32)).sum().backward()
        return seen
    seen = run_threads(2, body)[0]
    assert seen[0] == 11 and seen[-1] == 0, seen       # 12 parameters, launched one by one


def test_unused_parameter_on_one_rank_only_counts_as_zero():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.main, self.side = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x, use_side):
            return self.main(x) + (self.side(x) if use_side else 0)

    def body(comm):
        torch.manual_seed(0)
        net = Branchy().double()
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=True)
        x = torch.ones(2, 4, dtype=torch.float64)
        model(x, comm.rank == 0).sum().backward()
        return net.side.weight.grad.clone(), net.side.bias.grad.clone()

    (w0, b0), (w1, b1) = run_threads(2, body)
    torch.testing.assert_close(w0, torch.full((4, 4), 1.0, dtype=torch.float64))   # (2 + 0) / 2
    torch.testing.assert_close(b0, torch.full((4,), 1.0, dtype=torch.float64))
    assert torch.equal(w0, w1) and torch.equal(b0, b1)


def test_unused_parameter_without_find_unused_names_it():
    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.idle = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    def body(comm):
        model = ddp.DistributedDataParallel(Partial(), comm)
        with pytest.raises(ringcomm.UsageError, match=r"idle\.weight, idle\.bias"):
            model(torch.ones(1, 3)).sum().backward()
        x = torch.ones(2)
        comm.all_reduce(x)                 # launched buckets drained: the communicator still works
        return x.tolist()
    assert run_threads(2, body) == [[2.0, 2.0]] * 2


def test_unused_parameter_on_one_rank_without_find_unused_does_not_hang():
    """Rank 1 alone misses a gradient: it raises naming it; rank 0 finishes; both stay in step."""
    class Maybe(nn.Module):
        def __init__(self):
            super().__init__()
            self.main, self.side = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x, use_side):
            return self.main(x) + (self.side(x) if use_side else 0)

    def body(comm):
        model = ddp.DistributedDataParallel(Maybe(), comm, first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        outcome = "ok"
        try:
            model(torch.ones(1, 3), comm.rank == 0).sum().backward()
        except ringcomm.UsageError as err:
            outcome = str(err)
        x = torch.ones(2)
        comm.all_reduce(x)
        return outcome, x.tolist()
    (out0, x0), (out1, x1) = run_threads(2, body, timeout=20)
    assert out0 == "ok" and "side.weight, side.bias" in out1, (out0, out1)
    assert x0 == x1 == [2.0, 2.0]


@pytest.mark.parametrize("as_view", [False, True])
def test_a_second_backward_through_one_forward_is_reduced_too(as_view):
    """loss.backward(retain_graph=True) then loss.backward(): torch's DDP leaves the second
    backward's gradients unreduced, and each replica kept its own (they drifted apart)."""
    x = [torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(2, 4) * (r + 1) for r in range(2)]

    def body(comm):
        torch.manual_seed(0)
        net = nn.Linear(4, 3).double()
        model = ddp.DistributedDataParallel(net, comm, gradient_as_bucket_view=as_view)
        loss = model(x[comm.rank]).pow(2).sum()
        loss.backward(retain_graph=True)
        once = net.weight.grad.clone()
        loss.backward(retain_graph=True)
        twice = net.weight.grad.clone()
        with model.no_sync():   # asked for: this one stays local
            loss.backward()
        result = once, twice, net.weight.grad.clone(), {k: v.clone() for k, v in net.state_dict().items()}
        model(x[comm.rank]).sum().backward()   # the buckets' rebuild saw each parameter once
        return result

    (once0, twice0, grad0, state), (once1, twice1, grad1, _) = run_threads(2, body)
    net = nn.Linear(4, 3).double()
    net.load_state_dict(state)
    local = []
    for xr in x:
        net.zero_grad()
        net(xr).pow(2).sum().backward()
        local.append(net.weight.grad.clone())
    average = (local[0] + local[1]) / 2
    assert torch.equal(once0, once1) and torch.equal(twice0, twice1)
    torch.testing.assert_close(once0, average)
    torch.testing.assert_close(twice0, 2 * average)
    torch.testing.assert_close(grad0, 2 * average + local[0])
    torch.testing.assert_close(grad1, 2 * average + local[1])


def test_a_backward_that_gives_no_parameter_a_gradient_says_why():
    def body(comm):
        model = ddp.DistributedDataParallel(nn.Linear(3, 2), comm)
        x = torch.ones(1, 3, requires_grad=True)
        with pytest.raises(ringcomm.UsageError, match=r"torch\.autograd\.grad.*ddp_model\.module"):
            torch.autograd.grad(model(x).sum(), x)
        torch.autograd.grad(model.module(x).sum(), x)   # the advice works: nothing to reduce
        model(x).sum().backward()
        return model.module.weight.grad.sum().item()
    assert run_threads(2, body) == [6.0, 6.0]   # d sum(Wx + b) / dW = x, ones, on both ranks


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")   # the check runs on its output's gradient
def test_after_an_exception_in_backward_the_model_says_how_to_go_on_and_a_new_wrap_does():
    """A backward that raised midway (a hook's NaN check, an out-of-memory retry) never reaches
    its end, where the reducer finishes; the next forward said only that the previous backward
    had not finished."""
    def body(comm):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)).double()
        model = ddp.DistributedDataParallel(net, comm, first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        x = torch.ones(4, 8, dtype=torch.float64) * (comm.rank + 1)

        def check(module, grad_in, grad_out):
            raise FloatingPointError("NaN in the first layer's gradient")
        handle = net[0].register_full_backward_hook(check)
        with pytest.raises(FloatingPointError):
            model(x).sum().backward()
        handle.remove()
        with pytest.raises(ringcomm.UsageError, match=r"\(4 of 6 buckets launched\).*wrap the module again"):
            model(x)
        net.zero_grad()
        model = ddp.DistributedDataParallel(net, comm, first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        model(x).sum().backward()
        return [p.grad.clone() for p in net.parameters()], {k: v.clone() for k, v in net.state_dict().items()}

    (grads0, state), (grads1, _) = run_threads(2, body)
    net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)).double()
    net.load_state_dict(state)
    for r in range(2):
        net(torch.ones(4, 8, dtype=torch.float64) * (r + 1)).sum().backward()
    for mine, theirs, total in zip(grads0, grads1, [p.grad for p in net.parameters()]):
        assert torch.equal(mine, theirs)
        torch.testing.assert_close(mine, total / 2)


@dataclasses.dataclass
class _Output:
    logits: torch.Tensor
    label: str = "a dataclass, as many libraries' model outputs are"


class _Holder:
    def __init__(self, logits):
        self.logits = logits


@pytest.mark.parametrize("find_unused", [False, True])
@pytest.mark.parametrize("kind", ["dataclass", "object"])
def test_outputs_in_a_dataclass_or_an_object_of_ones_own_are_reduced(kind, find_unused):
    """The reducer armed only for outputs it found in tensors, lists, tuples and dicts: a model
    returning a dataclass trained each replica on its own gradients ([16, 32] below)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.idle = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            y = self.used(x)
            return _Output(y) if kind == "dataclass" else _Holder(y)

    def body(comm):
        model = ddp.DistributedDataParallel(Net(), comm, find_unused_parameters=find_unused)
        model(torch.ones(2, 4) * (comm.rank + 1)).logits.sum().backward()
        return model.module.used.weight.grad.sum().item(), model.module.idle.weight.grad

    if not find_unused:   # the unused layer is still reported, as with a tensor output
        with pytest.raises(ringcomm.UsageError, match=r"idle\.weight, idle\.bias"):
            run_threads(2, body)
        return
    assert run_threads(2, body) == [(24.0, None), (24.0, None)]   # (2 * 8 + 4 * 8) / 2; idle untouched


def test_parameters_unfrozen_after_wrapping_are_refused_and_a_new_wrap_reduces_them():
    """Gradual unfreezing: a layer frozen when wrapped has no bucket; once unfrozen its gradients
    stayed each rank's own (-0.07 and -0.14 in one weight's sum), as under torch's DDP."""
    def body(comm):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).double()
        net[0].requires_grad_(False)
        model = ddp.DistributedDataParallel(net, comm)
        x = torch.ones(2, 4, dtype=torch.float64) * (comm.rank + 1)
        model(x).sum().backward()
        net[0].requires_grad_(True)
        for sync in (True, False):
            with pytest.raises(ringcomm.UsageError, match=r"0\.weight, 0\.bias did not require grad.*wrap"):
                if sync:
                    model(x)
                else:
                    with model.no_sync():
                        model(x)
        with torch.no_grad():
            model(x)   # no gradient, nothing to refuse
        model = ddp.DistributedDataParallel(net, comm)
        net.zero_grad()
        model(x).sum().backward()
        return net[0].weight.grad.clone()

    grad0, grad1 = run_threads(2, body)
    assert torch.equal(grad0, grad1)


def test_a_model_on_the_meta_device_is_refused_by_name_before_any_message():
    """Before, torch's "Cannot copy out of meta tensor; no data!" came from the broadcast, after
    the model check had gone round the ranks."""
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the communicator was used ({name}) before the model was checked")
    net = nn.Sequential(nn.Linear(2, 2, device="meta"), nn.BatchNorm1d(2, device="meta"))
    with pytest.raises(ringcomm.UsageError, match=r"0\.weight, 0\.bias, 1\.weight, 1\.bias, 1\.running_mean, "
                                                  r".* on the meta device"):
        ddp.DistributedDataParallel(net, Untouchable())


def test_pickling_or_deep_copying_the_wrapper_says_what_to_save_instead():
    def body(comm):
        model = ddp.DistributedDataParallel(nn.Linear(3, 2), comm)
        for attempt in (lambda: copy.deepcopy(model), lambda: torch.save(model, io.BytesIO())):
            with pytest.raises(TypeError, match=r"cannot be pickled or deep-copied.*model\.module"):
                attempt()
        ema = copy.deepcopy(model.module)   # what the message offers works
        torch.save(model.state_dict(), io.BytesIO())
        return sorted(ema.state_dict()) == ["bias", "weight"]
    assert run_threads(2, body) == [True, True]


def test_gradient_as_bucket_view_shares_storage():
    def body(comm):
        net = nn.Linear(5, 3)
        model = ddp.DistributedDataParallel(net, comm, gradient_as_bucket_view=True)
        for _ in range(2):
            model.zero_grad()
            model(torch.randn(2, 5)).sum().backward()
        flat = model.reducer.buckets[0].flat
        lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
        return all(lo <= p.grad.data_ptr() < hi for p in net.parameters())
    assert all(run_threads(2, body))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("as_view", [False, True])
def test_default_hook_divides_on_the_way_back_bitwise_as_avg(dtype, as_view):
    """The default hook's division, done while the gradients are copied back (the reducer runs
    allreduce_sum_for_avg), gives the very bits of an all-reduce with op avg: compared with the
    same hook wrapped so the reducer cannot recognise it, 3 ranks (n = 3 divides inexactly), with
    .grad set to None between steps and kept."""
    def averaged(state, bucket):
        return ddp.allreduce_hook(state, bucket)

    def body(comm):
        grads = {}
        for hook in (None, averaged):
            net = nn.Sequential(nn.Linear(7, 13), nn.Linear(13, 5)).to(dtype)
            with torch.no_grad():   # the same start for both models (the ranks' threads share torch's RNG)
                for i, p in enumerate(net.parameters()):
                    p.copy_(torch.randn(p.shape, dtype=dtype, generator=torch.Generator().manual_seed(i)))
            model = ddp.DistributedDataParallel(net, comm, first_bucket_mb=1e-5, bucket_cap_mb=1e-3,
                                                gradient_as_bucket_view=as_view)
            if hook is not None:
                model.register_comm_hook(ddp.CommState(comm), hook)
            seen = []
            for step in range(3):
                model.zero_grad(set_to_none=step != 2)
                x = torch.randn(4, 7, dtype=dtype, generator=torch.Generator().manual_seed(step * 10 + comm.rank))
                model(x).square().sum().backward()
                seen += [p.grad.clone() for p in net.parameters()]
            grads[hook is None] = seen
            fused = [d is not None for d in model.reducer._divisors]
            assert fused and all(fused) == (hook is None), fused
        return grads
    for grads in run_threads(3, body):
        for fused, plain in zip(grads[True], grads[False]):
            assert fused.numpy().tobytes() == plain.numpy().tobytes()


class _ComplexLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, dtype=torch.complex64))
        self.out = nn.Linear(3, 2)

    def forward(self, x):
        return self.out((x.to(torch.complex64) @ self.w).abs())


@pytest.mark.parametrize("hook", ["default", "fp16_compress_hook", "bf16_compress_wrapper(allreduce_hook)"])
def test_complex_parameters_are_averaged_as_real_and_imaginary_parts(hook):
    """As torch.distributed.all_reduce takes complex tensors: the bucket of a complex parameter was
    refused by all_reduce in the middle of backward, and a compressing hook's cast dropped the
    imaginary parts."""
    xs = [torch.randn(5, 4, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def body(comm):
        net = _ComplexLayer()
        model = ddp.DistributedDataParallel(net, comm)
        start = copy.deepcopy(net)   # rank 0's parameters, broadcast by the wrap
        if hook == "fp16_compress_hook":
            model.register_comm_hook(None, ddp.comm_hooks.fp16_compress_hook)
        elif hook != "default":
            model.register_comm_hook(None, ddp.comm_hooks.bf16_compress_wrapper(ddp.comm_hooks.allreduce_hook))
        model(xs[comm.rank]).square().sum().backward()
        return start, [p.grad.clone() for p in net.parameters()]

    (start, grads0), (_, grads1) = run_threads(2, body)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    alone = []
    for x in xs:
        net = copy.deepcopy(start)
        net(x).square().sum().backward()
        alone.append([p.grad for p in net.parameters()])
    want = [(a + b) / 2 for a, b in zip(*alone)]
    tol = {"default": 1e-6, "fp16_compress_hook": 2e-3, "bf16_compress_wrapper(allreduce_hook)": 2e-2}[hook]
    for got, w in zip(grads0, want):
        assert torch.allclose(got, w, rtol=tol, atol=tol * w.abs().max().item())
    assert grads0[0].imag.abs().max() > 0.1   # the imaginary parts came through


def test_torch_future_hook_is_accepted():
    """A hook may return any future-like object, e.g. an already completed torch Future."""
    def local_sum_hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result([bucket.buffer().mul_(10)])
        return fut

    def body(comm):
        net = nn.Linear(2, 1, bias=False)
        model = ddp.DistributedDataParallel(net, comm)
        model.register_comm_hook(None, local_sum_hook)
        model(torch.ones(1, 2)).sum().backward()
        return net.weight.grad.tolist()
    assert run_threads(1, body) == [[[10.0, 10.0]]]


def test_timeline_written_per_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGCOMM_TIMELINE", str(tmp_path / "t.json"))

    def body(comm):
        model = ddp.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), comm,
                                            first_bucket_mb=1e-6, bucket_cap_mb=1e-6)
        model(torch.randn(3, 8)).sum().backward()
        return model.write_timeline()
    paths = run_threads(2, body)
    assert paths == [str(tmp_path / f"t.rank{r}.json") for r in range(2)]
    events = json.load(open(paths[1]))["traceEvents"]
    names = [e["name"] for e in events]
    assert "forward" in names and "backward" in names
    for b in range(4):
        assert f"bucket {b} ready" in names and f"bucket {b} launch" in names
        assert f"all_reduce bucket {b}" in names


def test_cuda_module():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (torch.cuda.is_available() is False)")

    def body(comm):
        torch.manual_seed(comm.rank)
        net = nn.Linear(16, 4).cuda()
        model = ddp.DistributedDataParallel(net, comm, gradient_as_bucket_view=True)
        x = torch.full((2, 16), float(comm.rank + 1), device="cuda")
        model(x).sum().backward()
        return net.weight.grad.cpu(), net.weight.detach().cpu()
    (g0, w0), (g1, w1) = run_threads(2, body)
    assert torch.equal(w0, w1) and torch.equal(g0, g1)
    torch.testing.assert_close(g0, torch.full((4, 16), 3.0))     # mean over ranks of 2 * (r + 1)


class _Lookup(nn.Module):
    """A sparse embedding (sparse row gradients) feeding a dense layer."""

    def __init__(self, sparse=True):
        super().__init__()
        self.emb, self.head = nn.Embedding(12, 3, sparse=sparse), nn.Linear(3, 1)

    def forward(self, ids, use_emb=True):
        return self.head(self.emb(ids) if use_emb else torch.zeros(len(ids), 3)).sum()


def _fixed(net: nn.Module) -> nn.Module:
    """The same weights on every thread rank (torch's seed is one per process: threads that build
    modules at once interleave their draws)."""
    with torch.no_grad():
        for k, p in enumerate(net.parameters()):
            p.copy_(torch.linspace(-1, 1 + k, p.numel(), dtype=p.dtype).view_as(p))
    return net


def _ids(rank: int, step: int = 0) -> torch.Tensor:
    return torch.tensor([rank, rank + 1, 7, (3 * rank + step) % 12])


def test_sparse_embedding_gradients_are_averaged_as_sparse_rows_on_every_rank():
    """Like torch's DDP: the embedding's gradient stays sparse, and equals the mean of every rank's
    local gradient (computed here on each rank from every rank's ids), the same bits everywhere;
    SparseAdam then keeps the replicas identical."""
    world = 3

    def body(comm):
        net, reference = _fixed(_Lookup().double()), _fixed(_Lookup().double())
        model = ddp.DistributedDataParallel(net, comm)
        assert sorted(model.bucket_members()[0]) == [1, 2]   # the head's weight and bias; the embedding in none
        model(_ids(comm.rank)).backward()
        grad = net.emb.weight.grad
        local = []
        for r in range(world):
            reference.zero_grad()
            reference(_ids(r)).backward()
            local.append(reference.emb.weight.grad.to_dense())
        expected = sum(local) / world
        sparse_adam = torch.optim.SparseAdam([net.emb.weight], lr=0.1)
        for step in range(1, 4):
            sparse_adam.step()
            sparse_adam.zero_grad()
            model(_ids(comm.rank, step)).backward()
        return grad.layout, grad.to_dense(), expected, net.emb.weight.detach().clone(), net.head.weight.grad.clone()

    results = run_threads(world, body)
    for layout, grad, expected, _, _ in results:
        assert layout is torch.sparse_coo
        torch.testing.assert_close(grad, expected)
    first = results[0]
    for other in results[1:]:
        assert torch.equal(other[1], first[1]) and torch.equal(other[3], first[3]) and torch.equal(other[4], first[4])


def test_sparse_embedding_of_a_batch_that_repeats_one_token():
    """One rank's batch is one token repeated: its gradient's indices coalesce into a single entry
    whose strides torch leaves at (2, 1), which a flat byte view once refused on that rank."""
    def body(comm):
        net = _fixed(_Lookup().double())
        model = ddp.DistributedDataParallel(net, comm)
        ids = torch.tensor([5, 5, 5]) if comm.rank else _ids(0)
        model(ids).backward()
        return net.emb.weight.grad.to_dense()
    g0, g1 = run_threads(2, body, timeout=20)
    assert torch.equal(g0, g1) and g0[5].abs().sum() > 0 and g0[7].abs().sum() > 0


def test_sparse_embedding_unused_on_one_rank():
    """With find_unused_parameters, a rank that did not use the embedding adds no rows and still
    gets the average; without it, that rank raises naming the embedding and the other finishes."""
    def body(comm, find_unused):
        net = _fixed(_Lookup())
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=find_unused)
        outcome = "ok"
        try:
            model(_ids(comm.rank), use_emb=comm.rank == 0).backward()
        except ringcomm.UsageError as err:
            outcome = str(err)
        x = torch.ones(2)
        comm.all_reduce(x)   # every rank took part in every sum: still in step
        grad = net.emb.weight.grad
        return outcome, None if grad is None else grad.to_dense(), x.tolist()

    (out0, g0, x0), (out1, g1, x1) = run_threads(2, lambda comm: body(comm, True))
    assert out0 == out1 == "ok" and torch.equal(g0, g1) and x0 == x1 == [2.0, 2.0]
    assert sorted(torch.nonzero(g0.abs().sum(1)).flatten().tolist()) == [0, 1, 7]   # rank 0's rows only
    (out0, g0, x0), (out1, _, x1) = run_threads(2, lambda comm: body(comm, False), timeout=20)
    assert out0 == "ok" and "emb.weight" in out1 and x0 == x1 == [2.0, 2.0], (out0, out1)


def test_sparse_embedding_gradients_accumulate_under_no_sync():
    def body(comm):
        net = _fixed(_Lookup().double())
        model = ddp.DistributedDataParallel(net, comm)
        with model.no_sync():
            model(_ids(comm.rank, 1)).backward()
        model(_ids(comm.rank, 2)).backward()
        return net.emb.weight.grad.to_dense()

    def one_step(comm):   # the same two batches as one backward
        net = _fixed(_Lookup().double())
        model = ddp.DistributedDataParallel(net, comm)
        (model(_ids(comm.rank, 1)) + net(_ids(comm.rank, 2))).backward()
        return net.emb.weight.grad.to_dense()

    for accumulated, together in zip(run_threads(2, body), run_threads(2, one_step)):
        torch.testing.assert_close(accumulated, together)


def test_a_sparse_gradient_outside_an_embedding_is_refused_by_name():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.ones(5, 2))

        def forward(self, ids):
            return nn.functional.embedding(ids, self.table, sparse=True).sum()

    def body(comm):
        model = ddp.DistributedDataParallel(Functional(), comm)
        with pytest.raises(ringcomm.UsageError, match=r"parameter table got a torch\.sparse_coo gradient"):
            model(torch.tensor([1, 2])).backward()
        return True
    assert run_threads(1, body) == [True]


def test_an_unwritable_timeline_path_is_refused_at_construction(monkeypatch):
    """It once failed only at exit, in a traceback, with the trace lost and exit code 0."""
    monkeypatch.setenv("RINGCOMM_TIMELINE", "/proc/no-such-dir/trace.json")

    def body(comm):
        with pytest.raises(ringcomm.UsageError, match="RINGCOMM_TIMELINE"):
            ddp.DistributedDataParallel(nn.Linear(2, 2), comm)
    run_threads(1, body)




def test_a_bucket_watcher_holds_nothing_of_a_bucket_while_it_waits():
    """At exit the collector frees a DDP model still alive and so wakes its bucket watcher (a
    daemon thread) while the interpreter finalizes. The watcher then freed the last bucket's
    future, and with it a tensor, died inside torch's C++ and aborted the process ("terminate
    called without an active exception", about one run in ten of examples/compare_backends.py
    on gloo). Between items it now holds nothing a bucket owns."""
    import gc
    import queue
    import threading
    import weakref

    from ddp import reducer

    class Future:
        def wait_comm(self):
            pass

    q, finish_t = queue.Queue(), {}
    watcher = threading.Thread(target=reducer._watch, args=(q, finish_t), daemon=True)
    watcher.start()
    fut = Future()
    gone = weakref.ref(fut)
    q.put((3, fut))
    q.join()
    del fut
    gc.collect()
    assert 3 in finish_t and gone() is None, "the watcher still holds the last bucket's future"
    q.put(None)
    watcher.join(5)
    assert not watcher.is_alive()


@pytest.mark.parametrize("change", ["replaced", "added parameter", "added submodule"])
def test_parameters_registered_after_wrapping_are_refused_by_name(change):
    """A parameter replaced or added in the wrapped model after wrapping has no bucket: with
    find_unused_parameters=True (the old one just looks unused) its gradients stayed each rank's
    own and the replicas drifted apart, as under torch's DDP."""
    def body(comm):
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=True)
        x = torch.ones(2, 4) * (comm.rank + 1)
        model(x).sum().backward()
        net[1].weight = net[1].weight        # the same parameter again: nothing changes
        net.add_module("act", nn.ReLU())     # a submodule with no parameters: nothing to reduce
        model(x).sum().backward()
        if change == "replaced":
            net[0].weight = nn.Parameter(torch.ones(4, 4))
            name = "parameter 0.weight"
        elif change == "added parameter":
            net[1].scale = nn.Parameter(torch.ones(2))
            name = "parameter 1.scale"
        else:
            net.add_module("head", nn.Linear(2, 2))
            name = "submodule head (with weight, bias)"
        with pytest.raises(ringcomm.UsageError, match=re.escape(name) + ".*wrap model.module again"):
            model(x)
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=True)
        model(x).sum().backward()
        return [p.grad.clone() for p in net.parameters() if p.grad is not None]

    grads0, grads1 = run_threads(2, body)
    assert len(grads0) == len(grads1) and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


@contextlib.contextmanager
def _conversion_future(overwrite: bool = False, swap: bool = False):
    """torch's process-wide conversion flags, set for the block and restored after it: one rank's
    thread at a time."""
    with _FUTURE_FLAGS:
        old = (torch.__future__.get_overwrite_module_params_on_conversion(),
               torch.__future__.get_swap_module_params_on_conversion())
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        torch.__future__.set_swap_module_params_on_conversion(swap)
        try:
            yield
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(old[0])
            torch.__future__.set_swap_module_params_on_conversion(old[1])


_FUTURE_FLAGS = threading.Lock()


@pytest.mark.parametrize("road", ["overwrite on conversion", "swap on conversion", "load_state_dict swapping",
                                  "swap_tensors"])
def test_parameters_torch_replaces_past_its_registration_hooks_are_refused(road):
    """torch's conversions under its __future__ flags, load_state_dict under the swap flag and
    torch.utils.swap_tensors replace parameters without telling the registration hooks: with
    find_unused_parameters=True the new tensors' gradients stayed each rank's own (6.6 and 13.3
    for one weight's sum). Each is refused by name before any message; a new wrap reduces."""
    def body(comm):
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=True)
        x = torch.ones(2, 4) * (comm.rank + 1)
        model(x).sum().backward()
        net.double()                  # torch's default road: .data replaced in place, still reduced
        x = x.double()
        model(x).sum().backward()
        if road == "overwrite on conversion":
            with _conversion_future(overwrite=True):
                net.float()
            how = "replaced by a new Parameter"
        elif road == "swap on conversion":
            with _conversion_future(swap=True):
                net.float()
            how = "swapped for another tensor"
        elif road == "load_state_dict swapping":
            state = {k: v.float() for k, v in net.state_dict().items()}
            with _conversion_future(swap=True):
                net.float()
                net.load_state_dict(state)
            how = "swapped for another tensor"
        else:
            torch.utils.swap_tensors(net[1].weight, nn.Parameter(net[1].weight.detach().float()))
            net.float()
            how = "swapped for another tensor"
        x = x.float()
        with pytest.raises(ringcomm.UsageError, match=r"parameter\(s\) .*1\.weight.* " + how
                           + ".*wrap model.module again"):
            model(x)
        model = ddp.DistributedDataParallel(net, comm, find_unused_parameters=True)
        for p in net.parameters():
            p.grad = None
        model(x).sum().backward()
        return [p.grad.clone() for p in net.parameters()]

    grads0, grads1 = run_threads(2, body)
    assert len(grads0) == 4 and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


def test_frozen_parameters_replaced_by_frozen_ones_are_watched_anew_not_refused():
    def body(comm):
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        net[0].requires_grad_(False)
        model = ddp.DistributedDataParallel(net, comm)
        with _conversion_future(overwrite=True):
            net[0].double()
            net[0].float()            # frozen, and frozen still: nothing to reduce
        model(torch.ones(1, 4)).sum().backward()
        net[0].weight.requires_grad_(True)   # the new object is the one watched now
        with pytest.raises(ringcomm.UsageError, match=r"0\.weight did not require grad"):
            model(torch.ones(1, 4))
        return True

    assert run_threads(2, body) == [True, True]


def test_a_frozen_parameter_added_after_wrapping_is_watched_like_the_others():
    def body(comm):
        net = nn.Sequential(nn.Linear(4, 2))
        model = ddp.DistributedDataParallel(net, comm)
        net[0].bias_extra = nn.Parameter(torch.zeros(2), requires_grad=False)
        model(torch.ones(1, 4)).sum().backward()   # frozen: nothing to reduce
        net[0].bias_extra.requires_grad_(True)
        with pytest.raises(ringcomm.UsageError, match=r"0\.bias_extra did not require grad"):
            model(torch.ones(1, 4))
        return True
    assert run_threads(2, body) == [True, True]


class _Rechecked(nn.Module):
    """``b`` runs inside a reentrant torch.utils.checkpoint and, with ``reuse``, again outside it:
    its parameters then get one gradient from the checkpoint's own backward and one from the
    outer backward. ``extra`` runs the checkpointed segment once more (a graph that changed)."""

    def __init__(self, reuse: bool = True):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 2)
        self.reuse, self.extra = reuse, False

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(lambda t: torch.tanh(self.b(t)), torch.relu(self.a(x)), use_reentrant=True)
        if self.extra:
            h = checkpoint(lambda t: torch.tanh(self.b(t)), h, use_reentrant=True)
        return self.c(self.b(h) if self.reuse else h)


def _rechecked_inputs():
    return [torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(4, 8) * (r + 1) for r in range(2)]


@pytest.mark.parametrize("options", [{}, {"find_unused_parameters": True}, {"gradient_as_bucket_view": True}])
def test_static_graph_reduces_parameters_that_a_reentrant_checkpoint_gives_two_gradients(options):
    """torch's static_graph supports a parameter reused across reentrant backward passes: the
    first backward learns how many gradients each gets and reduces them all at its end; later
    ones reduce each parameter after its last. Three steps, each the mean of the ranks' full
    gradients, bit-equal across ranks."""
    from thread_util import outcomes
    torch.manual_seed(0)
    init = _Rechecked().double().state_dict()   # made once: threads would share torch's RNG
    xs = _rechecked_inputs()

    def body(comm):
        net = _Rechecked().double()
        net.load_state_dict(init)
        model = ddp.DistributedDataParallel(net, comm, static_graph=True, **options)
        grads = []
        for _ in range(3):
            net.zero_grad()
            model(xs[comm.rank]).pow(2).sum().backward()
            grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
        return grads

    out = outcomes(2, body, timeout=20)
    assert not any(isinstance(o, BaseException) for o in out), out
    net = _Rechecked().double()
    net.load_state_dict(init)
    local = []
    for x in xs:
        net.zero_grad()
        net(x).pow(2).sum().backward()
        local.append({n: p.grad.clone() for n, p in net.named_parameters()})
    for step in range(3):
        for name in local[0]:
            assert torch.equal(out[0][step][name], out[1][step][name]), (step, name)
            assert torch.equal(out[0][step][name], (local[0][name] + local[1][name]) / 2), (step, name)


@pytest.mark.parametrize("reuse, options, words", [
    (True, {}, "got a second gradient in one backward"),
    (False, {"find_unused_parameters": True}, "found it unreachable from the forward's outputs"),
])
def test_a_reentrant_checkpoint_without_static_graph_is_refused_naming_the_remedies(reuse, options, words):
    """Without static_graph a second gradient of one parameter, or a gradient of one the graph
    walk of find_unused_parameters could not see (inside a reentrant checkpoint), raises on
    every rank, naming use_reentrant=False and static_graph=True (as torch's DDP refuses both)."""
    from thread_util import outcomes
    torch.manual_seed(0)
    init = _Rechecked(reuse).double().state_dict()
    xs = _rechecked_inputs()

    def body(comm):
        net = _Rechecked(reuse).double()
        net.load_state_dict(init)
        ddp.DistributedDataParallel(net, comm, **options)(xs[comm.rank]).sum().backward()

    out = outcomes(2, body, timeout=20)
    for err in out:
        assert isinstance(err, ringcomm.UsageError), out
        assert words in str(err) and "use_reentrant=False" in str(err) and "static_graph=True" in str(err), err


def test_static_graph_refuses_a_backward_that_gives_more_gradients_than_the_first():
    """A promise broken: the second step runs the checkpointed segment twice. Its parameters'
    extra gradients raise on every rank instead of being left out of the reduction."""
    from thread_util import outcomes
    torch.manual_seed(0)
    init = _Rechecked().double().state_dict()
    xs = _rechecked_inputs()

    def body(comm):
        net = _Rechecked().double()
        net.load_state_dict(init)
        model = ddp.DistributedDataParallel(net, comm, static_graph=True)
        model(xs[comm.rank]).sum().backward()
        net.extra = True
        model(xs[comm.rank]).sum().backward()

    out = outcomes(2, body, timeout=20)
    for err in out:
        assert isinstance(err, ringcomm.UsageError), out
        assert "got 3 gradients in this backward where the first synchronised one gave it 2" in str(err), err
