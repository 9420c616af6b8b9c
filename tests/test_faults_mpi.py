"""Fault injection under real mpirun: what every rank raised, and how fast."""
import re
import time
from pathlib import Path

import pytest

from mpi_util import run_mpi

pytestmark = pytest.mark.mpi
LINE = re.compile(r"^rank (\d+) after ([\d.]+)s: (\w+)(?::(.*))?$", re.M)


def outcomes(stdout):
    return {int(r): (float(t), kind, msg or "") for r, t, kind, msg in LINE.findall(stdout)}


def shm_entries():
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.iterdir() if "ringcomm" in p.name) if shm.exists() else []


@pytest.fixture(autouse=True)
def no_shm_leaks():
    before = shm_entries()
    yield
    assert shm_entries() == before, "shared-memory segments left behind in /dev/shm"


@pytest.mark.parametrize("detail", [False, True], ids=["default", "debug-detail"])
@pytest.mark.parametrize("scenario,field", [("extra", "count"), ("dtype", "dtype"), ("skip", "collective")])
def test_mismatch_raises_on_every_rank_within_seconds(scenario, field, detail):
    env = {"RINGCOMM_TIMEOUT": "20"}
    if detail:
        env["RINGCOMM_DEBUG"] = "detail"
    seen = outcomes(run_mpi(3, "faults.py", scenario, 100_000, env=env).stdout)
    assert sorted(seen) == [0, 1, 2]
    for rank, (took, kind, msg) in seen.items():
        assert kind in ("MismatchError", "PeerAbortedError"), (rank, kind, msg)
        assert took < 5.0, (rank, took)   # detection itself takes ~0.1 s; slack for a loaded CI box
    mismatches = [msg for _, kind, msg in seen.values() if kind == "MismatchError"]
    assert mismatches and all(field in m for m in mismatches), mismatches
    if detail:   # every rank names the odd rank itself
        assert all(kind == "MismatchError" and "ranks [1]" in msg for _, kind, msg in seen.values())


def test_absent_rank_makes_the_others_time_out_naming_it():
    proc = run_mpi(3, "faults.py", "absent", env={"RINGCOMM_TIMEOUT": "2"})
    seen = outcomes(proc.stdout)
    assert seen[1][1] == "ok"
    for rank in (0, 2):
        took, kind, msg = seen[rank]
        assert kind == "CommTimeoutError" and 2.0 <= took < 4.0, seen[rank]
        assert "all_reduce #1" in msg and "waiting to" in msg
    assert "timed out after 2 s waiting to receive from rank 1" in proc.stdout
    assert proc.stderr.count("ringcomm flight recorder") == 2


def test_sigkilled_rank_ends_the_job_nonzero_within_seconds():
    start = time.monotonic()
    proc = run_mpi(3, "faults.py", "kill", env={"RINGCOMM_TIMEOUT": "60"}, check=False, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - start < 30


def test_soak_ten_thousand_random_collectives():
    out = run_mpi(3, "soak.py", 10_000, 7, timeout=400).stdout
    assert out.count("10000 collectives checked") == 3, out
