"""Ranks that disagree about a collective raise MismatchError on every rank of a reference backend.

    mpirun -n 3 python reference_mismatch.py REPORT.json [--backends mpi,gloo]
    RINGCOMM_ALGO=... mpirun -n 3 python reference_mismatch.py REPORT.json --backends ringcomm

MPI and gloo compare nothing across ranks. Before the reference backends' pre-flight exchange
(backends/reference.py), a count that differed on one rank returned MPI's partial or stale
buffers as results (an all_reduce of 4 elements against 8 "summed" the 8), and killed the job
with SIGABRT inside gloo. Here rank 2 alone differs, in each case on a fresh dup (a failed call
leaves its communicator unusable): every rank must raise MismatchError naming the field, leave
its output untouched, and the parent communicator must still work. Rank 0 writes REPORT.json.

On backend "ringcomm" (its schedules forced by RINGCOMM_ALGO, or its own choice) the same cases
must raise on every rank too, MismatchError or PeerAbortedError (a peer found it and gave up),
within half the 20 s timeout: no rank may return normally. A schedule writes an output as its
messages arrive, so a failed call may leave one partly written; the error names what the rank
saw (a message's size), not always the field.
"""
import argparse
import json
import sys
import time

import numpy as np

import ringcomm

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--backends", default="mpi,gloo")
args = parser.parse_args()

f32 = np.float32
WATCHED = []   # (array, its contents before the call) for the current case


def w(array):
    """An array the failed call must leave as it was."""
    if array is not None:
        WATCHED.append((array, array.copy()))
    return array


def cases(r: int, n: int) -> dict:
    """name -> (what the error must name, call(comm)); every call's buffers pass through ``w``."""
    odd = r == 2
    k = 5 if odd else 4   # rank 2's count

    def ones(count, dtype=f32):
        return np.ones(count, dtype)

    def uneven_counts():   # same total: only the list tells them apart
        return [1, 2, 3] if odd else [2, 1, 3]

    def a2a(comm):
        # rank 2 expects 2 elements from rank 0, which sends it 1
        ins = [1, 1, 1]
        outs = [2, 1, 1] if odd else [1, 1, 1]
        out = w(np.zeros(sum(outs), f32))
        comm.all_to_all(out, ones(3), out_splits=outs, in_splits=ins)

    def a2a_alike(comm):
        # every rank passes the same splits, which cannot all hold: rank 0 sends rank 1 two
        # elements and rank 1 expects one from it (on backend mpi this once returned rank 0's
        # output with an element never written; gloo aborted)
        out = w(np.zeros(1 + 2 + 3, f32))
        comm.all_to_all(out, ones(6), out_splits=[1, 2, 3], in_splits=[1, 2, 3])

    def ag_uneven(comm):
        counts = uneven_counts()
        out = w(np.zeros(6, f32))
        comm.all_gather(out, ones(counts[r]), counts=counts)

    def rs_uneven(comm):
        counts = uneven_counts()
        out = w(np.zeros(counts[r], f32))
        comm.reduce_scatter(out, ones(6), counts=counts)

    def rooted(name):
        def run(comm):
            root = 1 if odd else 0
            if name == "broadcast":
                comm.broadcast(w(np.full(4, r + 1.0, f32)), root=root)
            elif name == "reduce":
                comm.reduce(w(ones(4)), root=root)
            elif name == "gather":
                comm.gather(w(np.zeros(12, f32)) if r == root else None, ones(4), root=root)
            else:
                comm.scatter(w(np.zeros(4, f32)), ones(12) if r == root else None, root=root)
        return run

    def counted(name):
        def run(comm):
            if name == "all_reduce":
                comm.all_reduce(w(ones(k)))
            elif name == "broadcast":
                comm.broadcast(w(np.full(k, r + 1.0, f32)), root=0)
            elif name == "reduce":
                comm.reduce(w(ones(k)), root=0)
            elif name == "all_gather":
                comm.all_gather(w(np.zeros(n * k, f32)), ones(k))
            elif name == "reduce_scatter":
                comm.reduce_scatter(w(np.zeros(k, f32)), ones(n * k))
            elif name == "all_to_all":
                comm.all_to_all(w(np.zeros(n * k, f32)), ones(n * k))
            elif name == "gather":
                comm.gather(w(np.zeros(n * k, f32)) if r == 0 else None, ones(k), root=0)
            else:
                comm.scatter(w(np.zeros(k, f32)), ones(n * k) if r == 0 else None, root=0)
        return run

    def dtype(comm):
        comm.all_reduce(w(np.ones(4, np.int32 if odd else f32)))

    def op(comm):
        comm.all_reduce(w(ones(4)), op="max" if odd else "sum")

    def kind(comm):
        x = w(ones(4))
        if odd:
            comm.broadcast(x, root=0)
        else:
            comm.all_reduce(x)

    names = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]
    table = {f"count/{name}": ("count", counted(name)) for name in names}
    table.update({f"root/{name}": ("root", rooted(name)) for name in ("broadcast", "reduce", "gather", "scatter")})
    table.update({"dtype": ("dtype", dtype), "op": ("op", op), "kind": ("collective", kind),
                  "splits/all_to_all": ("rank 0 sends 1 elements to rank 2, which expects 2", a2a),
                  "alike splits/all_to_all": ("rank 0 sends 2 elements to rank 1, which expects 1", a2a_alike),
                  "counts/all_gather": ("counts", ag_uneven), "counts/reduce_scatter": ("counts", rs_uneven)})
    return table


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    failures, checks = [], 0
    for backend in args.backends.split(","):
        comm = ringcomm.init(backend, timeout=20)
        for name, (needle, run) in cases(comm.rank, comm.size).items():
            dup = comm.dup()
            WATCHED.clear()
            own = backend == "ringcomm"
            raised = (ringcomm.MismatchError, ringcomm.PeerAbortedError) if own else ringcomm.MismatchError
            started = time.monotonic()
            try:
                run(dup)
                failures.append(f"{backend} {name}: returned normally")
            except raised as err:
                checks += 1
                if not own and needle not in str(err):
                    failures.append(f"{backend} {name}: the error does not name {needle!r}: {err}")
                if time.monotonic() - started > 10:
                    failures.append(f"{backend} {name}: raised after {time.monotonic() - started:.1f} s: {err}")
            except Exception as err:  # noqa: BLE001 - any other outcome is the failure reported
                failures.append(f"{backend} {name}: {type(err).__name__}: {err}")
            changed = [before for array, before in WATCHED if not np.array_equal(array, before)]
            if changed and not own:
                failures.append(f"{backend} {name}: {len(changed)} buffers written by the failed call")
            dup.close()
        # the parent still works, and every rank agrees on it
        x = w(np.full(4, comm.rank + 1.0, f32))
        comm.all_reduce(x)
        if not (x == comm.size * (comm.size + 1) / 2).all():
            failures.append(f"{backend}: the parent's all_reduce afterwards gave {x}")
        comm.close()
    everyone = world.gather([f"rank {world.rank} {f}" for f in failures])
    total = world.gather(checks)
    if world.rank == 0:
        with open(args.report, "w") as fh:
            json.dump({"checks": sum(total), "failures": [f for fs in everyone for f in fs]}, fh, indent=1)
    sys.stdout.flush()
    sys.exit(1 if world.bcast(any(everyone) if world.rank == 0 else None) else 0)


main()
