import re

import pytest

from mpi_util import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_under_mpirun(n):
    out = run_mpi(n, "smoke_allreduce.py").stdout
    # Ranks share one stdout pipe, so lines may interleave: look for each report, not each line.
    assert sorted(map(int, re.findall(r"rank (\d+) ok", out))) == list(range(n))


@pytest.mark.mpi
def test_calls_of_2_31_elements_or_more_complete_on_the_default_road():
    """2 GiB of int8 and more: the window stamp carried the count in 31 bits of an int64, and a
    count of 2**31 stopped every window algorithm (the default at that size) with a ValueError."""
    out = run_mpi(2, "large_counts.py", timeout=300).stdout
    ran = re.findall(r"rank (\d+) ok: (\w+) (\w+)", out)
    assert sorted(int(r) for r, _, _ in ran) == [0, 1], out
    from ringcomm import algorithms
    windows = set(algorithms.window_names("all_reduce")) | set(algorithms.window_names("broadcast"))
    assert all(a in windows and b in windows for _, a, b in ran), ran   # the rounds that carry the stamp
