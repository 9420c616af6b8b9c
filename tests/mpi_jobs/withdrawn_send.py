"""Rank 0 posts two async sends, a small one (copied into the staging pool) and an 8 MiB one
(read in place by its receiver, by CMA), closes without waiting for them and exits; rank 1
receives both a second later (an erroneous program: a send must be received before its sender
closes). The small one must arrive exact. The large one was withdrawn by close: its receive
must either get exact bytes (the sender's process still held them) or raise CommError naming
the receive and rank 0's close; before round forty-one the error named neither the call nor
the close ("cannot read 8388608 bytes at 0x... of rank 0: EFAULT").

    mpirun -n 2 python withdrawn_send.py

Rank 1 prints "withdrawn-send ok: <what the large receive got>"; exits 1 otherwise.
"""
import re
import sys
import time

import numpy as np

import ringcomm

comm = ringcomm.init(timeout=10)
SMALL, LARGE = 256, 1 << 21
if comm.rank == 0:
    comm.send(np.arange(SMALL, dtype=np.float32), 1, tag=1, async_op=True)
    comm.send(np.arange(LARGE, dtype=np.float32), 1, tag=2, async_op=True)
    comm.close()
    sys.exit(0)
time.sleep(1.0)
small, large = np.zeros(SMALL, np.float32), np.zeros(LARGE, np.float32)
comm.recv(small, 0, tag=1)
problems = [] if np.array_equal(small, np.arange(SMALL)) else ["the small send arrived wrong"]
try:
    comm.recv(large, 0, tag=2)
    got = "exact bytes" if np.array_equal(large, np.arange(LARGE)) else None
    if got is None:
        problems.append("the large send arrived WRONG")
except ringcomm.CommError as err:
    got = str(err)
    if not re.match(r"recv p2p#\d+ from rank 0 \(tag 2\) on rank 1: .*rank 0 has closed its communicator", got):
        problems.append(f"the large receive raised {err!r}")
comm.close()
print("\n".join(problems) if problems else f"withdrawn-send ok: {got}", flush=True)
sys.exit(1 if problems else 0)
