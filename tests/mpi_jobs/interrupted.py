"""A rank interrupted in the middle of a call (Ctrl-C in a notebook: an exception raised by a
signal handler while the call waits for a late peer), which then calls again.

Before, a blocking recv retried after Ctrl-C silently took the sender's next message (the first
landed later in the abandoned buffer), and a peer of an interrupted collective waited out its
timeout. Now the interrupted rank's communicator is broken: the KeyboardInterrupt propagates,
every later call raises CommError saying the call was interrupted, and the peers raise
PeerAbortedError naming it within seconds, never a wrong result. Each case on a fresh
communicator: a blocking recv (the peer in a barrier, then in a recv of its own); an all_reduce
on a buffer seen before (the remembered road on "ringcomm"); a persistent all_reduce; a ring
all_reduce (a schedule, "ringcomm" only). On gloo the peer's abandoned receive, which gloo
cannot withdraw, holds its close for the bounded joins of its thread (10 s in all).

    mpirun -n 2 python interrupted.py [backend]

Prints "check CASE ok" per case and "rank R done" on each rank.
"""
import signal
import sys
import time

import numpy as np

import ringcomm
from job_exit import exit_now

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "ringcomm"
LATE = 0.5   # rank 1 enters each call this late; rank 0 is interrupted 0.1 s into its own


def interrupt(signum, frame):
    raise KeyboardInterrupt("Ctrl-C")


signal.signal(signal.SIGALRM, interrupt)


def case(name, call, peer_call):
    comm = ringcomm.init(backend=BACKEND, timeout=60)
    x = np.ones(1024, np.float32)
    for _ in range(3):   # remembered from the third call on (persistent.py)
        comm.all_reduce(x)
    plan = comm.all_reduce_init(x)
    x[:] = comm.rank + 1
    comm.barrier()
    start = time.monotonic()
    if comm.rank == 0:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        try:
            call(comm, x, plan)
            raise AssertionError(f"{name}: rank 0 was not interrupted")
        except KeyboardInterrupt:
            pass
        try:
            comm.all_reduce(np.ones(4, np.float32))
            raise AssertionError(f"{name}: a call after the interruption went through")
        except ringcomm.CommError as err:
            assert "interrupted by KeyboardInterrupt" in str(err), err
    else:
        time.sleep(LATE)
        try:
            result = peer_call(comm, x, plan)
            if result is not None:   # its data was all there: it must be the right sum
                assert (x == 3).all(), f"{name}: rank 1 returned {x[:4]}"
            comm.barrier()
            raise AssertionError(f"{name}: rank 1 never heard of the interruption")
        except ringcomm.PeerAbortedError as err:
            assert "rank 0 gave up" in str(err) and "interrupted by KeyboardInterrupt" in str(err), err
        waited = time.monotonic() - start - LATE
        assert waited < 10, f"{name}: rank 1 heard of it after {waited:.1f} s"
    print(f"rank {comm.rank} check {name} ok", flush=True)
    return comm


kept = []   # broken communicators are closed at exit, together
kept.append(case("recv", lambda comm, x, plan: comm.recv(x, 1), lambda comm, x, plan: None))
# the peer blocked in a receive of its own that only the notice can end (the reference
# backends' receives waited out the timeout before they asked for it)
kept.append(case("recv_both", lambda comm, x, plan: comm.recv(x, 1, tag=5),
                 lambda comm, x, plan: comm.recv(x, 0, tag=9)))
kept.append(case("all_reduce", lambda comm, x, plan: comm.all_reduce(x),
                 lambda comm, x, plan: comm.all_reduce(x)))
kept.append(case("persistent", lambda comm, x, plan: plan(), lambda comm, x, plan: plan()))
if BACKEND == "ringcomm":
    kept.append(case("ring", lambda comm, x, plan: comm.all_reduce(x, algorithm="ring"),
                     lambda comm, x, plan: comm.all_reduce(x, algorithm="ring")))
rank = kept[0].rank
for comm in kept:
    comm.close()
print(f"rank {rank} done", flush=True)
exit_now()
