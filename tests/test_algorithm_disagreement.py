"""Ranks that pass different ``algorithm=`` to one call (a program bug ringcomm cannot prevent,
since the argument is per rank) must never take each other's messages as their own. Every
message carries its schedule algorithm in its tag (Envelope.algorithm), every window stamp its
window algorithm (tests/test_one_shot.py): the ranks raise, and no rank returns wrong data.

Before the tag carried it, ring against recursive_doubling on 2 ranks (one element) and
recursive_doubling against rabenseifner on 3 returned a wrong sum on some ranks, silently."""
import itertools

import numpy as np
import pytest

from ringcomm import CommError, MismatchError, algorithms
from thread_util import outcomes


def values(rank, count):
    return (np.arange(count, dtype=np.float64) + 1) * (rank + 1) + rank / 2   # sums are exact


def all_reduce_with(size, count, first, others):
    def fn(comm):
        x = values(comm.rank, count)
        comm.all_reduce(x, algorithm=first if comm.rank == 0 else others)
        return x
    out = outcomes(size, fn, timeout=5)
    expected = sum(values(r, count) for r in range(size))
    wrong = [r for r, o in enumerate(out) if not isinstance(o, BaseException) and not np.array_equal(o, expected)]
    return out, wrong


@pytest.mark.parametrize("size,first,others", [(2, "ring", "recursive_doubling"),
                                                (3, "recursive_doubling", "rabenseifner")])
def test_the_cases_that_returned_a_wrong_sum_raise_naming_both_algorithms(size, first, others):
    out, wrong = all_reduce_with(size, 1, first, others)
    assert not wrong, out
    assert all(isinstance(o, CommError) for o in out), out
    named = (f"algorithm: expected {first}, received {others}", f"algorithm: expected {others}, received {first}")
    assert any(isinstance(o, MismatchError) and any(n in str(o) for n in named) for o in out), out


@pytest.mark.parametrize("size", [2, 4])
def test_no_pair_of_all_reduce_schedules_returns_wrong_data(size):
    schedules = algorithms.schedule_names("all_reduce")
    for (first, others), count in itertools.product(itertools.permutations(schedules, 2), (1, 300)):
        out, wrong = all_reduce_with(size, count, first, others)
        assert not wrong, (first, others, count, out)
        if any(isinstance(o, BaseException) for o in out):
            # raised: on every rank, each a MismatchError or the abort of a peer that raised one
            assert all(isinstance(o, CommError) for o in out), (first, others, count, out)
