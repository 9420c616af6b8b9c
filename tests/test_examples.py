"""The examples users run first (`make demo`) train, keep replicas identical, and compare backends."""
import re

import pytest

from mpi_util import ROOT, run_mpi

EXAMPLES = ROOT / "examples"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", [[], ["--torch-ddp"]], ids=["ddp", "torch-ddp"])
def test_train_runs_and_ends_with_identical_replicas(mode):
    proc = run_mpi(2, EXAMPLES / "train.py", "--steps", "6", "--log-every", "5", *mode, timeout=180)
    assert "replicas identical" in proc.stdout, proc.stdout
    assert re.search(r"step +5 +loss \d", proc.stdout), proc.stdout


@pytest.mark.mpi
def test_compare_backends_prints_every_backend_side_by_side():
    proc = run_mpi(2, EXAMPLES / "compare_backends.py", "--steps", "5", "--dim", "32", timeout=180)
    rows = {m.group(1): m for m in re.finditer(r"^(ringcomm|mpi|gloo) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)x",
                                                proc.stdout, re.M)}
    assert set(rows) == {"ringcomm", "mpi", "gloo"}, proc.stdout
    assert float(rows["ringcomm"].group(6)) == 1.0
    # The same seed, data and steps on every backend: the same training, whichever library reduced.
    losses = {m.group(1): m.group(2) for m in re.finditer(r"^(ringcomm|mpi|gloo) .*x +([\d.]+)$", proc.stdout, re.M)}
    assert len(set(losses.values())) == 1, proc.stdout
