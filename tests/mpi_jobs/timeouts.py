"""A collective some ranks never join must raise CommTimeoutError by its deadline, not hang.

    mpirun -n N python timeouts.py REPORT.json [--backends ringcomm,mpi,gloo]

On each backend, with timeout=1 s, rank 0 alone calls all_reduce, then on a second communicator
split; each must raise CommTimeoutError naming the call within a few seconds, and the
communicator must then refuse further collectives with CommError. Rank 0 writes REPORT.json; the job exits 1 on failure.
Each rank prints "rank R leaves at T" (wall clock) before its exit hooks run: the gloo
communicators' release at exit must not wait out its bound after rank 0's split timed out.
"""
import argparse
import json
import sys
import time

import numpy as np

import ringcomm

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--backends", default="ringcomm,mpi,gloo")
args = parser.parse_args()


def alone(comm, backend: str, name: str, call, after: str, next_call) -> list:
    """Rank 0 alone runs ``call``: the failures of its timeout, then of ``next_call`` (``after``
    names it), which the failed communicator must refuse."""
    failures = []
    start = time.monotonic()
    try:
        call()
        failures.append(f"{backend}: {name} without peers returned")
    except ringcomm.CommTimeoutError as err:
        took = time.monotonic() - start
        if not (0.9 <= took < 15) or f"{name} #" not in str(err):
            failures.append(f"{backend}: {name} timed out after {took:.2f} s with {err}")
    except Exception as err:
        failures.append(f"{backend}: {name} raised {type(err).__name__}: {err}, not CommTimeoutError")
    try:
        next_call()
        failures.append(f"{backend}: a communicator whose {name} timed out still ran a {after}")
    except ringcomm.CommError:
        pass
    return failures


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    failures, checks = [], 0
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        failures.append(f"ringcomm.init left MPI at thread level {MPI.Query_thread()}, not MULTIPLE")
    for backend in args.backends.split(","):
        comm = ringcomm.init(backend, timeout=1.0)
        if comm.rank == 0:
            checks += 2
            failures += alone(comm, backend, "all_reduce", lambda: comm.all_reduce(np.ones(1000, np.float32)),
                              "barrier", comm.barrier)
        world.Barrier()
        # split is a collective too: on the reference backends its agreement was MPI's blocking
        # allgather, where rank 0 alone waited forever
        comm = ringcomm.init(backend, timeout=1.0)
        if comm.rank == 0:
            checks += 1
            failures += alone(comm, backend, "split", lambda: comm.split(0), "dup", comm.dup)
        world.Barrier()
    everyone = world.gather(failures)
    total = world.gather(checks)
    if world.rank == 0:
        with open(args.report, "w") as fh:
            json.dump({"checks": sum(total), "failures": [f for fs in everyone for f in fs]}, fh, indent=1)
    print(f"rank {world.rank} leaves at {time.time():.3f}", flush=True)
    sys.exit(1 if world.bcast(any(everyone) if world.rank == 0 else None) else 0)


main()
