"""Imported first by the shm jobs: an uncaught error on one rank ends the whole job at once.

Without it the failing rank's exit leaves its peers blocked in MPI and the test waits for
mpirun's timeout instead of showing the error.
"""
import sys
import traceback

from mpi4py import MPI


def _abort_job(kind, value, tb):
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


sys.excepthook = _abort_job
