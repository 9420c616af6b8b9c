import re

import pytest

from mpi_util import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_under_mpirun(n):
    out = run_mpi(n, "smoke_allreduce.py").stdout
    # Ranks share one stdout pipe, so lines may interleave: look for each report, not each line.
    assert sorted(map(int, re.findall(r"rank (\d+) ok", out))) == list(range(n))
