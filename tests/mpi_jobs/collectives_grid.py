"""Every collective x backend x dtype x op x count, checked against a float64 reference.

    mpirun -n N python collectives_grid.py REPORT.json [--backends ringcomm,mpi,gloo]
                                                       [--pretend-nodes K] [--big COUNT]

Every rank can rebuild every rank's input from its seed, so the reference needs no
communication. Rank 0 writes REPORT.json ({"checks": int, "failures": [...], ...}) for pytest
to read (stdout of several ranks interleaves under mpirun, a file does not) and the job exits 1
on any failure. With --pretend-nodes K, rank r claims node r*K//N through RINGCOMM_NODE_ID, so
traffic between those pretend nodes crosses the MPI transport.
"""
import argparse
import json
import os
import sys
import traceback
import zlib

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--backends", default="ringcomm,mpi,gloo")
parser.add_argument("--pretend-nodes", type=int, default=0)
parser.add_argument("--big", type=int, default=262147)   # > 1 MiB of float32, and prime
args = parser.parse_args()

if args.pretend_nodes:
    # Before ringcomm reads it; hydra's PMI_RANK is the only per-rank value we have this early.
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{rank * args.pretend_nodes // size}"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ringcomm  # noqa: E402
from ringcomm import algorithms  # noqa: E402

EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "uint8")
TORCH = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
         "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}
REF = {"sum": lambda s: s.sum(0), "avg": lambda s: s.sum(0) / len(s), "prod": lambda s: s.prod(0),
       "min": lambda s: s.min(0), "max": lambda s: s.max(0)}


class Checker:
    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.checks, self.failures, self.hashes = 0, [], []
        self.case = 0

    # ---- inputs: every rank can make every rank's input --------------------------------------
    def values(self, dtype, count, op, r):
        rng = np.random.default_rng([self.case, r])
        if dtype in EPS:
            v = rng.uniform(0.5, 1.5, count) if op == "prod" else rng.uniform(-1, 1, count)
        elif op == "prod":
            v = rng.integers(1, 3, count)        # |product| <= 2**4: no integer overflow
        else:
            v = rng.integers(0 if dtype == "uint8" else -3, 4, count)
        return v

    def make(self, dtype, count, op, r):
        """(array or tensor of ``dtype``, its exact values as float64)."""
        t = torch.from_numpy(self.values(dtype, count, op, r)).to(TORCH[dtype])
        exact = t.to(torch.float64).numpy()
        # Alternate torch and numpy inputs; numpy has no bfloat16.
        x = t if dtype == "bfloat16" or self.case % 2 else t.numpy().copy()
        return x, exact

    # ---- comparison --------------------------------------------------------------------------
    def check(self, what, got, ref, dtype, op=None, scale=None):
        self.checks += 1
        got = as_f64(got)
        if got.shape != ref.shape:
            return self.fail(what, f"shape {got.shape} != {ref.shape}")
        if dtype in EPS and op not in ("min", "max", None):
            tol = (self.size + 2) * EPS[dtype] * (np.abs(ref) if op == "prod" else scale)
        else:
            tol = 0.0   # ints, min/max and pure data movement are exact
        bad = np.abs(got - ref) > tol
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(what, f"{int(bad.sum())} of {ref.size} wrong, first at {i}: got {got[i]!r}, "
                            f"expected {ref[i]!r} (tolerance {np.broadcast_to(tol, ref.shape)[i]!r})")

    def fail(self, what, why):
        self.failures.append(f"rank {self.rank} {self.comm.backend} {what}: {why}")

    def fingerprint(self, x):
        if self.comm.backend == "ringcomm":
            if torch.is_tensor(x):
                x = (x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy()
            self.hashes.append((self.case, zlib.crc32(x.tobytes())))

    # ---- one case per collective --------------------------------------------------------------
    def all_reduce(self, dtype, count, op, algorithm=None):
        self.case += 1
        ins = [self.make(dtype, count, op, r) for r in range(self.size)]
        x = ins[self.rank][0]
        stack = np.stack([e for _, e in ins]) if count else np.zeros((self.size, 0))
        ret = self.comm.all_reduce(x, op, algorithm=algorithm)
        what = f"all_reduce({dtype}, n={count}, {op}, {algorithm})"
        if ret is not x:
            self.fail(what, "did not return its argument")
        self.check(what, x, REF[op](stack), dtype, op, np.abs(stack).sum(0))
        self.fingerprint(x)

    def reduce(self, dtype, count, op, root, algorithm=None):
        self.case += 1
        ins = [self.make(dtype, count, op, r) for r in range(self.size)]
        x, mine = ins[self.rank]
        stack = np.stack([e for _, e in ins]) if count else np.zeros((self.size, 0))
        self.comm.reduce(x, root, op, algorithm=algorithm)
        what = f"reduce({dtype}, n={count}, {op}, root={root}, {algorithm})"
        if self.rank == root:
            self.check(what, x, REF[op](stack), dtype, op, np.abs(stack).sum(0))
        else:
            self.check(what + " non-root input kept", x, mine, dtype)

    def broadcast(self, dtype, count, root, algorithm=None):
        self.case += 1
        x, _ = self.make(dtype, count, "sum", self.rank)
        _, expected = self.make(dtype, count, "sum", root)
        self.comm.broadcast(x, root, algorithm=algorithm)
        self.check(f"broadcast({dtype}, n={count}, root={root}, {algorithm})", x, expected, dtype)
        self.fingerprint(x)

    def all_gather(self, dtype, count, algorithm=None):
        self.case += 1
        ins = [self.make(dtype, count, "sum", r) for r in range(self.size)]
        x = ins[self.rank][0]
        out = zeros_like(x, self.size * count)
        ret = self.comm.all_gather(out, x, algorithm=algorithm)
        what = f"all_gather({dtype}, n={count}, {algorithm})"
        if ret is not out:
            self.fail(what, "did not return out")
        self.check(what, out, np.concatenate([e for _, e in ins]), dtype)
        self.fingerprint(out)

    def reduce_scatter(self, dtype, count, op, algorithm=None):
        self.case += 1
        ins = [self.make(dtype, count * self.size, op, r) for r in range(self.size)]
        x, mine = ins[self.rank]
        stack = np.stack([e for _, e in ins]) if count else np.zeros((self.size, 0))
        out = zeros_like(x, count)
        self.comm.reduce_scatter(out, x, op, algorithm=algorithm)
        what = f"reduce_scatter({dtype}, n={count}, {op}, {algorithm})"
        part = slice(self.rank * count, (self.rank + 1) * count)
        self.check(what, out, REF[op](stack)[part], dtype, op, np.abs(stack).sum(0)[part])
        self.check(what + " input kept", x, mine, dtype)


def as_f64(x):
    return x.to(torch.float64).numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)


