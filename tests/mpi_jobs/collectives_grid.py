"""Every collective x backend x dtype x op x count, checked against the collectives' references.

    mpirun -n N python collectives_grid.py REPORT.json [--backends ringcomm,mpi,gloo]
                                                       [--pretend-nodes K] [--big COUNT]

Every rank can rebuild every rank's input from its seed, so the reference needs no
communication. Rank 0 writes REPORT.json ({"checks": int, "failures": [...], ...}) for pytest
to read (stdout of several ranks interleaves under mpirun, a file does not) and the job exits 1
on any failure. With --pretend-nodes K, rank r claims node r*K//N through RINGCOMM_NODE_ID, so
traffic between those pretend nodes crosses the MPI transport. Each backend also runs the grid's
core on sub-communicators (odd/even ranks, and a split of that), with calls in flight on both.
"""
import argparse
import json
import os
import time
import sys
import traceback
import zlib
from pathlib import Path

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: the grid's inputs and tolerances
import numpy as np  # noqa: E402
import torch  # noqa: E402

import ringcomm  # noqa: E402
from grid import DTYPES, FACTOR, Case, assert_close, empty, make, op_arg, ops_for, raw_bytes, values  # noqa: E402
from ringcomm import algorithms, collectives  # noqa: E402


class Checker:
    def __init__(self, comm, label):
        self.comm, self.label, self.rank, self.size = comm, label, comm.rank, comm.size
        self.checks, self.failures, self.hashes = 0, [], []
        self.case = 0

    def inputs(self, case, count_of):
        """Every rank's input values of this case (each rank can rebuild all of them)."""
        self.case += 1
        return [values(case, r, count_of(r), seed=self.case) for r in range(self.size)]

    def expect(self, what, case, got, ref, per_rank):
        self.checks += 1
        try:
            assert_close(case, got, ref, per_rank, what)
        except AssertionError as err:
            self.failures.append(f"{self.label} rank {self.rank}: {err}")

    def exact(self, what, case, got, ref_values):
        self.checks += 1
        if raw_bytes(got) != raw_bytes(make(case, ref_values)):
            self.failures.append(f"{self.label} rank {self.rank}: {what}: {case}: bytes differ from the reference")

    def fingerprint(self, x):
        if self.comm.backend == "ringcomm" and x is not None:
            self.hashes.append((self.case, zlib.crc32(raw_bytes(x))))

    # ---- one case per collective --------------------------------------------------------------
    def all_reduce(self, case, algorithm=None, out_of_place=False):
        ins = self.inputs(case, lambda r: case.count)
        x = make(case, ins[self.rank])
        out = empty(case, case.count) if out_of_place else None
        got = self.comm.all_reduce(x, op_arg(case), out=out, algorithm=algorithm)
        ref = collectives.get("all_reduce").reference(ins, op=case.op, dtype=case.dtype, factor=FACTOR)[0]
        self.expect(f"all_reduce({algorithm}, out={out_of_place})", case, got, ref, ins)
        self.fingerprint(got)

    def reduce(self, case, root, algorithm=None, out_of_place=False):
        ins = self.inputs(case, lambda r: case.count)
        x = make(case, ins[self.rank])
        out = empty(case, case.count) if out_of_place and self.rank == root else None
        got = self.comm.reduce(x, root, op_arg(case), out=out, algorithm=algorithm)
        what = f"reduce(root={root}, {algorithm}, out={out_of_place})"
        if self.rank == root:
            ref = collectives.get("reduce").reference(ins, root=root, op=case.op, dtype=case.dtype, factor=FACTOR)
            self.expect(what, case, got, ref[root], ins)
        if self.rank != root or out_of_place:
            self.exact(what + " input kept", case, x, ins[self.rank])

    def broadcast(self, case, root, algorithm=None):
        ins = self.inputs(case, lambda r: case.count)
        x = make(case, ins[self.rank])
        self.comm.broadcast(x, root, algorithm=algorithm)
        self.exact(f"broadcast(root={root}, {algorithm})", case, x, ins[root])
        self.fingerprint(x)

    def all_gather(self, case, counts=None, algorithm=None, odd_in_place=False):
        """``odd_in_place``: the odd ranks pass their own part of out as x, the others not."""
        sizes = counts or (case.count,) * self.size
        ins = self.inputs(case, lambda r: sizes[r])
        out = empty(case, sum(sizes))
        x = make(case, ins[self.rank])
        if odd_in_place and self.rank % 2:
            off = sum(sizes[:self.rank])
            x = out[off:off + sizes[self.rank]]
            x[...] = make(case, ins[self.rank])
        self.comm.all_gather(out, x, counts=counts, algorithm=algorithm)
        self.exact(f"all_gather(counts={counts}, {algorithm}, odd_in_place={odd_in_place})", case, out,
                   np.concatenate(ins))

    def reduce_scatter(self, case, counts=None, algorithm=None):
        sizes = counts or (case.count,) * self.size
        ins = self.inputs(case, lambda r: sum(sizes))
        x = make(case, ins[self.rank])
        out = empty(case, sizes[self.rank])
        self.comm.reduce_scatter(out, x, op_arg(case), counts=counts, algorithm=algorithm)
        ref = collectives.get("reduce_scatter").reference(ins, op=case.op, dtype=case.dtype, factor=FACTOR,
                                                          counts=list(sizes))
        off = sum(sizes[:self.rank])
        self.expect(f"reduce_scatter(counts={counts}, {algorithm})", case, out, ref[self.rank],
                    [p[off:off + sizes[self.rank]] for p in ins])
        self.exact("reduce_scatter input kept", case, x, ins[self.rank])

    def all_to_all(self, case, uneven=False, algorithm=None, in_place=False):
        """``in_place``: out is x itself (MPI_IN_PLACE's form; uneven splits then symmetric)."""
        n = self.size
        rng = np.random.default_rng([self.case, 7])
        m = rng.integers(0, 4, (n, n)) if uneven else np.full((n, n), case.count)
        if in_place:
            m = np.triu(m) + np.triu(m, 1).T   # what each rank sends adds up to what it receives
        ins = self.inputs(case, lambda r: int(m[r].sum()))
        x = make(case, ins[self.rank])
        out = x if in_place else empty(case, int(m[:, self.rank].sum()))
        splits = (list(map(int, m[:, self.rank])), list(map(int, m[self.rank]))) if uneven else (None, None)
        self.comm.all_to_all(out, x, *splits, algorithm=algorithm)
        ref = collectives.get("all_to_all").reference(ins, in_splits=[tuple(map(int, row)) for row in m])
        self.exact(f"all_to_all(uneven={uneven}, {algorithm}, in_place={in_place})", case, out, ref[self.rank])

    def gather(self, case, root, algorithm=None, in_place=False):
        """``in_place``: root's x is its own block of out (MPI_IN_PLACE's form)."""
        ins = self.inputs(case, lambda r: case.count)
        out = empty(case, self.size * case.count) if self.rank == root else None
        x = make(case, ins[self.rank])
        if in_place and self.rank == root:
            x = out[root * case.count:(root + 1) * case.count]
            x[...] = make(case, ins[root])
        self.comm.gather(out, x, root, algorithm=algorithm)
        if self.rank == root:
            self.exact(f"gather(root={root}, {algorithm}, in_place={in_place})", case, out, np.concatenate(ins))

    def scatter(self, case, root, algorithm=None, in_place=False):
        """``in_place``: root's out is its own block of x (MPI_IN_PLACE's form)."""
        ins = self.inputs(case, lambda r: self.size * case.count)
        out = empty(case, case.count)
        x = make(case, ins[root]) if self.rank == root else None
        if in_place and self.rank == root:
            out = x[root * case.count:(root + 1) * case.count]
        self.comm.scatter(out, x, root, algorithm=algorithm)
        self.exact(f"scatter(root={root}, {algorithm}, in_place={in_place})", case, out,
                   ins[root][self.rank * case.count:(self.rank + 1) * case.count])
        if self.rank == root:
            self.exact("scatter's x kept", case, x, ins[root])

    def send_recv(self, case):
        """A ring of messages: each rank sends to its right, receives from its left."""
        if self.size == 1:
            return
        ins = self.inputs(case, lambda r: case.count)
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        work = self.comm.send(make(case, ins[self.rank]), right, tag=self.case % 1000, async_op=True)
        got = self.comm.recv(empty(case, case.count), left, tag=self.case % 1000)
        work.wait(60)
        self.exact("send/recv", case, got, ins[left])


    def send_across_collectives(self, case):
        """MPI's rule: every rank sends, all run collectives, and only then receive. Rank 0 is
        late to them, so its right neighbour waits there with rank 0's message unreceived for
        longer than a stalled wait takes to look for a reason: no sign of disagreement."""
        if self.size == 1:
            return
        ins = self.inputs(case, lambda r: case.count)
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        work = self.comm.send(make(case, ins[self.rank]), right, tag=999, async_op=True)
        if self.rank == 0:
            time.sleep(0.3)
        self.comm.barrier()
        total = np.ones(5, np.float32)
        self.comm.all_reduce(total)
        self.exact("all_reduce after an unreceived send", Case(5, "float32", "sum", "numpy"), total,
                   np.full(5, self.size, np.float32))
        got = self.comm.recv(empty(case, case.count), left, tag=999)
        work.wait(60)
        self.exact("send, collectives, then recv", case, got, ins[left])

