"""ringcomm.init() on ranks launched with different settings (an MPMD line sets a variable on some
ranks only): prints what init raised on this rank, one line, and exits 0 if it was a UsageError.

    mpirun -n 1 env RINGCOMM_ALGO=ring python settings_disagree.py : -n 2 python settings_disagree.py
"""
import sys
import time

import ringcomm

started = time.monotonic()
try:
    comm = ringcomm.init()
except ringcomm.UsageError as err:
    print(f"UsageError after {time.monotonic() - started:.1f} s: {err}", flush=True)
    sys.exit(0)
print(f"rank {comm.rank}: init succeeded", flush=True)
sys.exit(1)
