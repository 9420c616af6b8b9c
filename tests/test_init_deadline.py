"""MPI_Init's deadline (bootstrap.mpi_init_deadline, _deadline.c) on its own, in a child process:
it must fire while the main thread blocks holding the GIL, as MPI_Init does, and only then."""
import os
import subprocess
import sys
import time

import pytest

from ringcomm import UsageError, bootstrap

CHILD = """
import ctypes, sys, time
from ringcomm import bootstrap
if sys.argv[1] == "fallback":
    bootstrap.Deadline = None
with bootstrap.mpi_init_deadline(300.0):   # RINGCOMM_MPI_INIT_TIMEOUT says
    if sys.argv[2] == "block":
        ctypes.PyDLL(None).sleep(20)   # holds the GIL, as mpi4py's MPI_Init does
print("returned", flush=True)
time.sleep(1.0)   # past the deadline: a disarmed one stays quiet
print("done", flush=True)
"""


def run(kind: str, seconds: float, what: str) -> tuple:
    started = time.monotonic()
    environ = {**os.environ, "PMI_RANK": "5", "RINGCOMM_MPI_INIT_TIMEOUT": str(seconds)}
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, what], capture_output=True, text=True, timeout=60,
                          env=environ)
    return proc, time.monotonic() - started


native = pytest.mark.skipif(bootstrap.Deadline is None, reason="ringcomm._deadline was not built (no C compiler)")


@native
def test_the_deadline_ends_a_process_blocked_with_the_gil_held_and_says_why():
    proc, took = run("native", 0.5, "block")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "returned" not in proc.stdout
    assert proc.stderr.startswith("ringcomm: init on rank 5: MPI_Init has not returned after 0.5 s "
                                  "(RINGCOMM_MPI_INIT_TIMEOUT): it waits for every process of the job"), proc.stderr
    assert took < 10, took


@native
def test_a_deadline_cancelled_in_time_never_fires():
    proc, _ = run("native", 0.5, "return")
    assert proc.returncode == 0 and proc.stdout == "returned\ndone\n" and proc.stderr == "", proc


def test_without_the_compiled_piece_faulthandler_ends_the_process():
    proc, took = run("fallback", 0.5, "block")
    assert proc.returncode == 1 and proc.stderr.startswith("Timeout (0:00:00.500000)!"), (proc.stdout, proc.stderr)
    assert took < 10, took
    proc, _ = run("fallback", 0.5, "return")
    assert proc.returncode == 0 and proc.stdout == "returned\ndone\n" and proc.stderr == "", proc


@native
@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_a_deadline_refuses_a_bad_number_of_seconds(seconds):
    with pytest.raises(ValueError, match='argument "seconds" .*expected a number of seconds > 0'):
        bootstrap.Deadline(seconds, b"never written")


def test_mpi_init_waits_the_init_timeout_but_at_least_the_floor_unless_the_variable_says(monkeypatch):
    monkeypatch.delenv("RINGCOMM_MPI_INIT_TIMEOUT", raising=False)
    assert bootstrap.mpi_init_limit(2.0) == (bootstrap.MPI_INIT_FLOOR, "the init timeout, at least 30 s")
    assert bootstrap.mpi_init_limit(300.0) == (300.0, "the init timeout, at least 30 s")
    assert bootstrap.mpi_init_limit(None) == (None, "")
    monkeypatch.setenv("RINGCOMM_MPI_INIT_TIMEOUT", "2.5")
    assert bootstrap.mpi_init_limit(300.0) == (2.5, "RINGCOMM_MPI_INIT_TIMEOUT")
    assert bootstrap.mpi_init_limit(None) == (2.5, "RINGCOMM_MPI_INIT_TIMEOUT")
    monkeypatch.setenv("RINGCOMM_MPI_INIT_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="RINGCOMM_MPI_INIT_TIMEOUT='soon'"):
        bootstrap.mpi_init_limit(2.0)


STARTED = """
from mpi4py import MPI   # the program starts MPI itself, before ringcomm
from ringcomm import bootstrap
from ringcomm.init import start_mpi
def armed(*args):
    raise AssertionError("a deadline was armed around an MPI that had already started")
bootstrap.mpi_init_deadline = armed
print(start_mpi(2.0) is MPI, flush=True)
"""


def test_no_deadline_is_armed_when_the_program_had_started_mpi_itself():
    proc = subprocess.run([sys.executable, "-c", STARTED], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RINGCOMM_MPI_INIT_TIMEOUT": "soon"})
    assert proc.returncode == 0 and proc.stdout == "True\n", (proc.stdout, proc.stderr)
