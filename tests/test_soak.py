"""The soak, short: random calls (every collective, send/recv, sub-communicators, uneven counts,
reused buffers: tests/mpi_jobs/soak.py) on 4 ranks (2 cores here) inside a 64 MiB /dev/shm,
every result checked, bitwise equal across each group's ranks, nothing left in /dev/shm; then
the same on 3 ranks split over pretend nodes, on the reference backends, and through
torch.distributed (under mpirun and torchrun). ``make soak`` runs the long one
(docs/reliability.md has its result)."""
import re

import pytest

import shm_sandbox
from mpi_util import run_mpi

pytestmark = pytest.mark.mpi


def _checked(stdout: str, calls: int) -> list:
    return sorted(re.findall(rf"rank (\d): {calls} collectives checked, 0 wrong", stdout))


def test_soak_random_calls_in_a_small_dev_shm(tmp_path):
    calls = 3000
    job = shm_sandbox.run(4, "soak.py", calls, 20251130, 16 << 20, out_dir=tmp_path, size="64m",
                          env={"RINGCOMM_TIMEOUT": "120"}, timeout=600)
    assert _checked(job.stdout, calls) == ["0", "1", "2", "3"], job.stdout + job.stderr
    assert job.after_job == [], job.after_job


def test_soak_over_two_pretend_nodes():
    """Ranks 0 and 1 on one node, rank 2 on another: the shm and MPI routes in one communicator,
    and sub-communicators that stay on one node or span both."""
    calls = 1500
    node_id = 'RINGCOMM_NODE_ID=n$((PMI_RANK * 2 / 3)) exec "$0" "$@"'
    job = run_mpi(3, "soak.py", calls, 20261207, 4 << 20, env={"RINGCOMM_TIMEOUT": "120"}, timeout=600,
                  wrapper=("sh", "-c", node_id))
    assert _checked(job.stdout, calls) == ["0", "1", "2"], job.stdout + job.stderr


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_soak_on_a_reference_backend(backend):
    calls = 800
    job = run_mpi(3, "soak.py", calls, 7, 4 << 20, env={"RINGCOMM_TIMEOUT": "120", "RINGCOMM_BACKEND": backend},
                  timeout=600)
    assert _checked(job.stdout, calls) == ["0", "1", "2"], job.stdout + job.stderr


@pytest.mark.parametrize("backend", ["ringcomm", "gloo"])
def test_soak_through_torch_distributed(backend):
    """Random dist.* calls (mpi_jobs/soak_torch.py) on backend "ringcomm"; on "gloo" the same
    script shows that its references are right."""
    calls = 1500 if backend == "ringcomm" else 300
    job = run_mpi(3, "soak_torch.py", calls, 20261207, backend, env={"RINGCOMM_TIMEOUT": "120"}, timeout=600)
    done = sorted(re.findall(rf"rank (\d): {calls} calls checked, 0 wrong \({backend}\)", job.stdout))
    assert done == ["0", "1", "2"], job.stdout + job.stderr


def test_soak_through_torch_distributed_under_torchrun():
    """The torch soak where torchrun's store, not MPI, brings the ranks together."""
    from test_torch_c10d import torchrun
    calls = 1000
    proc = torchrun(3, "soak_torch.py", 300, args=(calls, 20261208, "ringcomm"))
    done = sorted(re.findall(rf"rank (\d): {calls} calls checked, 0 wrong \(ringcomm\)", proc.stdout))
    assert proc.returncode == 0 and done == ["0", "1", "2"], (proc.stdout + proc.stderr)[-6000:]
