"""python -m ringcomm.tune, as a script run_mpi can launch."""
import sys

from ringcomm.selection.tune import main

sys.exit(main(sys.argv[1:]))
