"""python -m ringcomm.tune, as a script run_mpi can launch. With TUNE_ON_ONE_CORE=1 every rank
is pinned to one core first, so that ranks outnumber the cores they share (as -n 4 on 2 cores)."""
import os
import sys

from ringcomm.selection.tune import main

if os.environ.get("TUNE_ON_ONE_CORE") == "1":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
sys.exit(main(sys.argv[1:]))
