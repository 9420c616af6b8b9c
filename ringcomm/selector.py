"""Choosing an algorithm: the candidate with the lowest predicted time under the cost model.

Selection is data (the registry of algorithms, each with its own cost function) plus a link model,
not a chain of size thresholds. ``explain`` returns the whole table so that a user can see why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from . import algorithms
from .cost import DEFAULT_LINK, Link


@dataclass
class Choice:
    collective: str
    nbytes: int
    size: int
    algorithm: str
    predicted: dict = field(default_factory=dict)   # name -> seconds
    reason: str = ""


@lru_cache(maxsize=4096)
def _predict(collective: str, nbytes: int, size: int, link: Link) -> tuple:
    return tuple((name, algorithms.get(collective, name).cost(nbytes, size, link))
                 for name in algorithms.names(collective))


def _bucket(nbytes: int) -> int:
    """Round up to a power of two so the cache stays small; predicted costs are smooth in size."""
    return 1 << max(0, (nbytes - 1).bit_length())


class Selector:
    def __init__(self, link: Link = DEFAULT_LINK, forced: dict | None = None):
        self.link = link
        self.forced = dict(forced or {})   # collective -> algorithm name

    def explain(self, collective: str, nbytes: int, size: int) -> Choice:
        predicted = dict(_predict(collective, nbytes, size, self.link))
        if collective in self.forced:
            return Choice(collective, nbytes, size, self.forced[collective], predicted, "forced")
        best = min(predicted, key=predicted.get)
        return Choice(collective, nbytes, size, best, predicted, "lowest predicted time")

    def choose(self, collective: str, nbytes: int, size: int) -> str:
        forced = self.forced.get(collective)
        if forced is not None:
            return forced
        return min(_predict(collective, _bucket(nbytes), size, self.link), key=lambda nc: nc[1])[0]