def zeros_like(x, count):
    return torch.zeros(count, dtype=x.dtype) if torch.is_tensor(x) else np.zeros(count, x.dtype)


def ops_for(dtype):
    return ("sum", "avg", "prod", "min", "max") if dtype in EPS else ("sum", "prod", "min", "max")


def grid(c, big):
    """The same grid on every backend: default algorithm choice, every dtype, op and count."""
    size = c.size
    for dtype in DTYPES:
        for count in (0, 1, size - 1, 97):
            for op in ops_for(dtype):
                c.all_reduce(dtype, count, op)
                c.reduce(dtype, count, op, root=(c.case + count) % size)
                c.reduce_scatter(dtype, count, op)
            c.broadcast(dtype, count, root=count % size)
            c.all_gather(dtype, count)
        c.comm.barrier()
    for dtype in ("float32", "float16", "bfloat16"):   # ~1 MiB: several segments, pipelining
        for op in ("sum", "max"):
            c.all_reduce(dtype, big, op)
            c.reduce(dtype, big, op, root=size - 1)
            c.reduce_scatter(dtype, big // size, op)
        c.broadcast(dtype, big, root=size - 1)
        c.all_gather(dtype, big // size)


def every_algorithm(c, big):
    """ringcomm only: each hand-written algorithm by name over the real transports."""
    size = c.size
    for name in algorithms.names("all_reduce", c.comm.transport):
        for count in (0, 1, size - 1, 97, big):
            c.all_reduce("float32", count, "sum", algorithm=name)
        c.all_reduce("bfloat16", 1009, "avg", algorithm=name)
        c.all_reduce("int64", 97, "max", algorithm=name)
    for name in algorithms.names("broadcast"):
        for count in (0, 1, 97, big):
            c.broadcast("float32", count, root=size - 1, algorithm=name)
    for name in algorithms.names("reduce"):
        for count in (0, 1, 97, big):
            c.reduce("float64", count, "sum", root=size // 2, algorithm=name)
    for name in algorithms.names("all_gather"):
        for count in (0, 1, 97, big // size):
            c.all_gather("float16", count, algorithm=name)
    for name in algorithms.names("reduce_scatter"):
        for count in (0, 1, 97, big // size):
            c.reduce_scatter("float32", count, "sum", algorithm=name)
    for name in algorithms.names("barrier"):
        c.comm.barrier(algorithm=name)


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    report = {"checks": 0, "failures": [], "backends": {}, "size": world.size}
    for backend in args.backends.split(","):
        try:
            comm = ringcomm.init(backend)
            c = Checker(comm)
            if comm.backend != backend:
                c.fail("init", f"comm.backend is {comm.backend!r}")
            grid(c, args.big)
            if backend == "ringcomm":
                every_algorithm(c, args.big)
                everyone = world.allgather(c.hashes)
                differ = sorted({a[0] for h in everyone for a, b in zip(h, everyone[0]) if a != b})
                if differ:
                    c.fail("determinism", f"results differ in their bits between ranks in cases {differ[:10]}")
            comm.close()
            failures, checks = c.failures, c.checks
            topo = {"local_rank": comm.local_rank, "local_size": comm.local_size,
                    "node_count": comm.node_count, "transport": type(comm.transport).__name__}
        except Exception:
            failures, checks, topo = [f"rank {world.rank} {backend}: {traceback.format_exc()}"], 0, {}
        all_failures = world.gather(failures)
        all_checks = world.gather(checks)
        all_topo = world.gather(topo)
        if world.rank == 0:
            report["failures"] += [f for per_rank in all_failures for f in per_rank[:20]]
            report["checks"] += sum(all_checks)
            report["backends"][backend] = {"checks": sum(all_checks), "ranks": all_topo}
    if world.rank == 0:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
    sys.exit(1 if world.bcast(bool(report["failures"]) if world.rank == 0 else None) else 0)


main()
