"""Data-parallel training of a small transformer on ringcomm, launched with mpirun or torchrun.

    mpirun -n 2 python examples/train.py --backend ringcomm            # ddp.DistributedDataParallel
    mpirun -n 2 python examples/train.py --backend ringcomm --torch-ddp  # torch's DDP on "ringcomm"
    torchrun --nproc_per_node=2 examples/train.py                      # the same, ranks meet in torchrun's store
    torchrun --nproc_per_node=2 examples/train.py --torch-ddp
    RINGCOMM_TIMELINE=/tmp/trace.json mpirun -n 2 python examples/train.py   # + Chrome traces

Task (synthetic, so nothing is downloaded): each sample is a sequence of tokens and the label is
its most frequent token. Every rank generates the same dataset from one seed and trains on its own
shard of each epoch (torch's DistributedSampler, told the rank and world size explicitly). Each
step prints the loss, samples/s over all ranks, and communication time: "comm" is the time a
gradient reduction was in flight, "exposed" the part of it that backward had to wait for.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddp
import ringcomm


class MajorityTransformer(nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos)
        return self.head(h.mean(dim=1))


def make_data(n: int, vocab: int, seq: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq), generator=g)
    counts = torch.zeros(n, vocab, dtype=torch.int64).scatter_add_(1, tokens, torch.ones_like(tokens))
    return TensorDataset(tokens, counts.argmax(dim=1))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="ringcomm", help="ringcomm.init backend: ringcomm, mpi or gloo")
    p.add_argument("--torch-ddp", action="store_true",
                   help="torch.nn.parallel.DistributedDataParallel over the torch.distributed backend \"ringcomm\"")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, default=1.0)
    p.add_argument("--hook", choices=["allreduce", "fp16", "bf16"], default="allreduce",
                   help="comm hook for ddp.DistributedDataParallel")
    p.add_argument("--log-every", type=int, default=5)
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)    # ranks share the cores; one intra-op thread each avoids thrashing
    try:
        if args.torch_ddp:
            comm = ringcomm.init_process_group(args.backend)   # dist.init_process_group("ringcomm") inside
        else:
            comm = ringcomm.init(args.backend)
    except (ValueError, ImportError) as err:
        print(f"train.py: backend {args.backend!r} is not available here: {err}", file=sys.stderr)
        sys.exit(2)
    rank, size = comm.rank, comm.size
    vocab, seq = 8, 16
    torch.manual_seed(1234 + rank)    # replicas differ until DDP broadcasts rank 0's parameters
    net = MajorityTransformer(vocab, seq, args.dim, args.layers, heads=4)
    if args.torch_ddp:
        import torch.distributed as dist
        model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_cap_mb)
        group = dist.group.WORLD
    else:
        model = ddp.DistributedDataParallel(net, comm, bucket_cap_mb=args.bucket_cap_mb,
                                            first_bucket_mb=args.first_bucket_mb)
        hooks = {"allreduce": ddp.allreduce_hook, "fp16": ddp.fp16_compress_hook, "bf16": ddp.bf16_compress_hook}
        model.register_comm_hook(ddp.CommState(comm), hooks[args.hook])
    train = make_data(args.batch * size * 40, vocab, seq, seed=0)
    test = make_data(1024, vocab, seq, seed=1)
    sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    params = sum(p.numel() for p in net.parameters())
    if rank == 0:
        mode = "torch DDP on torch.distributed 'ringcomm'" if args.torch_ddp else f"ddp.DistributedDataParallel ({args.hook} hook)"
        print(f"{size} ranks, backend {comm.backend}, {mode}, {params / 1e3:.1f}k parameters, "
              f"{args.batch} samples/rank/step", flush=True)

    step, epoch, t_start, seen = 0, 0, time.perf_counter(), 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step == args.steps:
                break
            t0 = time.perf_counter()
            comm_before = group.comm_seconds if args.torch_ddp else 0.0
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            seen += args.batch * size
            if args.torch_ddp:
                comm_s, exposed = group.comm_seconds - comm_before, math.nan
            else:
                stats = model.last_step_stats
                comm_s, exposed = stats["comm_s"], stats["exposed_comm_s"]
            if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                exposed_txt = "" if math.isnan(exposed) else f" (exposed {exposed * 1e3:6.2f} ms)"
                print(f"step {step:4d}  loss {loss.item():.4f}  {args.batch * size / dt:8.0f} samples/s  "
                      f"comm {comm_s * 1e3:6.2f} ms{exposed_txt}", flush=True)
            step += 1
        epoch += 1
    elapsed = time.perf_counter() - t_start
    with torch.no_grad():
        acc = (net(test.tensors[0]).argmax(dim=1) == test.tensors[1]).double().mean().item()
    # Replicas must have stayed identical: compare a checksum with rank 0's.
    check = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).double().sum().reshape(1)
    mine = check.clone()
    comm.broadcast(check, root=0)
    if not torch.equal(check, mine):
        raise SystemExit(f"rank {rank}: parameters diverged from rank 0")
    if rank == 0:
        print(f"done: {step} steps in {elapsed:.1f} s, {seen / elapsed:.0f} samples/s, "
              f"test accuracy {acc:.3f} (chance {1 / vocab:.3f}), replicas identical", flush=True)
    if not args.torch_ddp:
        path = model.write_timeline()
        if path:
            print(f"rank {rank}: timeline written to {path}", flush=True)


if __name__ == "__main__":
    main()
