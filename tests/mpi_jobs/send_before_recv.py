"""Both ranks send before they receive, which MPI calls unsafe. A send copied into the staging
pool completes at once, so small messages pass. One read out of the sender's array (by CMA, or
through a pipe where CMA is off) waits for its receiver: the timeout must say so on both ranks.

    RINGCOMM_SHM_CMA_P2P_MIN=64K RINGCOMM_TIMEOUT=2 mpirun -n 2 python send_before_recv.py
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import time

import numpy as np

import ringcomm
from ringcomm.errors import CommTimeoutError

comm = ringcomm.init()
peer = 1 - comm.rank
node = comm.transport.node

small = np.full(1000, comm.rank, np.float32)
got = np.empty_like(small)
comm.send(small, peer)
comm.recv(got, peer)
assert (got == peer).all(), got

big = np.full(1 << 17, comm.rank, np.float32)   # 512 KiB
assert node.reads_in_place(big.nbytes), (node.cma_p2p_min_bytes, node.direct_reads)
started = time.monotonic()
try:
    comm.send(big, peer)
except CommTimeoutError as err:
    took = time.monotonic() - started
    assert f"rank {peer} did not receive it" in str(err) and "post the recv first" in str(err), str(err)
    assert took < 10, took
    print(f"rank {comm.rank}: timed out in {took:.1f} s, saying why", flush=True)
else:
    raise AssertionError("a send read out of the caller's array completed with no recv posted")
