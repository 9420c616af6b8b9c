import pytest

from mpi_util import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_under_mpirun(n):
    out = run_mpi(n, "smoke_allreduce.py").stdout
    assert sorted(line for line in out.splitlines() if line.endswith("ok")) == [f"rank {r} ok" for r in range(n)]
