"""run_threads: results in rank order; a failing rank is named and never leaves the others hanging."""
import time

import numpy as np
import pytest

from ringcomm.testing import run_threads


def test_results_in_rank_order():
    assert run_threads(6, lambda comm, k: comm.rank * k, 10) == [0, 10, 20, 30, 40, 50]


def test_exception_names_the_rank_and_releases_the_others():
    def rank_fn(comm):
        if comm.rank == 2:
            raise KeyError("boom")
        comm.all_reduce(np.ones(4))      # would wait forever for rank 2
    start = time.monotonic()
    with pytest.raises(KeyError, match="boom") as info:
        run_threads(4, rank_fn, timeout=60)
    assert time.monotonic() - start < 10
    assert any("rank 2" in note for note in getattr(info.value, "__notes__", [])) or "rank 2" in str(info.value)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        run_threads(0, lambda comm: None)