def grid(c, big):
    """The same grid on every backend: default algorithm choice, every dtype, op and count."""
    size, backend = c.size, c.comm.backend
    for j, dtype in enumerate(DTYPES):
        if backend == "gloo" and dtype == "int16":
            continue   # gloo refuses int16: refusal_checks tests that it says so
        for count in (0, 1, size - 1, 97):
            kind = "torch" if dtype == "bfloat16" or (count + j) % 2 else "numpy"
            for op in ops_for(dtype):
                case = Case(count, dtype, op, kind)
                c.all_reduce(case, out_of_place=bool(count % 2))
                c.reduce(case, root=(c.case + count) % size, out_of_place=bool((count + 1) % 2))
                c.reduce_scatter(case)
            data = Case(count, dtype, "sum", kind)
            c.broadcast(data, root=count % size)
            c.all_gather(data, odd_in_place=bool(count % 2))
            c.all_to_all(data, in_place=bool(count % 2))
            c.gather(data, root=(count + 1) % size, in_place=bool(count % 2))
            c.scatter(data, root=count % size, in_place=not count % 2)
            c.send_recv(data)
        uneven, kind = tuple((r * 3 + j) % 5 for r in range(size)), "torch" if dtype == "bfloat16" else "numpy"
        c.all_gather(Case(0, dtype, "sum", kind), counts=uneven)
        c.reduce_scatter(Case(0, dtype, "sum", kind), counts=uneven)
        c.all_to_all(Case(0, dtype, "sum", kind), uneven=True)
        c.all_to_all(Case(0, dtype, "sum", kind), uneven=True, in_place=True)
        c.comm.barrier()
    for dtype in ("float32", "float16", "bfloat16"):   # ~1 MiB: several segments, pipelining
        for op in ("sum", "max"):
            case = Case(big, dtype, op, "torch" if dtype == "bfloat16" else "numpy")
            c.all_reduce(case)
            c.reduce(case, root=size - 1)
            c.reduce_scatter(Case(big // size, dtype, op, case.kind))
        data = Case(big, dtype, "sum", "torch" if dtype == "bfloat16" else "numpy")
        c.broadcast(data, root=size - 1)
        c.all_gather(Case(big // size, dtype, "sum", data.kind))
        c.all_gather(Case(big // size, dtype, "sum", data.kind), odd_in_place=True)
        c.all_to_all(Case(big // size, dtype, "sum", data.kind))
        c.all_to_all(Case(big // size, dtype, "sum", data.kind), in_place=True)
        c.gather(Case(big // size, dtype, "sum", data.kind), root=size - 1, in_place=True)
        c.scatter(Case(big // size, dtype, "sum", data.kind), root=0, in_place=True)
        c.send_recv(data)   # from 1 MiB read out of the sender's process (CMA) where the node allows
    c.send_across_collectives(Case(97, "float32", "sum", "numpy"))


def every_algorithm(c, big):
    """ringcomm only: each hand-written algorithm by name over the real transports."""
    size = c.size
    for name in algorithms.names("all_reduce", c.comm.transport):
        for count in (0, 1, size - 1, 97, big):
            c.all_reduce(Case(count, "float32", "sum", "numpy"), algorithm=name, out_of_place=bool(count % 2))
        c.all_reduce(Case(1009, "bfloat16", "avg", "torch"), algorithm=name)
        c.all_reduce(Case(97, "int64", "bxor", "torch"), algorithm=name)
    for name in algorithms.names("broadcast", c.comm.transport):
        for count in (0, 1, 97, big):
            c.broadcast(Case(count, "float32", "sum", "numpy"), root=size - 1, algorithm=name)
    for name in algorithms.names("reduce", c.comm.transport):
        for count in (0, 1, 97, big):
            c.reduce(Case(count, "float64", "sum", "numpy"), root=size // 2, algorithm=name, out_of_place=True)
    for name in algorithms.names("all_gather", c.comm.transport):
        for count in (0, 1, 97, big // size):
            c.all_gather(Case(count, "float16", "sum", "numpy"), algorithm=name)
    for name in algorithms.names("reduce_scatter", c.comm.transport):
        for count in (0, 1, 97, big // size):
            c.reduce_scatter(Case(count, "float32", "sum", "numpy"), algorithm=name)
    for name in algorithms.names("all_to_all", c.comm.transport):
        for count in (0, 1, 97, big // size):
            c.all_to_all(Case(count, "int32", "sum", "numpy"), algorithm=name)
    for collective in ("gather", "scatter"):
        for name in algorithms.names(collective, c.comm.transport):
            for count in (0, 1, 97, big // size):
                getattr(c, collective)(Case(count, "float32", "sum", "numpy"), root=size - 1, algorithm=name)
    for name in algorithms.names("barrier", c.comm.transport):
        c.comm.barrier(algorithm=name)


def sub_communicators(c):
    """Odd/even halves and a split of a half, collectives in flight on a half and on the parent."""
    comm = c.comm
    half = comm.split(comm.rank % 2)
    quarter = half.split(half.rank % 2, key=-half.rank)
    for sub, label in ((half, "half"), (quarter, "quarter")):
        s = Checker(sub, f"{c.label} {label}")
        for dtype in ("float32", "bfloat16", "int8", "bool"):
            kind = "torch" if dtype == "bfloat16" else "numpy"
            op = "sum" if dtype != "int8" else "bxor"
            s.all_reduce(Case(13, dtype, op, kind))
            s.broadcast(Case(13, dtype, "sum", kind), root=sub.size - 1)
            s.all_to_all(Case(3, dtype, "sum", kind))
            s.gather(Case(5, dtype, "sum", kind), root=0)
        c.checks += s.checks
        c.failures += s.failures
    # Calls in flight at once on the parent and on a half: each matches its own.
    x = np.full(4096, comm.rank + 1.0)
    y = np.full(4096, comm.rank + 1.0)
    w1 = half.all_reduce(y, async_op=True)
    w2 = comm.all_reduce(x, async_op=True)
    w1.wait(60)
    w2.wait(60)
    c.checks += 2
    if x[0] != comm.size * (comm.size + 1) / 2:
        c.failures.append(f"{c.label} rank {c.rank}: parent all_reduce beside a half's: {x[0]}")
    mine = sum(r + 1 for r in range(comm.size) if r % 2 == comm.rank % 2)
    if y[0] != mine:
        c.failures.append(f"{c.label} rank {c.rank}: half all_reduce beside the parent's: {y[0]} != {mine}")
    quarter.close()
    half.close()
    # All ranks but the last, then split again: with two pretend nodes of two ranks, rank 2 is
    # alone on its node in `rest` while ranks 0 and 1 share theirs (a split of `rest` once waited
    # in MPI_Comm_split forever there: rank 2 took its MPI route for its node's).
    rest = comm.split(0 if comm.rank < comm.size - 1 else None)
    if rest is not None:
        for color, label in ((rest.rank, "rest singleton"), (0, "rest whole"), (rest.rank % 2, "rest half")):
            sub = rest.split(color)
            s = Checker(sub, f"{c.label} {label}")
            s.all_reduce(Case(13, "float32", "sum", "numpy"))
            s.all_to_all(Case(3, "int32", "sum", "numpy"))
            c.checks += s.checks
            c.failures += s.failures
            sub.close()
        rest.close()


def refusal_checks(c):
    """What a backend cannot do is a UsageError before communication, naming it."""
    c.checks += 1
    if c.comm.backend != "gloo":
        return
    try:
        c.comm.all_reduce(torch.ones(3, dtype=torch.int16))
        c.failures.append(f"{c.label} rank {c.rank}: gloo accepted int16")
    except ringcomm.UsageError as err:
        if "int16" not in str(err):
            c.failures.append(f"{c.label} rank {c.rank}: gloo's int16 refusal does not say why: {err}")


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    report = {"checks": 0, "failures": [], "backends": {}, "size": world.size}
    for backend in args.backends.split(","):
        try:
            comm = ringcomm.init(backend)
            c = Checker(comm, backend)
            if comm.backend != backend:
                c.failures.append(f"init: comm.backend is {comm.backend!r}")
            grid(c, args.big)
            refusal_checks(c)
            sub_communicators(c)
            if backend == "ringcomm":
                every_algorithm(c, args.big)
                everyone = world.allgather(c.hashes)
                differ = sorted({a[0] for h in everyone for a, b in zip(h, everyone[0]) if a != b})
                if differ:
                    c.failures.append(f"determinism: results differ in their bits between ranks in cases {differ[:10]}")
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
