"""Launch real ``mpirun`` jobs from pytest, the way users launch ringcomm."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "mpi_jobs"


def mpirun_path() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def survivors_kept(*wrapper: str) -> dict:
    """``run_mpi``'s (and shm_sandbox.run's) launch that keeps a dead rank's peers alive: the
    launcher's clean-up off, each rank in a session of its own (MPICH's launcher killed some
    survivors' process groups even with the clean-up off), then ``wrapper``. Skips where
    setsid(1) is missing."""
    if shutil.which("setsid") is None:
        pytest.skip("setsid(1) is not installed")
    return {"mpirun_args": ["-disable-auto-cleanup"], "wrapper": ["setsid", "-w", *wrapper]}


def mpi_env(env: dict | None = None) -> dict:
    """The environment of a job: this checkout first on PYTHONPATH, a 60 s RINGCOMM_TIMEOUT
    unless the caller's environment sets one, then ``env``."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    full_env.setdefault("RINGCOMM_TIMEOUT", "60")
    full_env.update(env or {})
    return full_env


def run_mpi(n: int, script, *args, env: dict | None = None, timeout: float = 180,
            check: bool = True, mpirun_args=(), wrapper=()) -> subprocess.CompletedProcess:
    """Run ``mpirun [mpirun_args] -n n [wrapper] python script args`` and return the finished
    process.

    ``script`` is a path or a file name under tests/mpi_jobs. With ``check`` a non-zero exit
    fails the test and shows both streams.
    """
    path = Path(script)
    if not path.is_absolute():
        path = JOBS / path
    full_env = mpi_env(env)
    cmd = [mpirun_path(), *mpirun_args, "-n", str(n), *wrapper, sys.executable, str(path), *map(str, args)]
    try:
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc
