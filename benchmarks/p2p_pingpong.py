"""Blocking send/recv ping-pong between two ranks: what one point-to-point call costs.

    mpirun -n 2 python benchmarks/p2p_pingpong.py [--bytes 1024] [--number 2000] [--repeat 7]

Rank 0 sends and then receives, rank 1 receives and then sends back; one round trip is two
blocking calls on each rank. Printed per call (round trip / 2), next to mpi4py's Send/Recv of
the same buffer, as the best and the median of the repeats: the machine may be shared, so a
single figure (or a single launch) is not a measurement.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def round_trips(send, recv, rank: int, number: int) -> float:
    """Seconds for ``number`` round trips (rank 0 starts each one)."""
    start = time.perf_counter()
    for _ in range(number):
        if rank == 0:
            send()
            recv()
        else:
            recv()
            send()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--number", type=int, default=2000, help="round trips per timing")
    p.add_argument("--repeat", type=int, default=7, help="timings")
    args = p.parse_args()
    import ringcomm
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit(f"p2p_pingpong.py runs on exactly 2 ranks (mpirun -n 2), got {world.Get_size()}")
    comm = ringcomm.init()
    mpi = world.Dup()
    rank, peer = comm.rank, 1 - comm.rank
    x = np.zeros(args.bytes // 4, np.float32)
    calls = {
        "ringcomm send/recv": (lambda: comm.send(x, peer, tag=3), lambda: comm.recv(x, peer, tag=3)),
        "mpi4py Send/Recv": (lambda: mpi.Send(x, peer, tag=3), lambda: mpi.Recv(x, peer, tag=3)),
    }
    timings: dict = {label: [] for label in calls}
    for label, (send, recv) in calls.items():   # warm connections and caches
        round_trips(send, recv, rank, 200)
    for _ in range(args.repeat):                 # interleaved, so a busy spell hits both alike
        for label, (send, recv) in calls.items():
            world.Barrier()
            timings[label].append(round_trips(send, recv, rank, args.number) / args.number / 2 * 1e6)
    if rank == 0:
        print(f"# blocking ping-pong, 2 ranks ({comm.transport.name}), {args.bytes} B, us per call "
              f"(round trip / 2), {args.repeat} x {args.number} round trips")
        for label, us in timings.items():
            print(f"{min(us):9.2f} best {statistics.median(us):9.2f} median   {label}")
    comm.close()


if __name__ == "__main__":
    main()
