"""Run an mpirun job in its own small /dev/shm, as in a Docker container (64 MiB by default).

    unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec ...'

The job, MPICH included, sees only that tmpfs; afterwards the script records what the job left
in it (``after_job``), then runs what the next job's ``ringcomm.init`` would run first (the sweep
of files whose owner is dead, segments.py) and records again (``after_sweep``). Needs root (or
user namespaces) for the mount; where it is refused, ``unavailable()`` says why and the tests
that need it skip with that reason.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

from mpi_util import JOBS, mpi_env, mpirun_path

_SCRIPT = r"""
mount -t tmpfs -o size="$1" tmpfs /dev/shm || exit 97
out=$2; shift 2
"$@"; rc=$?
ls -A /dev/shm > "$out/shm-after-job"
"$PYTHON_FOR_SWEEP" -c 'from ringcomm.transport.shm import segments; segments.sweep()'
ls -A /dev/shm > "$out/shm-after-sweep"
exit $rc
"""


@functools.lru_cache(maxsize=None)
def unavailable() -> Optional[str]:
    """Why no private /dev/shm can be mounted here, or None."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                          capture_output=True, text=True)
    if proc.returncode:
        return f"cannot mount a private /dev/shm (unshare -m): {proc.stderr.strip() or proc.returncode}"
    return None


def require() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)


@dataclass
class Sandboxed:
    returncode: int
    stdout: str
    stderr: str
    after_job: list = field(default_factory=list)     # ringcomm files the job left in /dev/shm
    after_sweep: list = field(default_factory=list)   # ... once the next job's sweep has run
    mpich_after_job: list = field(default_factory=list)


def _ringcomm(listing: Path) -> list:
    names = listing.read_text().split() if listing.exists() else []
    return sorted(n for n in names if n.startswith("ringcomm-"))


def run(n: int, script, *args, out_dir: Path, size: str = "64m", env: Optional[dict] = None,
        timeout: float = 180, check: bool = True,
        watch: Optional[Callable[[subprocess.Popen], None]] = None, poll: float = 0.2,
        mpirun_args: Sequence[str] = (), wrapper: Sequence[str] = ()) -> Sandboxed:
    """``mpirun [mpirun_args] -n n [wrapper] python script args`` inside a fresh ``size`` tmpfs
    at /dev/shm.

    ``watch(proc)`` (optional) is called every ``poll`` seconds while the job runs: fault tests
    use it to end ranks they stopped. With ``check`` a non-zero exit fails the test.
    """
    require()
    path = Path(script)
    if not path.is_absolute():
        path = JOBS / path
    full_env = mpi_env(env)
    full_env["PYTHON_FOR_SWEEP"] = sys.executable
    cmd = ["unshare", "-m", "sh", "-c", _SCRIPT, "sh", size, str(out_dir),
           mpirun_path(), *mpirun_args, "-n", str(n), *wrapper, sys.executable, str(path), *map(str, args)]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=JOBS.parent.parent)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and watch is not None and time.monotonic() < deadline:
        watch(proc)
        time.sleep(poll)
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd[6:])} in a {size} /dev/shm did not finish in {timeout} s\n"
                    f"stdout:\n{stdout}\nstderr:\n{stderr}")
    if proc.returncode == 97:
        pytest.skip(f"cannot mount a private /dev/shm: {stderr.strip()}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd[6:])} in a {size} /dev/shm exited {proc.returncode}\n"
                    f"stdout:\n{stdout}\nstderr:\n{stderr}")
    after_job = out_dir / "shm-after-job"
    mpich = sorted(x for x in (after_job.read_text().split() if after_job.exists() else []) if x.startswith("mpich"))
    return Sandboxed(proc.returncode, stdout, stderr, _ringcomm(after_job), _ringcomm(out_dir / "shm-after-sweep"),
                     mpich)
