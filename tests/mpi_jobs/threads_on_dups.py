"""Several threads per rank, each on a communicator of its own (dups of the world and a split by
parity, each dup'd again by its thread, all threads at once), making blocking collectives and
send/recv at the same time: over shared memory they
share one transport, its staging pool, rings and windows, and must not see each other's
messages. Every result is checked exactly.

    mpirun -n N python threads_on_dups.py CALLS SEED [nodes]

``nodes``: ranks pretend to sit on two nodes (even ranks on one, odd on the other), so the parity
split is a node's own group, with its own window, beside dups that span both nodes. Prints
"threads-on-dups: T threads x CALLS calls, 0 wrong" on rank 0; exits 1 if anything went wrong.
"""
import os
import sys
import threading

CALLS, SEED = int(sys.argv[1]), int(sys.argv[2])
if "nodes" in sys.argv[3:]:
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{int(os.environ.get('PMI_RANK', 0)) % 2}"

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402

world = ringcomm.init()
RANK = world.rank
COMMS = [world.dup() for _ in range(3)] + [world.split(RANK % 2)]   # made in one order on every rank
COUNTS = (0, 1, 3, 17, 1000, 4099, 65537, 300001)
KINDS = ("all_reduce", "all_gather", "broadcast", "send_recv", "all_to_all", "reduce_scatter")
failures: list = []
GATE = threading.Barrier(len(COMMS))


def values(rank, count, call):
    return (np.arange(count, dtype=np.int64) * (rank + 3) + call) % 1000


def one_call(comm, thread, call, kind, count) -> bool:
    """Issue one call on ``comm``; whether its result is exact."""
    n, me = comm.size, comm.rank
    if kind == "all_reduce":
        x = values(me, count, call).astype(np.float32)
        comm.all_reduce(x)
        return np.array_equal(x, sum(values(r, count, call) for r in range(n)).astype(np.float32))
    if kind == "all_gather":
        out = np.empty(count * n, np.int32)
        comm.all_gather(out, values(me, count, call).astype(np.int32))
        return np.array_equal(out, np.concatenate([values(r, count, call) for r in range(n)]).astype(np.int32))
    if kind == "broadcast":
        root = call % n
        x = values(me, count, call).astype(np.float64)
        comm.broadcast(x, root)
        return np.array_equal(x, values(root, count, call).astype(np.float64))
    if kind == "send_recv":
        x, out = values(me, count, call).astype(np.int32), np.empty(count, np.int32)
        work = comm.send(x, (me + 1) % n, tag=thread, async_op=True)
        comm.recv(out, (me - 1) % n, tag=thread)
        work.wait()
        return np.array_equal(out, values((me - 1) % n, count, call).astype(np.int32))
    if kind == "all_to_all":
        x = np.concatenate([values(me * n + j, count, call) for j in range(n)]).astype(np.float32)
        out = np.empty_like(x)
        comm.all_to_all(out, x)
        return np.array_equal(out, np.concatenate([values(j * n + me, count, call) for j in range(n)]).astype(np.float32))
    x = np.concatenate([values(me, count, call) + j for j in range(n)])
    out = np.empty(count, np.int64)
    comm.reduce_scatter(out, x)
    return np.array_equal(out, sum(values(r, count, call) + me for r in range(n)))


def run(thread: int) -> None:
    # Every thread then dups its own communicator at the same moment (one dup per thread is the
    # README's recipe): concurrent splits once offered the same free window slot, and two
    # communicators' one-shot rounds read each other's payloads.
    GATE.wait()
    comm = COMMS[thread].dup()
    draw = np.random.default_rng((SEED, thread))   # the same sequence on every member
    for call in range(CALLS):
        kind, count = str(draw.choice(KINDS)), int(draw.choice(COUNTS))
        if kind == "send_recv" and comm.size == 1:
            kind = "all_reduce"
        try:
            if not one_call(comm, thread, call, kind, count):
                failures.append(f"thread {thread} call {call} {kind} x{count}: wrong result")
        except Exception as err:
            failures.append(f"thread {thread} call {call} {kind} x{count}: {type(err).__name__}: {err}")
            return


threads = [threading.Thread(target=run, args=(t,)) for t in range(len(COMMS))]
for t in threads:
    t.start()
for t in threads:
    t.join()
for line in failures[:5]:
    print(f"rank {RANK}: {line}", flush=True)
total = np.array([len(failures)], np.int64)
world.all_reduce(total)
if RANK == 0:
    print(f"threads-on-dups: {len(COMMS)} threads x {CALLS} calls, {int(total[0])} wrong", flush=True)
sys.exit(1 if total[0] else 0)
