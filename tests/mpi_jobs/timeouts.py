"""A collective some ranks never join must raise CommTimeoutError by its deadline, not hang.

    mpirun -n N python timeouts.py REPORT.json [--backends ringcomm,mpi,gloo]

On each backend, with timeout=1 s, rank 0 alone calls all_reduce, then on a second communicator
split; each must raise CommTimeoutError naming the call within a few seconds, and the
communicator must then refuse further collectives with CommError. Rank 0 writes REPORT.json; the job exits 1 on failure.
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


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    failures, checks = [], 0
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        failures.append(f"ringcomm.init left MPI at thread level {MPI.Query_thread()}, not MULTIPLE")
    for backend in args.backends.split(","):
        comm = ringcomm.init(backend, timeout=1.0)
        if comm.rank == 0:
            checks += 1
            start = time.monotonic()
            try:
                comm.all_reduce(np.ones(1000, np.float32))
                failures.append(f"{backend}: all_reduce without peers returned")
            except ringcomm.CommTimeoutError as err:
                took = time.monotonic() - start
                if not (0.9 <= took < 15) or "all_reduce" not in str(err):
                    failures.append(f"{backend}: timed out after {took:.2f} s with {err}")
            except Exception as err:
                failures.append(f"{backend}: raised {type(err).__name__}: {err}, not CommTimeoutError")
            checks += 1
            try:
                comm.barrier()
                failures.append(f"{backend}: a timed-out communicator still ran a barrier")
            except ringcomm.CommError:
                pass
        world.Barrier()
        # split is a collective too: on the reference backends its agreement was MPI's blocking
        # allgather, where rank 0 alone waited forever
        comm = ringcomm.init(backend, timeout=1.0)
        if comm.rank == 0:
            checks += 1
            start = time.monotonic()
            try:
                comm.split(0)
                failures.append(f"{backend}: split without peers returned")
            except ringcomm.CommTimeoutError as err:
                took = time.monotonic() - start
                if not (0.9 <= took < 15) or "split #" not in str(err):
                    failures.append(f"{backend}: split timed out after {took:.2f} s with {err}")
            except Exception as err:
                failures.append(f"{backend}: split raised {type(err).__name__}: {err}, not CommTimeoutError")
            try:
                comm.dup()
                failures.append(f"{backend}: a communicator whose split timed out still ran a dup")
            except ringcomm.CommError:
                pass
        world.Barrier()
    everyone = world.gather(failures)
    total = world.gather(checks)
    if world.rank == 0:
        with open(args.report, "w") as fh:
            json.dump({"checks": sum(total), "failures": [f for fs in everyone for f in fs]}, fh, indent=1)
    sys.stdout.flush()
    sys.exit(1 if world.bcast(any(everyone) if world.rank == 0 else None) else 0)


main()
