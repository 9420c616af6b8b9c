"""Every algorithm's schedule, checked symbolically for every world size without running it."""
import pytest

from ringcomm import algorithms
from ringcomm.core.schedule import Recv, RecvReduce, ScheduleError, Send, verify

SIZES = range(1, 17)
GATHERING = ("all_gather", "reduce_scatter")   # their count is size x the per-rank count


def programs(collective, name, size, per_rank, root=0, seg=3):
    count = per_rank * size if collective in GATHERING else per_rank
    return [algorithms.get(collective, name).program(r, size, count, root, seg) for r in range(size)]


ALL = [(c, n) for c in algorithms.COLLECTIVES for n in algorithms.names(c) if not algorithms.needs_window(c, n)]


@pytest.mark.parametrize("collective,name", ALL)
def test_schedule_pairs_up_and_cannot_deadlock_under_rendezvous(collective, name):
    for size in SIZES:
        for per_rank in (0, 1, max(size - 1, 0), 7, 101):
            for root in sorted({0, size - 1, size // 2}):
                verify(programs(collective, name, size, per_rank, root))


def test_verify_catches_a_deadlock():
    # Both ranks receive before they send, in separate steps: classic head-to-head deadlock.
    with pytest.raises(ScheduleError, match="deadlock"):
        verify([[(Recv(1, 0, 4),), (Send(1, 0, 4),)], [(Recv(0, 0, 4),), (Send(0, 0, 4),)]])


def test_verify_catches_mismatched_counts_and_clashing_ranges():
    with pytest.raises(ScheduleError, match="counts"):
        verify([[(Send(1, 0, 4),)], [(Recv(0, 0, 5),)]])
    with pytest.raises(ScheduleError, match="same elements"):
        verify([[(Send(1, 0, 4), Recv(1, 2, 4))], [(Recv(0, 0, 4), Send(0, 0, 4))]])


@pytest.mark.parametrize("size", [2, 3, 4, 7, 8, 16])
def test_ring_moves_the_bandwidth_optimal_volume(size):
    count = 1000 * size
    for rank, program in enumerate(programs("all_reduce", "ring", size, count, seg=count)):
        sent = sum(op.count for step in program for op in step if isinstance(op, Send))
        reduced = sum(op.count for step in program for op in step if isinstance(op, RecvReduce))
        assert sent == 2 * (size - 1) * count // size
        assert reduced == (size - 1) * count // size


@pytest.mark.parametrize("name", algorithms.names("all_reduce"))
def test_every_all_reduce_algorithm_has_a_cost_that_grows_with_size(name):
    from ringcomm.selection.cost import DEFAULT_LINK, Network
    algo = algorithms.get("all_reduce", name)
    link = Network(DEFAULT_LINK, DEFAULT_LINK, (8,), window=DEFAULT_LINK, window_bytes=64 << 10) \
        if algorithms.needs_window("all_reduce", name) else DEFAULT_LINK
    assert algo.cost(1 << 20, 8, link) > algo.cost(1 << 10, 8, link) > 0


def test_one_shot_is_priced_only_where_ranks_share_a_window():
    import math

    from ringcomm.selection.cost import DEFAULT_LINK, Network
    one_shot = algorithms.get("all_reduce", "one_shot")
    window = Network(DEFAULT_LINK, DEFAULT_LINK, (4,), window=DEFAULT_LINK, window_bytes=1024)
    assert math.isinf(one_shot.cost(1024, 4, Network(DEFAULT_LINK, DEFAULT_LINK, (4,))))
    assert math.isinf(one_shot.cost(1024, 4, Network(DEFAULT_LINK, DEFAULT_LINK, (2, 2), window=DEFAULT_LINK,
                                                     window_bytes=1024)))
    # One round per window's worth: 4 KiB through a 1 KiB window pays four latencies.
    assert one_shot.cost(4096, 4, window) - 4 * one_shot.cost(1024, 4, window) == pytest.approx(0, abs=1e-12)
