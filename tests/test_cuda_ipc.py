"""CUDA IPC: importable and honest without a GPU; the full device check where one exists."""
import subprocess
import sys
from pathlib import Path

import pytest

from ringcomm.errors import CommError
from ringcomm.transport import cuda_ipc

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(CHECK.parent))
import gpu_check  # noqa: E402
import gpu_check_lib  # noqa: E402

NO_GPU = gpu_check.gpu_missing()


def test_module_needs_no_cupy_to_import():
    assert cuda_ipc.is_device_array(object()) is False
    import numpy as np
    assert cuda_ipc.is_device_array(np.zeros(2)) is False


@pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU: the device path is tested instead")
def test_without_a_gpu_the_transport_says_why():
    with pytest.raises(CommError, match="CUDA IPC needs"):
        cuda_ipc.cupy_module()


@pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU: the device path is tested instead")
def test_gpu_check_skips_every_check_with_the_reason_without_a_gpu():
    proc = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    names = {**gpu_check_lib.RANK_CHECKS, **gpu_check_lib.SINGLE_CHECKS}
    assert [line.split(":")[0] for line in lines[:-1]] == [f"SKIP {name}" for name in names], proc.stdout
    assert all(f"no GPU: {NO_GPU}" in line for line in lines), proc.stdout
    assert lines[-1] == f"gpu_check: SKIP (no GPU: {NO_GPU})"


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif(NO_GPU is not None, reason=f"no GPU: {NO_GPU}")
def test_gpu_check_passes_on_the_gpu():
    proc = subprocess.run([sys.executable, str(CHECK), "--mib", "16", "--iters", "5"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_check: PASS" in proc.stdout, proc.stdout
