"""The algorithm registry: which algorithms exist for which collective, and their cached plans."""
from __future__ import annotations

from functools import lru_cache

from ..errors import bad_value
from .base import Algorithm
from .binomial_broadcast import BinomialBroadcast
from .binomial_reduce import BinomialReduce
from .dissemination_barrier import DisseminationBarrier
from .hierarchical import HierarchicalAllReduce
from .hierarchical_tree import HierarchicalTreeAllReduce
from .one_shot import OneShot
from .pipeline_broadcast import PipelineBroadcast
from .rabenseifner import Rabenseifner
from .recursive_doubling import RecursiveDoubling
from .ring import RingAllReduce
from .ring_all_gather import RingAllGather
from .ring_reduce_scatter import RingReduceScatter
from .tree import TreeAllReduce

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier")

_REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(algorithm: Algorithm) -> Algorithm:
    _REGISTRY[algorithm.collective][algorithm.name] = algorithm
    return algorithm


for _cls in (RingAllReduce, TreeAllReduce, RecursiveDoubling, Rabenseifner, BinomialBroadcast,
             PipelineBroadcast, BinomialReduce, RingAllGather, RingReduceScatter, DisseminationBarrier,
             HierarchicalAllReduce, HierarchicalTreeAllReduce, OneShot):
    register(_cls())


def needs_window(collective: str, name: str) -> bool:
    """True for algorithms that run on a shared window (transport.window), not a program."""
    return getattr(_REGISTRY[collective].get(name), "needs_window", False)


def names(collective: str, transport=None) -> list[str]:
    """The names ``algorithm=`` accepts for ``collective``; with ``transport`` (e.g.
    ``comm.transport``), only those that can run on it (one-shot ones need its window)."""
    if collective not in _REGISTRY:
        raise bad_value("algorithms.names", "collective", f"one of {', '.join(COLLECTIVES)}", collective)
    return [name for name, algorithm in _REGISTRY[collective].items()
            if transport is None or not getattr(algorithm, "needs_window", False)
            or getattr(transport, "window", None) is not None]


def get(collective: str, name: str) -> Algorithm:
    table = _REGISTRY[collective]
    if name not in table:
        raise bad_value(collective, "algorithm", f"one of {', '.join(table)} or None", name)
    return table[name]


def program(collective: str, name: str, rank: int, size: int, count: int, root: int, seg: int,
            nodes: tuple | None = None):
    """One rank's program; ``nodes`` (node of every rank) reaches only topology-aware algorithms."""
    algorithm = _REGISTRY[collective][name]
    if getattr(algorithm, "topology_aware", False):
        return algorithm.program(rank, size, count, root, seg, nodes=nodes)
    return algorithm.program(rank, size, count, root, seg)


@lru_cache(maxsize=512)
def plan(collective: str, name: str, rank: int, size: int, count: int, root: int, seg: int,
         nodes: tuple | None = None) -> list:
    """The compiled program of one rank; programs are pure, so they are cached."""
    from ..core.executor import compile_program
    return compile_program(program(collective, name, rank, size, count, root, seg, nodes))


__all__ = ["Algorithm", "COLLECTIVES", "names", "needs_window", "get", "plan", "program", "register"]
