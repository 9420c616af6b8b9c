"""A small /dev/shm (Docker's default 64 MiB): never a SIGBUS (issue 11, defect 1).

Each job runs in its own tmpfs (shm_sandbox.py). Before segments reserved their pages with
posix_fallocate, every one of these jobs died of "Bus error" at the first write to a page the
tmpfs could not supply; now they complete, falling back to paths that need less shared memory
(a smaller staging pool, private memory for ``allocate``) and saying so once at
RINGCOMM_DEBUG=info, or, when not even the control segments fit, every rank raises a CommError
that says what was needed, what is free and how to fix it.
"""
import re

import pytest

import shm_sandbox

pytestmark = pytest.mark.mpi


def ok(out: str, n: int, scenario: str) -> list:
    lines = re.findall(rf"rank (\d+) ok {scenario}([^\n]*?)(?=rank \d+ |\n|$)", out)
    assert sorted(int(r) for r, _ in lines) == list(range(n)), out
    return [detail for _, detail in lines]


def run(n, scenario, tmp_path, size="64m", **env):
    job = shm_sandbox.run(n, "shm_small.py", scenario, out_dir=tmp_path, size=size,
                          env={"RINGCOMM_DEBUG": "info", **env}, timeout=300)
    assert "Bus error" not in job.stdout + job.stderr
    assert job.after_job == [], job.after_job   # nothing of ringcomm's left, even before a sweep
    return job


def test_four_ranks_all_reduce_16_mib_through_a_smaller_pool(tmp_path):
    job = run(4, "allreduce16", tmp_path)
    shares = {int(d.split()[-1]) for d in ok(job.stdout, 4, "allreduce16")}
    assert max(shares) < 4 << 20, shares   # 4 MiB per peer would not fit beside the others
    said = re.findall(r"rank \d: /dev/shm has [\d.]+ MiB free of 64.0 MiB for the 4 ranks of this node; "
                      r"staging pool share per peer [\d.]+ MiB instead of 4.0 MiB", job.stderr)
    assert 1 <= len(said) <= 4, job.stderr    # once per rank that settled for less


def test_64_mib_all_reduce_without_cma(tmp_path):
    ok(run(2, "allreduce64", tmp_path, RINGCOMM_SHM_CMA="0").stdout, 2, "allreduce64")


def test_allocate_larger_than_dev_shm_falls_back_to_private_memory_on_every_rank(tmp_path):
    job = run(2, "allocate100", tmp_path)
    assert ok(job.stdout, 2, "allocate100") == [" shared=False"] * 2
    said = re.findall(r"rank (\d): /dev/shm is too small for allocate\(104857600\): 100\.0 MiB needed per "
                      r"rank, 200\.0 MiB for the 2 ranks of this node, [\d.]+ MiB free of 64\.0 MiB; using "
                      r"private memory instead, on every rank of the node; give the job more shared memory: "
                      r"`docker run --shm-size=1g`", job.stderr)
    assert sorted(said) == ["0", "1"], job.stderr


def test_ddp_on_a_21m_parameter_mlp(tmp_path):
    ok(run(2, "ddp21m", tmp_path).stdout, 2, "ddp21m")


def test_no_room_for_control_segments_is_a_comm_error_on_every_rank(tmp_path):
    # 6 MiB: MPICH's own segments fit (with less, MPICH itself dies of SIGBUS before ringcomm
    # runs), four control segments of 1.1 MiB do not all fit beside them.
    job = run(4, "control", tmp_path, size="6m")
    said = re.findall(r"rank (\d) CommError: shm transport on rank \1: /dev/shm is too small for its control "
                      r"segment and staging pool: [\d.]+ MiB needed per rank, [\d.]+ MiB for the 4 ranks of "
                      r"this node, [\d.]+ MiB free of 6\.0 MiB; give the job more shared memory", job.stdout)
    assert sorted(said) == ["0", "1", "2", "3"], job.stdout
