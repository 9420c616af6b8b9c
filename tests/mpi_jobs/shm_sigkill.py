"""Rank 1 is SIGKILLed in the middle of a collective: nothing of the job may stay in /dev/shm.

    mpirun -n 2 python shm_sigkill.py      (exits non-zero by design; prints "owner <prefix>")
"""
import os
import signal
import sys
import time

import numpy as np

import ringcomm
from ringcomm.transport.shm import segments

comm = ringcomm.init()
t = comm.transport
node = t.node
print(f"owner {segments.PREFIX}{node.pid}-", flush=True)   # every file of this rank starts so
bucket = t.allocate(1 << 20, np.float32)            # an allocated segment
comm.all_reduce(np.ones(1 << 20, np.float32))       # through the staging pool
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
comm.all_reduce(bucket)                               # rank 0 waits here until mpirun ends it
time.sleep(30)
sys.exit(0)
