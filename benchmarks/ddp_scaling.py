"""Data-parallel scaling: samples/s at 1, 2 and 4 ranks, ringcomm's DDP against torch's DDP over gloo.

    python benchmarks/ddp_scaling.py                      # launches every mpirun job itself
    python benchmarks/ddp_scaling.py --ranks 1,2 --impl ringcomm,torch --json ddp.json
    python benchmarks/ddp_scaling.py --device cuda --ranks 2 --impl ringcomm,torch,torch-ringcomm

Every job trains the same MLP (``--width`` x ``--depth``, big enough that its gradients take
real time to all-reduce), or with ``--model transformer`` examples/train.py's transformer
(``--depth`` layers of dimension ``--width``), on synthetic data, the same per-rank batch, ``torch.set_num_threads(1)``.
Implementations (``--impl``):
- ``ringcomm``: ``ddp.DistributedDataParallel`` over ``ringcomm.init()``;
- ``torch``: ``torch.nn.parallel.DistributedDataParallel`` over a gloo process group;
- ``torch-ringcomm``: torch's DDP over the "ringcomm" torch.distributed backend, if present;
- ``local``: the undistributed model in one process, the base of scaling efficiency.

Per job, three timings interleaved step by step, each the median over ``--steps`` of the slowest
rank's time (the JSON has every step's, and the mean step):
- step: forward + backward (+ gradient sync) + optimizer step;
- compute: the same inside ``no_sync()``, so no gradient is communicated;
- comm: all-reducing a buffer the size of all gradients in 25 MiB buckets, nothing else running.
exposed = step - compute is what communication added to a step; hidden = 1 - exposed / comm
is the fraction of the communication that overlapped backward. Scaling efficiency =
samples/s at n ranks / (n x samples/s of ``local``). An implementation that cannot start is
reported as unavailable with its reason.

``--device cuda``: model, data and the comm buffers on GPU ``local rank % device count`` (ranks
share a GPU where there are fewer), each timing ending in a device synchronisation. torch's DDP
then runs over gloo on CUDA tensors, which gloo copies through host memory; NCCL is not among
the implementations because it refuses two ranks on one GPU. On a CPU-only torch it stops at once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUCKET_BYTES = 25 << 20
IMPLS = ("local", "ringcomm", "torch", "torch-ringcomm")
VOCAB, SEQ = 8, 16   # the transformer's task, as in examples/train.py


# ---- the worker: one mpirun job -------------------------------------------------------------
def build_model(width: int, depth: int, classes: int, seed: int, model: str = "mlp"):
    """The MLP (``depth`` x ``width``), or examples/train.py's transformer (``depth`` layers of
    model dimension ``width``, 8 tokens of vocabulary, sequences of 16)."""
    import torch
    torch.manual_seed(seed)
    if model == "transformer":
        sys.path.insert(0, str(ROOT / "examples"))
        from train import MajorityTransformer
        return MajorityTransformer(VOCAB, SEQ, width, depth, heads=4)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def batch_of(model: str, width: int, batch: int, rank: int):
    """(inputs, targets) of one rank: random features for the MLP, random tokens for the transformer."""
    import torch
    g = torch.Generator().manual_seed(1 + rank)
    if model == "transformer":
        return torch.randint(0, VOCAB, (batch, SEQ), generator=g), torch.randint(0, VOCAB, (batch,), generator=g)
    return torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g)


def wrap(impl: str, net, world, bucket_view: bool = False):
    """The DDP-wrapped model and a function all-reducing one flat tensor with the same library.
    ``bucket_view``: both DDPs' gradient_as_bucket_view (each gradient a view into its bucket)."""
    import torch
    if impl == "local":
        return net, None
    if impl == "ringcomm":
        import ringcomm
        from ddp import DistributedDataParallel
        comm = ringcomm.init()
        return (DistributedDataParallel(net, comm, gradient_as_bucket_view=bucket_view),
                lambda t: comm.all_reduce(t))
    import torch.distributed as dist
    if impl == "torch":
        port = world.bcast(_free_port() if world.Get_rank() == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=world.Get_rank(), world_size=world.Get_size())
    else:   # torch-ringcomm
        import ringcomm
        init_pg = getattr(ringcomm, "init_process_group", None)
        if init_pg is None:
            from ringcomm.integrations.torch_backend import init_process_group as init_pg
        init_pg()
    return (torch.nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=bucket_view),
            lambda t: dist.all_reduce(t))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def overlap(step: float, compute: float, comm: float) -> tuple[float, float]:
    """(exposed seconds, hidden fraction): what sync added to a step, and how much of comm it hid."""
    exposed = max(0.0, step - compute)
    if comm <= 0:
        return exposed, 1.0
    return exposed, min(1.0, max(0.0, 1 - exposed / comm))


