"""Waiting, in a test job, for closed communicators to go back to MPI.

A close posts a nonblocking exchange (transport/mpi.py retire_communicator) and the freeing
happens in a later ``collect_retired`` that finds it done, which may want more of MPI's progress
than a barrier gives. Call after a barrier, so that every rank has posted its exchanges.
"""
import time
from typing import Callable

from ringcomm.transport import mpi as mpi_transport


def collect(until: Callable[[], bool], limit: float = 10.0) -> None:
    """Collect retiring communicators until ``until()`` holds, none is left retiring, or ``limit``
    seconds pass. An exchange whose partner met something else never finishes, so a job that
    expects some frees waits for those, not for an empty list."""
    deadline = time.monotonic() + limit
    while not until() and mpi_transport._retiring and time.monotonic() < deadline:
        mpi_transport.collect_retired()
        time.sleep(0.001)
