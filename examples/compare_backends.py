"""The same short training run on each backend, side by side: what users swap backends to see.

    mpirun -n 2 python examples/compare_backends.py                  # ringcomm, mpi, gloo
    mpirun -n 2 python examples/compare_backends.py --backends ringcomm,gloo --steps 40

One mpirun job. For each backend in turn it makes a communicator (``ringcomm.init(backend)``),
wraps the same transformer as examples/train.py, from the same seed, in ``ddp.DistributedDataParallel``
on that communicator, and trains the same steps on the same data. Per backend it prints
samples/s over all ranks, the communication time per step (how long gradient reductions were in
flight; "exposed" is the part backward had to wait for) and the ratio to the first backend.
Backends run one after another (not interleaved), so on a noisy machine run it twice; the
benchmarks in benchmarks/ are the careful measurements (docs/performance.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ddp  # noqa: E402
import ringcomm  # noqa: E402
from train import MajorityTransformer, make_data  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="ringcomm,mpi,gloo")
    p.add_argument("--steps", type=int, default=30, help="timed steps per backend (after 5 warm-up steps)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    return p.parse_args()


class Run:
    """One backend's communicator, its replica of the model and the per-step figures so far."""

    def __init__(self, comm, args):
        self.comm = comm
        torch.manual_seed(1234)   # the same initial model on every backend
        self.net = MajorityTransformer(8, 16, args.dim, args.layers, heads=4)
        self.model = ddp.DistributedDataParallel(self.net, comm)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.step, self.walls, self.comms, self.exposed, self.loss = 0, [], [], [], float("nan")

    def steps(self, n: int, tokens, labels, batch: int, timed: bool) -> None:
        comm = self.comm
        for _ in range(n):
            lo = (self.step * comm.size + comm.rank) * batch % (len(tokens) - batch)
            x, y = tokens[lo:lo + batch], labels[lo:lo + batch]
            comm.barrier()   # every rank starts the step together: the wall time is the step's
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            dt = time.perf_counter() - t0
            self.step += 1
            self.loss = loss.item()
            if timed:
                stats = self.model.last_step_stats
                self.walls.append(dt)
                self.comms.append(stats["comm_s"])
                self.exposed.append(stats["exposed_comm_s"])

    def summary(self) -> dict:
        check = torch.cat([p.detach().reshape(-1) for p in self.net.parameters()]).double().sum().reshape(1)
        mine = check.clone()
        self.comm.broadcast(check, root=0)
        if not torch.equal(check, mine):
            raise SystemExit(f"rank {self.comm.rank}: parameters diverged from rank 0 on {self.comm.backend}")
        return {"step_s": statistics.median(self.walls), "comm_s": statistics.median(self.comms),
                "exposed_s": statistics.median(self.exposed), "loss": self.loss,
                "params": sum(p.numel() for p in self.net.parameters())}


def main() -> None:
    args = parse()
    torch.set_num_threads(1)    # ranks share the cores; one intra-op thread each avoids thrashing
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    tokens, labels = make_data(4096, 8, 16, seed=0).tensors
    runs, why = {}, {}
    for name in names:
        try:
            runs[name] = Run(ringcomm.init(name), args)
        except (ValueError, ImportError, RuntimeError) as err:
            why[name] = str(err).splitlines()[0]
    for run in runs.values():
        run.steps(5, tokens, labels, args.batch, timed=False)
    # Rounds rotate the order so that no backend always runs first (or right after another).
    order, rounds = list(runs.values()), 5
    for r in range(rounds):
        for run in order[r % len(order):] + order[:r % len(order)]:
            run.steps(max(1, args.steps // rounds), tokens, labels, args.batch, timed=True)
    rows = {name: run.summary() for name, run in runs.items()}
    for run in runs.values():
        run.comm.close()
    from mpi4py import MPI   # the job's own view: it holds whichever backends could not start
    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    size = MPI.COMM_WORLD.Get_size()
    first = rows[names[0]] if names[0] in rows else next(iter(rows.values()), None)
    if first is None:
        print("no backend could start: " + "; ".join(f"{n}: {w}" for n, w in why.items()))
        return
    print(f"\n{size} ranks, the same transformer ({first['params'] / 1e3:.0f}k parameters, "
          f"{first['params'] * 4 / 2**20:.2f} MiB of gradients per step), data and steps on each backend, "
          f"{args.batch} samples/rank/step; medians of {args.steps} steps in {rounds} rotated rounds:")
    base = next(n for n in names if n in rows)
    print(f"{'backend':10s} {'samples/s':>10s} {'step ms':>8s} {'comm ms':>8s} {'exposed ms':>10s} "
          f"{'time vs ' + base:>16s}  final loss")
    for name in names:
        r = rows.get(name)
        if r is None:
            print(f"{name:10s} unavailable: {why[name]}")
            continue
        print(f"{name:10s} {args.batch * size / r['step_s']:10.0f} {r['step_s'] * 1e3:8.2f} "
              f"{r['comm_s'] * 1e3:8.2f} {r['exposed_s'] * 1e3:10.2f} {r['step_s'] / first['step_s']:15.2f}x  "
              f"{r['loss']:.4f}")
    print("comm: time gradient reductions were in flight per step; exposed: the part backward waited for.")


if __name__ == "__main__":
    main()
