"""Fault injection under mpirun: a rank killed (SIGKILL, SIGTERM) or stopped (SIGSTOP) at each
phase of the shm transport's life (issue 11, defect 5 and beyond).

RINGCOMM_FAULT=phase:1:signal (ringcomm/diagnostics/faults.py) sends the signal to rank 1 of 3
when it reaches the phase; tests/mpi_jobs/shm_faults.py runs every phase in order. For each case:
- the phase was reached (the victim's "ringcomm fault" line, with its wall-clock time);
- every surviving rank raised a CommError within RINGCOMM_TIMEOUT + 2 s of the fault, or mpirun
  ended the job within that time (it does so as soon as a rank dies; a stopped rank is not dead,
  so there the survivors must report, and the test kills the stopped rank afterwards); with
  "survive" the launcher keeps a dead rank's peers alive, and they must report too;
- /dev/shm (a private 64 MiB tmpfs per case) holds nothing of ringcomm's afterwards: with
  segments shared by descriptor (the default) nothing at any moment; shared by name (where
  /proc/<pid>/fd is closed to peers) nothing once the next job's sweep has run.
"""
import os
import re
import signal
import time

import pytest

import shm_sandbox
from mpi_util import survivors_kept
from ringcomm.diagnostics.faults import PHASES
from test_shm_transport import cma_denied

pytestmark = pytest.mark.mpi
TIMEOUT = 3
FAULT = re.compile(r"ringcomm fault: rank 1 pid (\d+) SIG(\w+) at (\w+) time ([\d.]+)")
# How a survivor names rank 1's death: the transport saw its process end, or a read of its memory
# by CMA found it gone first.
DEATH = re.compile(r"rank 1 \(pid \d+\)(?: is no longer running|: ESRCH \(the process is gone\))")
REPORT = re.compile(r"^rank (\d+) at ([\d.]+): (\w+)(?::(.*))?$", re.M)


class Watcher:
    """Ends a stopped victim once the survivors have reported (or long after the deadline)."""

    def __init__(self, out_dir, stop: bool):
        self.out_dir, self.stop = out_dir, stop
        self.started, self.ended = time.monotonic(), None

    def __call__(self, proc):
        if not self.stop or self.ended is not None:
            return
        reported = all((self.out_dir / f"rank{r}.txt").exists() for r in (0, 2))
        if reported or time.monotonic() - self.started > 60:
            pid = int((self.out_dir / "pid1").read_text())
            os.kill(pid, signal.SIGKILL)
            self.ended = time.time()


def inject(phase, sig, tmp_path, *mode, timeout=TIMEOUT, within=TIMEOUT + 2):
    """Run the job with the fault; each survivor's report must come ``within`` seconds of it."""
    if phase == "cma" and cma_denied():
        pytest.skip(cma_denied())
    watcher = Watcher(tmp_path, sig == "STOP")
    env = {"RINGCOMM_FAULT": f"{phase}:1:{sig}", "RINGCOMM_TIMEOUT": str(timeout),
           "RINGCOMM_SHM_POOL": "1M", "RINGCOMM_SHM_CMA_MIN": "16M"}
    launch = survivors_kept() if "survive" in mode else {}   # the launcher leaves the survivors alive
    job = shm_sandbox.run(3, "shm_faults.py", tmp_path, *mode, out_dir=tmp_path, env=env, timeout=240,
                          check=False, watch=watcher, **launch)
    ended = time.time()
    fault = FAULT.findall(job.stderr)
    assert [(s, p) for _, s, p, _ in fault] == [(sig, phase)], job.stdout + job.stderr
    at = float(fault[0][3])
    reports = {}
    for path in tmp_path.glob("rank*.txt"):
        for rank, when, kind, msg in REPORT.findall(path.read_text()):
            reports[int(rank)] = (float(when), kind, msg or "")
    assert 1 not in reports, reports   # the victim never got that far
    for rank in (0, 2):
        if rank in reports:
            when, kind, msg = reports[rank]
            assert kind.endswith("Error") and kind != "ok", (rank, kind, msg)
            assert when - at <= within, (rank, when - at, kind, msg)
        else:   # mpirun ended the job: only when a rank died, and in time
            assert sig != "STOP" and "survive" not in mode, (rank, job.stdout, job.stderr)
            assert job.returncode != 0
            assert ended - at <= TIMEOUT + 2 + 1, (ended - at, job.stderr[-2000:])   # +1: the polling here
    return job, reports


@pytest.mark.parametrize("sig", ["KILL", "TERM", "STOP"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_rank_killed_or_stopped_at_each_phase(phase, sig, tmp_path):
    job, _ = inject(phase, sig, tmp_path)
    assert job.after_job == [], job.after_job   # shared by descriptor: no name to leave behind
    assert job.after_sweep == []


@pytest.mark.parametrize("sig", ["KILL", "STOP"])
@pytest.mark.parametrize("phase", ["setup", "segment"])
def test_segments_shared_by_name_leave_nothing_after_the_next_sweep(phase, sig, tmp_path):
    job, _ = inject(phase, sig, tmp_path, "names")
    assert job.after_sweep == [], job.after_sweep
    for name in job.after_job:   # what a killed job can leave: files of processes now dead
        assert re.match(r"ringcomm-\d+-[0-9a-f]+-[0-9a-f]+-\d+$", name), name


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
@pytest.mark.parametrize("phase", PHASES)
def test_the_survivors_of_a_killed_rank_raise_within_the_timeout(phase, sig, tmp_path):
    """With the launcher's clean-up off, a dead rank's peers live on: each must raise, in time,
    whatever phase the rank died in (the test above lets mpirun end the job instead)."""
    inject(phase, sig, tmp_path, "survive")


@pytest.mark.parametrize("phase", [p for p in PHASES if p != "setup"])
def test_the_survivors_of_a_killed_rank_raise_long_before_the_timeout_naming_its_death(phase, tmp_path):
    """Once set-up has given the node's ranks each other's pids, a stalled wait asks whether its
    peer's process still runs (transport/shm): the survivors raise within a second or two, not
    at a 60 s timeout, and say that the rank is no longer running (or that a read of its memory
    found it gone)."""
    _, reports = inject(phase, "KILL", tmp_path, "survive", timeout=60, within=3)
    for rank in (0, 2):
        when, kind, msg = reports[rank]
        assert kind in ("PeerAbortedError", "CommError") and DEATH.search(msg), (rank, kind, msg)
