"""What a send and a receive cost in Python when the caches are cold, as they are after every
large message.

    mpirun -n 2 python benchmarks/p2p_cold.py [--bytes 1024] [--calls 60] [--evict-bytes 64M]

A 4 MiB message read by CMA streams 8 MiB through the caches (its source and its destination);
a 16 MiB one more than this machine's whole L3. The Python that posts the next send, finds the
next message and settles the Work then runs from memory, not from cache: the same calls cost
several times what a loop of small messages suggests. This measures that cost directly. Each
phase runs alone on a small message (its bytes cost nothing), once with the caches as the
previous phase left them ("warm") and once right after copying ``--evict-bytes`` of unrelated
memory ("cold", twice the L3 by default):

- send: posting ``send(x, peer, async_op=True)``;
- recv: a blocking ``recv`` of a message that is already there (both ranks meet in a barrier
  between posting and receiving);
- wait: waiting on the send, which the peer has acknowledged (another barrier).

Three roads side by side: the communicator (``comm.send``/``comm.recv``/``Work.wait``), the shm
transport underneath it (``isend_p2p``/``irecv``/``test``: what the communicator adds is the
difference), and mpi4py (``Isend``/``Recv``/``Wait``: MPICH's C road). Where the node reads by
CMA, a fourth row, ``bare CMA read``, times one ``process_vm_readv`` of the peer's array into
``out`` as its receive and nothing else: the copy a send of ``cma_p2p_min_bytes`` or more makes
(smaller sends go through the staging pool), so the roads' receives above it are that copy plus
their own cost. Medians over ``--calls`` of rank 0's microseconds. Needs two ranks on one node.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ringcomm.core.buffers import address
from ringcomm.env import parse_size
from ringcomm.topology import last_level_cache
from ringcomm.transport.shm.cma import read_process


def roads(comm, node, world, x, out, peer: int) -> dict:
    """Each road's three phases as functions: post a send (returns its handle), receive, wait;
    ``node``: the shm transport under ``comm``."""
    from mpi4py import MPI

    def transport_recv():
        request = node.irecv(out, peer, 77)
        while not request.test():
            pass

    def transport_wait(request):
        while not request.test():
            pass
    found = {
        "communicator": (lambda: comm.send(x, peer, async_op=True), lambda: comm.recv(out, peer),
                         lambda work: work.wait()),
        "shm transport": (lambda: node.isend_p2p(x, peer, 77), transport_recv, transport_wait),
        "mpi4py (MPICH)": (lambda: world.Isend(x, peer, 0), lambda: world.Recv(out, peer, 0),
                           MPI.Request.Wait),
    }
    where = world.allgather((os.getpid(), address(x)))[peer]   # every rank joins, CMA or not
    if getattr(node, "direct_reads", None) == "cma":
        pid, at = where
        found["bare CMA read"] = (lambda: None, lambda: read_process(pid, at, address(out), out.nbytes),
                                  lambda handle: None)
    return found


def measure(phases, barrier, evict, calls: int, out, expected: float) -> list:
    """Rank-local microseconds of (send, recv, wait), one list per phase; every receive is
    checked to have brought the peer's values (``expected``) into ``out``."""
    post, recv, wait = phases
    clock = time.perf_counter_ns
    spent: list = [[], [], []]
    for _ in range(calls):
        evict()
        t = clock()
        handle = post()
        spent[0].append(clock() - t)
        out[...] = 0
        barrier()   # the peer's message is there
        evict()
        t = clock()
        recv()
        spent[1].append(clock() - t)
        if not (out == expected).all():
            raise SystemExit(f"p2p_cold.py: a receive brought wrong values ({out[:4]}, expected {expected})")
        barrier()   # the peer has acknowledged ours
        evict()
        t = clock()
        wait(handle)
        spent[2].append(clock() - t)
    return [[v / 1e3 for v in s] for s in spent]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=parse_size, default=1024, help="message size (default 1K)")
    p.add_argument("--calls", type=int, default=60, help="calls per phase and state")
    p.add_argument("--evict-bytes", type=parse_size, default=None,
                   help="bytes copied to evict the caches (default twice the L3)")
    args = p.parse_args()
    import ringcomm
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    comm = ringcomm.init()
    if comm.size != 2 or comm.local_size != 2:
        raise SystemExit("p2p_cold.py: run it on 2 ranks of one node (mpirun -n 2)")
    peer = 1 - comm.rank
    x = np.full(args.bytes // 4, comm.rank + 1, np.float32)
    out = np.empty_like(x)
    evict_bytes = args.evict_bytes or 2 * (last_level_cache() or 32 << 20)   # 32 MiB where sysfs is silent
    a = np.ones(evict_bytes // 2, np.uint8)
    b = np.empty_like(a)
    node = getattr(comm.transport, "node", None) or comm.transport
    rows = []
    for name, phases in roads(comm, node, world, x, out, peer).items():
        measure(phases, world.Barrier, lambda: None, 10, out, peer + 1)   # first calls: imports, connections
        for state, evict in (("warm", lambda: None), ("cold", lambda: np.copyto(b, a))):
            spent = measure(phases, world.Barrier, evict, args.calls, out, peer + 1)
            rows.append((name, state, [statistics.median(s) for s in spent]))
    if comm.rank == 0:
        print(f"# {args.bytes} bytes, 2 ranks, median of {args.calls} calls (rank 0), cold: after copying "
              f"{evict_bytes >> 20} MiB; direct reads: {getattr(node, 'direct_reads', 'none')}")
        print(f"{'road':<16} {'caches':<6} {'send':>8} {'recv':>8} {'wait':>8} {'sum':>8}   (us)")
        for name, state, (s, r, w) in rows:
            print(f"{name:<16} {state:<6} {s:8.1f} {r:8.1f} {w:8.1f} {s + r + w:8.1f}")
    comm.close()


if __name__ == "__main__":
    main()