def worker(args) -> None:
    import contextlib

    import numpy as np
    import torch
    from mpi4py import MPI
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        local = world.Split_type(MPI.COMM_TYPE_SHARED)
        device = torch.device("cuda", local.Get_rank() % torch.cuda.device_count())
        local.Free()
        torch.cuda.set_device(device)
    net = build_model(args.width, args.depth, 10, seed=0, model=args.model).to(device)
    params = sum(p.numel() for p in net.parameters())
    error = ""
    try:
        model, all_reduce = wrap(args.impl, net, world, args.bucket_view)
    except Exception as exc:   # reported as an unavailable row by the driver
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:240]
    errors = world.allgather(error)
    if any(errors):
        if rank == 0:
            print("RESULT " + json.dumps({"impl": args.impl, "ranks": n,
                                          "error": next(e for e in errors if e)}), flush=True)
        return
    data, target = (t.to(device) for t in batch_of(args.model, args.width, args.batch, rank))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    no_sync = getattr(model, "no_sync", None) or contextlib.nullcontext

    def step(sync: bool) -> None:
        opt.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if sync else no_sync():
            loss_fn(model(data), target).backward()
        opt.step()

    grads = [torch.zeros(min(BUCKET_BYTES // 4, params - off), device=device) for off in range(0, params, BUCKET_BYTES // 4)]
    finish = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def comm_only() -> None:
        for bucket in grads:
            all_reduce(bucket)

    phases = {"step": lambda: step(True)}
    if args.impl != "local":
        phases["compute"] = lambda: step(False)
        phases["comm"] = comm_only
    for _ in range(args.warmup):
        for fn in phases.values():
            fn()
    spent = {name: np.zeros(args.steps) for name in phases}
    for s in range(args.steps):   # interleaved, so machine noise hits all three alike
        for name, fn in phases.items():
            finish()
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            finish()
            spent[name][s] = time.perf_counter() - t0
    worst = {}
    for name, times in spent.items():
        world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)   # a step lasts until its slowest rank is done
        # The median step, not the mean: the one or two steps in ten that the VM stalls moved a
        # 10-step mean by several ms, in either implementation's favour.
        worst[name] = float(np.median(times))
    if rank == 0:
        result = {"impl": args.impl, "ranks": n, "params": params, "batch_per_rank": args.batch,
                  "step_s": worst["step"], "samples_per_s": n * args.batch / worst["step"],
                  "mean_step_s": float(spent["step"].mean()),
                  "steps_s": {name: times.round(6).tolist() for name, times in spent.items()}}
        if "comm" in worst:
            exposed, hidden = overlap(worst["step"], worst["compute"], worst["comm"])
            result.update(compute_s=worst["compute"], comm_s=worst["comm"], exposed_s=exposed, hidden=hidden)
        print("RESULT " + json.dumps(result), flush=True)
    if args.impl in ("torch", "torch-ringcomm"):
        import torch.distributed as dist
        dist.destroy_process_group()


# ---- the driver: one command, every job, one table --------------------------------------------
def mpirun() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def run_job(impl: str, n: int, args) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("RINGCOMM_TIMEOUT", "120")
    cmd = [mpirun(), "-n", str(n), sys.executable, str(Path(__file__).resolve()), "--worker", "--impl", impl,
           "--width", str(args.width), "--depth", str(args.depth), "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model,
           "--device", args.device] \
        + (["--bucket-view"] if args.bucket_view else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.job_timeout)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "ranks": n, "error": f"did not finish in {args.job_timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:240]
    return {"impl": impl, "ranks": n, "error": f"exit {proc.returncode}: {tail}"}


def table(results: list[dict]) -> list[str]:
    base = next((r["samples_per_s"] for r in results if r["impl"] == "local" and "error" not in r), None)
    lines = [f"{'impl':<15}{'ranks':>6}{'samples/s':>11}{'step ms':>9}{'eff':>7}{'compute ms':>12}"
             f"{'comm ms':>9}{'exposed ms':>12}{'hidden':>8}"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['impl']:<15}{r['ranks']:>6}  unavailable: {r['error']}")
            continue
        eff = f"{r['samples_per_s'] / (r['ranks'] * base):6.0%}" if base else "     -"
        extra = (f"{r['compute_s'] * 1e3:>12.1f}{r['comm_s'] * 1e3:>9.1f}{r['exposed_s'] * 1e3:>12.1f}"
                 f"{r['hidden']:>8.0%}" if "comm_s" in r else f"{'-':>12}{'-':>9}{'-':>12}{'-':>8}")
        lines.append(f"{r['impl']:<15}{r['ranks']:>6}{r['samples_per_s']:>11.1f}{r['step_s'] * 1e3:>9.1f}"
                     f"{eff:>7}{extra}")
    return lines


def driver(args) -> int:
    ranks = args.rank_counts
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit(f"--device cuda: this torch ({torch.__version__}) sees no CUDA device")
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    for impl in impls:
        if impl not in IMPLS:
            raise SystemExit(f"--impl: expected some of {', '.join(IMPLS)}, got {impl!r}")
    jobs = ([] if args.no_local else [("local", 1)]) + [(impl, n) for n in ranks for impl in impls
                                                          if impl != "local"]
    results = []
    params = build_model(args.width, args.depth, 10, 0, args.model)
    nparams = sum(p.numel() for p in params.parameters())
    shape = (f"MLP {args.depth} x {args.width}" if args.model == "mlp" else
             f"transformer of examples/train.py, {args.depth} layers of dim {args.width}")
    print(f"# {shape} ({nparams / 1e6:.1f} M params, {nparams * 4 / 2**20:.0f} MiB of "
          f"fp32 gradients), batch {args.batch} per rank, the median of {args.steps} steps after "
          f"{args.warmup} warm-up, "
          f"torch threads 1{'; gradient_as_bucket_view' if args.bucket_view else ''}"
          f"{'; on CUDA' if args.device == 'cuda' else ''}; {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, load {os.getloadavg()}")
    for k, (impl, n) in enumerate(jobs):
        sys.stderr.write(f"\r[{k + 1}/{len(jobs)}] {impl} on {n} rank(s)   ")
        sys.stderr.flush()
        results.append(run_job(impl, n, args))
    sys.stderr.write("\n")
    for line in table(results):
        print(line)
    pairs = {(r["impl"], r["ranks"]): r for r in results if "error" not in r}
    for n in ranks:
        a, b = pairs.get(("ringcomm", n)), pairs.get(("torch", n))
        if a and b:
            print(f"# {n} ranks: ringcomm DDP / torch DDP (gloo) samples/s = {a['samples_per_s'] / b['samples_per_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results}, f, indent=1)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--impl", default="ringcomm,torch", help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    p.add_argument("--width", type=int, default=1024, help="MLP width, or the transformer's model dimension")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--no-local", action="store_true", help="skip the undistributed base (no efficiency)")
    p.add_argument("--bucket-view", action="store_true",
                   help="gradient_as_bucket_view=True in both DDPs: no copy into or out of buckets")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where model, data and buckets live")
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        args.rank_counts = [int(k) for k in args.ranks.split(",")]
    except ValueError:
        p.error(f"--ranks: expected a comma list of rank counts, got {args.ranks!r}")
    if not args.rank_counts or min(args.rank_counts) < 1:
        p.error(f"--ranks: expected rank counts >= 1, got {args.ranks!r}")
    for name in ("width", "depth", "batch", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup: expected at least 0, got {args.warmup}")
    if not args.job_timeout > 0:
        p.error(f"--job-timeout: expected seconds > 0, got {args.job_timeout}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
