"""The end of a test job that collects what went wrong on each rank: rank 0 prints every rank's
problems, or ``ok_line`` when there are none, and every rank exits 1 if any rank had one."""
import sys

from mpi4py import MPI


def report(problems: list, ok_line: str) -> None:
    every = MPI.COMM_WORLD.allgather(problems)
    wrong = [p for ps in every for p in ps]
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("\n".join(wrong) if wrong else ok_line, flush=True)
    sys.exit(1 if wrong else 0)
