"""Async collectives in flight, Work.wait(timeout), and init()'s choices, on every backend.

    mpirun -n N python async_and_init.py REPORT.json [--backends ringcomm,mpi,gloo]

Rank 0 writes REPORT.json ({"checks": int, "failures": [...]}); the job exits 1 on any failure.
"""
import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

import ringcomm

parser = argparse.ArgumentParser()
parser.add_argument("report")
parser.add_argument("--backends", default="ringcomm,mpi,gloo")
args = parser.parse_args()

checks, failures = 0, []


def expect(what, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{what}: {detail}")


def in_flight(comm):
    """Seven mixed collectives issued back to back; they must finish in issue order, all correct."""
    n, r, big = comm.size, comm.rank, 1 << 18
    a = np.full(big, r + 1.0, np.float32)
    b = torch.full((33,), float(r), dtype=torch.bfloat16)
    gathered = np.zeros(5 * n, np.int64)
    scattered = np.zeros(7, np.float64)
    c = np.full(3, r, np.int32)
    h = np.full(9, 0.5 + r, np.float16)   # on "mpi": a user-defined MPI_Op, run by the progress thread
    works = [comm.all_reduce(a, async_op=True),
             comm.broadcast(b, root=n - 1, async_op=True),
             comm.all_gather(gathered, np.full(5, r, np.int64), async_op=True),
             comm.reduce_scatter(scattered, np.arange(7.0 * n), "max", async_op=True),
             comm.barrier(async_op=True),
             comm.all_reduce(c, "min", async_op=True),
             comm.all_reduce(h, "avg", async_op=True)]
    expect(f"{comm.backend} async_op returns Work", all(isinstance(w, ringcomm.Work) for w in works))
    order_ok, deadline = True, time.monotonic() + 60
    while not works[-1].is_completed() and time.monotonic() < deadline:
        done = [w.is_completed() for w in works]
        order_ok &= done == sorted(done, reverse=True)   # a prefix of the issue order is done
        time.sleep(0.0005)
    expect(f"{comm.backend} in-flight collectives complete in issue order", order_ok)
    results = [w.wait(30) for w in works]
    expect(f"{comm.backend} all earlier Works done once the last is", all(w.is_completed() for w in works))
    expect(f"{comm.backend} async all_reduce", results[0] is a and (a == n * (n + 1) / 2).all(), a[:3])
    expect(f"{comm.backend} async broadcast", (b.float() == n - 1).all(), b[:3])
    expect(f"{comm.backend} async all_gather", (gathered == np.repeat(np.arange(n), 5)).all(), gathered)
    expect(f"{comm.backend} async reduce_scatter", (scattered == np.arange(7.0 * n)[7 * r:7 * r + 7]).all(),
           scattered)
    expect(f"{comm.backend} async barrier returns None", results[4] is None, results[4])
    expect(f"{comm.backend} async all_reduce min", (c == 0).all(), c)
    expect(f"{comm.backend} async float16 avg", (h == np.float16(0.5 + (n - 1) / 2)).all(), h)

    # A synchronous call behind queued async ones waits its turn and sees their results.
    x = np.ones(1000)
    first = comm.all_reduce(x, async_op=True)
    comm.all_reduce(x)
    expect(f"{comm.backend} sync after async keeps issue order", first.is_completed() and (x == n * n).all(), x[:3])


def wait_timeout(comm):
    """Rank 0's wait(0.05) must raise while the others have not joined; a later wait succeeds."""
    x = np.full(4, 1.0)
    if comm.rank != 0:
        time.sleep(0.5)
    work = comm.all_reduce(x, async_op=True)
    if comm.rank == 0 and comm.size > 1:
        try:
            work.wait(0.05)
            expect(f"{comm.backend} wait(0.05) raises while peers are late", False, "returned")
        except ringcomm.CommTimeoutError as err:
            expect(f"{comm.backend} timeout message names the call", "all_reduce" in str(err), str(err))
    work.wait(30)
    expect(f"{comm.backend} wait after a wait timeout", (x == comm.size).all(), x)


def init_choices(world):
    os.environ["RINGCOMM_BACKEND"] = "gloo"
    comm = ringcomm.init()
    expect("RINGCOMM_BACKEND picks the backend", comm.backend == "gloo", comm.backend)
    comm.close()
    del os.environ["RINGCOMM_BACKEND"]
    try:
        ringcomm.init("nccl")
        expect("backend nccl without a GPU fails at init", torch.cuda.is_available(), "init returned")
    except ringcomm.UsageError as err:
        expect("nccl's init error gives the reason", "nccl" in str(err) and ("GPU" in str(err) or "NCCL" in str(err)),
               str(err))


def main():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    try:
        init_choices(world)
        for backend in args.backends.split(","):
            comm = ringcomm.init(backend, timeout=60)
            if backend != "ringcomm":
                try:
                    comm.all_reduce(np.ones(3), algorithm="ring")
                    expect(f"{backend} rejects algorithm names", False, "accepted 'ring'")
                except ringcomm.UsageError as err:
                    expect(f"{backend} says why it rejects algorithm names", "ringcomm" in str(err), str(err))
            in_flight(comm)
            wait_timeout(comm)
            comm.close()
    except Exception:
        failures.append(f"rank {world.rank}: {traceback.format_exc()}")
    everyone = world.gather([f"rank {world.rank} {f}" for f in failures])
    total = world.gather(checks)
    if world.rank == 0:
        with open(args.report, "w") as fh:
            json.dump({"checks": sum(total), "failures": [f for fs in everyone for f in fs]}, fh, indent=1)
    sys.exit(1 if world.bcast(any(everyone) if world.rank == 0 else None) else 0)


main()
