"""Every algorithm's schedule, checked symbolically for every world size 1..32 without running it:
sends and receives pair up, nothing in flight overlaps, nothing writes the input of an out-of-place
call, and nothing can deadlock even when every send waits for its receive."""
import math

import numpy as np
import pytest

from ringcomm import algorithms, collectives
from ringcomm.core.schedule import IN, OUT, TMP, Copy, Recv, RecvReduce, ScheduleError, Send, Shape, verify
from ringcomm.selection.cost import DEFAULT_LINK, Network

SIZES = range(1, 33)
ALL = [(c, n) for c in collectives.NAMES for n in algorithms.names(c) if not algorithms.is_window(c, n)]


def shapes(collective, algorithm, size):
    """The call shapes of every rank, for the counts and variants the collective has."""
    rng = np.random.default_rng(size)
    even_only = algorithms.get(collective, algorithm).even_only
    out = []
    small = size <= 16   # beyond 16 ranks: fewer counts and roots (each check grows with size squared)
    for per in (0, 1, 3, 7) if small else (1, 7):
        for root in sorted({0, size // 2, size - 1}) if small else [size // 2]:
            if collective in ("all_gather", "reduce_scatter"):
                out.append([Shape(size, per * size, root, 2, None, None, None, collective == "all_gather")] * size)
                counts = tuple(int(x) for x in rng.integers(0, 5, size))
                out.append([Shape(size, sum(counts), root, 2, counts, None, None, False)] * size)
            elif collective == "all_to_all":
                out.append([Shape(size, per * size, 0, 2, (per,) * size, (per,) * size, None, False)] * size)
                if not even_only:
                    m = rng.integers(0, 4, (size, size))
                    out.append([Shape(size, int(m[r].sum()), 0, 2, tuple(int(x) for x in m[r]),
                                      tuple(int(x) for x in m[:, r]), None, False) for r in range(size)])
            elif collective in ("gather", "scatter"):
                out.append([Shape(size, per, root, 2, None, None, None, False)] * size)
            else:
                for in_place in (True, False):
                    out.append([Shape(size, per, root, 2, None, None, None, in_place)] * size)
    return out


@pytest.mark.parametrize("collective,name", ALL)
def test_schedule_pairs_up_and_cannot_deadlock_under_rendezvous(collective, name):
    topology = algorithms.get(collective, name).topology_aware
    confirm = collectives.get(collective).rooted
    for size in SIZES:
        for per_rank in shapes(collective, name, size):
            if topology:   # two nodes, the first one bigger: unequal nodes fold their extras
                nodes = tuple(0 if r < (size + 1) // 2 else 1 for r in range(size))
                per_rank = [s._replace(nodes=nodes) for s in per_rank]
            programs = [algorithms.program(collective, name, r, s, confirm) for r, s in enumerate(per_rank)]
            verify(programs, in_place=[s.in_place for s in per_rank])


def test_verify_catches_a_deadlock():
    # Both ranks receive before they send, in separate steps: classic head-to-head deadlock.
    with pytest.raises(ScheduleError, match="deadlock"):
        verify([[(Recv(1, 0, 4),), (Send(1, 0, 4),)], [(Recv(0, 0, 4),), (Send(0, 0, 4),)]])


def test_verify_catches_mismatched_counts_clashing_ranges_and_input_writes():
    with pytest.raises(ScheduleError, match="counts"):
        verify([[(Send(1, 0, 4),)], [(Recv(0, 0, 5),)]])
    with pytest.raises(ScheduleError, match="same elements"):
        verify([[(Send(1, 0, 4), Recv(1, 2, 4))], [(Recv(0, 0, 4), Send(0, 0, 4))]])
    with pytest.raises(ScheduleError, match="input buffer"):
        verify([[(Send(1, 0, 4),)], [(Recv(0, 0, 4, 0, IN),)]], in_place=[False, False])
    with pytest.raises(ScheduleError, match="input buffer"):
        verify([[(Copy(0, 4, IN, OUT, 0),)]], in_place=[False])
    # In place, IN is OUT: a receive into one and a send of the other's same range clash.
    with pytest.raises(ScheduleError, match="same elements"):
        verify([[(Send(1, 0, 4, 0, IN), Recv(1, 0, 4))], [(Recv(0, 0, 4), Send(0, 0, 4))]], in_place=[True, True])


@pytest.mark.parametrize("size", [2, 3, 4, 7, 8, 16])
def test_ring_moves_the_bandwidth_optimal_volume(size):
    count = 1000 * size
    for rank in range(size):
        program = algorithms.program("all_reduce", "ring", rank, Shape(size, count, seg=count))
        sent = sum(op.count for step in program for op in step if isinstance(op, Send))
        reduced = sum(op.count for step in program for op in step if isinstance(op, RecvReduce))
        assert sent == 2 * (size - 1) * count // size
        assert reduced == (size - 1) * count // size


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_to_all", "all_gather"])
def test_out_of_place_ring_and_pairwise_need_no_copy_of_the_input(collective):
    """Named buffers: the first sends read IN, reductions take IN as their own operand, results land
    in OUT (reduce_scatter keeps partials in TMP): no step copies the whole input first."""
    name = {"all_to_all": "pairwise"}.get(collective, "ring")
    size, per = 4, 8
    shape = Shape(size, per * size, 0, 3, (per,) * size if collective == "all_to_all" else None,
                  (per,) * size if collective == "all_to_all" else None, None, False)
    for rank in range(size):
        program = algorithms.program(collective, name, rank, shape)
        copied = sum(op.count for step in program for op in step if isinstance(op, Copy))
        assert copied <= per, f"{collective} rank {rank} copies {copied} elements (its own part is {per})"
        assert any(op.buf == IN for step in program for op in step if isinstance(op, Send))


@pytest.mark.parametrize("name", algorithms.names("all_reduce"))
def test_every_all_reduce_algorithm_has_a_cost_that_grows_with_size(name):
    algo = algorithms.get("all_reduce", name)
    net = Network(DEFAULT_LINK, DEFAULT_LINK, (8,), window=DEFAULT_LINK, window_bytes=64 << 10, direct=DEFAULT_LINK)
    assert algo.cost(1 << 20, net) > algo.cost(1 << 10, net) > 0


def test_direct_algorithms_are_priced_only_where_ranks_can_read_each_other():
    window = dict(window=DEFAULT_LINK, window_bytes=64 << 10)
    for collective in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        direct = algorithms.get(collective, "direct")
        assert direct.reads_directly and direct.kind == "window"
        assert math.isinf(direct.cost(1 << 20, Network(DEFAULT_LINK, DEFAULT_LINK, (4,), **window)))
        assert math.isfinite(direct.cost(1 << 20, Network(DEFAULT_LINK, DEFAULT_LINK, (4,), **window,
                                                          direct=DEFAULT_LINK)))


def test_window_algorithms_are_a_declared_kind_priced_only_where_ranks_share_a_window():
    one_shot = algorithms.get("all_reduce", "one_shot")
    assert one_shot.kind == "window" and algorithms.is_window("all_reduce", "one_shot")
    assert all(algorithms.get(c, n).kind == "schedule" for c, n in ALL)
    window = Network(DEFAULT_LINK, DEFAULT_LINK, (4,), window=DEFAULT_LINK, window_bytes=1024)
    assert math.isinf(one_shot.cost(1024, Network(DEFAULT_LINK, DEFAULT_LINK, (4,))))
    assert math.isinf(one_shot.cost(1024, Network(DEFAULT_LINK, DEFAULT_LINK, (2, 2), window=DEFAULT_LINK,
                                                  window_bytes=1024)))
    # One round per window's worth: 4 KiB through a 1 KiB window pays four latencies.
    assert one_shot.cost(4096, window) - 4 * one_shot.cost(1024, window) == pytest.approx(0, abs=1e-12)


def test_bruck_wins_small_blocks_on_many_ranks_and_pairwise_large_ones():
    net = Network(DEFAULT_LINK, DEFAULT_LINK, (16,))
    bruck, pairwise = algorithms.get("all_to_all", "bruck"), algorithms.get("all_to_all", "pairwise")
    assert bruck.cost(16 * 64, net) < pairwise.cost(16 * 64, net)
    assert bruck.cost(16 << 20, net) > pairwise.cost(16 << 20, net)


def test_scratch_is_read_off_the_program():
    from ringcomm.core.schedule import scratch_elements
    program = algorithms.program("all_to_all", "bruck", 0, Shape(5, 15, counts=(3,) * 5, recv_counts=(3,) * 5,
                                                                 in_place=False))
    assert scratch_elements(program) >= 5 * 3 and any(op.buf == TMP for step in program for op in step)
