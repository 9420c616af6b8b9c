"""The soak, short: random collectives on 4 ranks (2 cores here) inside a 64 MiB /dev/shm, every
result checked, bitwise equal across ranks, nothing left in /dev/shm. ``make soak`` runs the
long one (docs/reliability.md has its result)."""
import re

import pytest

import shm_sandbox

pytestmark = pytest.mark.mpi


def test_soak_random_collectives_in_a_small_dev_shm(tmp_path):
    calls = 1500
    job = shm_sandbox.run(4, "soak.py", calls, 20251130, 16 << 20, out_dir=tmp_path, size="64m",
                          env={"RINGCOMM_TIMEOUT": "120"}, timeout=600)
    done = re.findall(rf"rank (\d): {calls} collectives checked, 0 wrong", job.stdout)
    assert sorted(done) == ["0", "1", "2", "3"], job.stdout + job.stderr
    assert job.after_job == [], job.after_job
