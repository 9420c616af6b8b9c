"""barrier: no rank leaves before every rank has entered."""
import time

import pytest

from ringcomm import algorithms
from ringcomm.testing import run_threads


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("algorithm", algorithms.names("barrier") + [None])
def test_barrier_waits_for_the_last_rank(algorithm, size):
    def rank_fn(comm):
        stamps = []
        for late in range(size):            # each round, a different rank arrives late
            if comm.rank == late:
                time.sleep(0.02)
            entered = time.monotonic()
            comm.barrier(algorithm=algorithm)
            stamps.append((entered, time.monotonic()))
        return stamps
    results = run_threads(size, rank_fn)
    for round_ in range(size):
        last_entry = max(results[r][round_][0] for r in range(size))
        first_exit = min(results[r][round_][1] for r in range(size))
        assert first_exit >= last_entry, f"round {round_}: a rank left the barrier before rank {round_} entered"
