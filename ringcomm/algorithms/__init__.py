"""The algorithm registry: which algorithms exist for which collective, and their compiled plans.

Adding an algorithm is one new file here plus its line in ``_ALL``: the selector prices it, the
schedule tests verify it for every world size, and ``algorithm=`` accepts its name.
"""
from __future__ import annotations

from functools import lru_cache

from ..collectives import NAMES as COLLECTIVES
from ..collectives import get as collective_of
from ..core.envelope import WINDOW_KINDS, register_algorithms
from ..core.executor import compile_program
from ..core.schedule import IN, OUT, Copy, Lanes, Prologued, Shape, confirmation
from ..errors import bad_value
from .base import Algorithm, ScheduleAlgorithm, WindowAlgorithm
from .binomial_broadcast import BinomialBroadcast
from .binomial_gather import BinomialGather
from .binomial_reduce import BinomialReduce
from .binomial_scatter import BinomialScatter
from .bruck_all_to_all import BruckAllToAll
from .direct_all_gather import DirectAllGather
from .direct_all_reduce import DirectAllReduce
from .direct_all_to_all import DirectAllToAll
from .direct_broadcast import DirectBroadcast
from .direct_gather import DirectGather
from .direct_reduce_scatter import DirectReduceScatter
from .direct_scatter import DirectScatter
from .dissemination_barrier import DisseminationBarrier
from .hierarchical import HierarchicalAllReduce
from .hierarchical_tree import HierarchicalTreeAllReduce
from .linear_gather import LinearGather
from .linear_scatter import LinearScatter
from .one_shot import OneShot
from .one_shot_all_gather import OneShotAllGather
from .one_shot_all_to_all import OneShotAllToAll
from .one_shot_barrier import OneShotBarrier
from .one_shot_broadcast import OneShotBroadcast
from .one_shot_gather import OneShotGather
from .one_shot_reduce_scatter import OneShotReduceScatter
from .one_shot_scatter import OneShotScatter
from .pairwise_all_to_all import PairwiseAllToAll
from .pipeline_broadcast import PipelineBroadcast
from .rabenseifner import Rabenseifner
from .recursive_doubling import RecursiveDoubling
from .ring import RingAllReduce
from .ring_all_gather import RingAllGather
from .ring_reduce_scatter import RingReduceScatter
from .tree import TreeAllReduce

_ALL = (RingAllReduce, TreeAllReduce, RecursiveDoubling, Rabenseifner, HierarchicalAllReduce,
        HierarchicalTreeAllReduce, OneShot, BinomialBroadcast, PipelineBroadcast, BinomialReduce,
        RingAllGather, RingReduceScatter, DisseminationBarrier, PairwiseAllToAll, BruckAllToAll,
        LinearGather, BinomialGather, LinearScatter, BinomialScatter, OneShotBroadcast, OneShotAllGather,
        OneShotReduceScatter, OneShotBarrier, DirectAllReduce, DirectBroadcast, DirectAllGather,
        DirectReduceScatter, DirectGather, DirectScatter, DirectAllToAll, OneShotAllToAll, OneShotGather,
        OneShotScatter)

_REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.kind == "schedule" and not algorithm.out_of_place and algorithm.collective not in (
            "all_reduce", "broadcast", "barrier"):
        raise TypeError(f"{algorithm!r}: only all_reduce and broadcast algorithms may leave the "
                        f"out-of-place copy to the caller")
    _REGISTRY[algorithm.collective][algorithm.name] = algorithm
    if len(window_names(algorithm.collective)) > WINDOW_KINDS:
        raise TypeError(f"{algorithm!r}: {algorithm.collective} has more window algorithms than a window stamp "
                        f"can tell apart ({WINDOW_KINDS})")
    return algorithm


def window_names(collective: str) -> tuple:
    """The window algorithms of ``collective``, in registration order (the same on every rank)."""
    return tuple(name for name, a in _REGISTRY[collective].items() if a.kind == "window")


def window_kind(collective: str, name: str) -> int:
    """1 + the place of window algorithm ``name`` among its collective's: carried in every window
    stamp of its rounds (envelope.window_kind_bits), so that ranks that disagree on the
    algorithm refuse each other's slots instead of reading data as an address."""
    return window_names(collective).index(name) + 1


for _cls in _ALL:
    register(_cls())


def schedule_names(collective: str) -> tuple:
    """The schedule algorithms of ``collective``, in registration order (the same on every rank)."""
    return tuple(name for name, a in _REGISTRY[collective].items() if a.kind == "schedule")


def schedule_index(collective: str, name: str) -> int:
    """The place of schedule algorithm ``name`` among its collective's: carried in every tag of
    its messages (Envelope.algorithm), so that ranks that disagree on the algorithm never take
    each other's messages as their own."""
    return schedule_names(collective).index(name)


for _collective in COLLECTIVES:
    register_algorithms(collective_of(_collective).code, schedule_names(_collective))


def is_window(collective: str, name: str) -> bool:
    """True for algorithms that run on a shared window (transport.window), not a program."""
    return _REGISTRY[collective][name].kind == "window"


def names(collective: str, transport=None) -> list[str]:
    """The names ``algorithm=`` accepts for ``collective``; with ``transport`` (e.g.
    ``comm.transport``), only those that can run on it (window algorithms need its window, direct
    ones a window that can read peers' memory)."""
    if collective not in _REGISTRY:
        raise bad_value("algorithms.names", "collective", f"one of {', '.join(COLLECTIVES)}", collective)
    return [name for name, algorithm in _REGISTRY[collective].items()
            if transport is None or algorithm.kind == "schedule" or algorithm.runs_on(getattr(transport, "window", None))]


def get(collective: str, name: str) -> Algorithm:
    table = _REGISTRY[collective]
    if name not in table:
        raise bad_value(collective, "algorithm", f"one of {', '.join(table)} or None", name)
    return table[name]


def program(collective: str, name: str, rank: int, shape: Shape, confirm: bool = False) -> list:
    """One rank's program. Out of place where the algorithm is not: a copy of IN to OUT first.
    ``confirm``: end with the confirmation barrier (rooted collectives, schedule.confirmation)."""
    algorithm = _REGISTRY[collective][name]
    steps = algorithm.program(rank, shape if algorithm.out_of_place else shape._replace(in_place=True))
    if confirm and shape.size > 1:
        if isinstance(steps, Lanes):
            raise TypeError(f"{algorithm!r}: a rooted collective's program must be a single lane")
        steps = list(steps) + confirmation(rank, shape.size)
    if shape.in_place or algorithm.out_of_place or not shape.count:
        return steps
    return Prologued((Copy(0, shape.count, OUT, IN, 0),), steps)


@lru_cache(maxsize=1024)
def plan(collective: str, name: str, rank: int, shape: Shape, confirm: bool = False):
    """The compiled program of one rank; programs are pure, so they are cached. A program written
    in place runs in place on OUT after its prologue copy, so it compiles as in place."""
    in_place = shape.in_place or not _REGISTRY[collective][name].out_of_place
    return compile_program(program(collective, name, rank, shape, confirm), in_place)


__all__ = ["Algorithm", "ScheduleAlgorithm", "WindowAlgorithm", "COLLECTIVES", "names", "is_window",
           "get", "plan", "program", "register"]
