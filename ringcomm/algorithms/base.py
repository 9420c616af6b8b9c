"""What every algorithm provides: a schedule and its predicted cost."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..core.schedule import Program
from ..selection.cost import Link


class Algorithm(ABC):
    name: str
    collective: str

    @abstractmethod
    def program(self, rank: int, size: int, count: int, root: int, seg: int) -> Program:
        """Rank's steps over a work array of ``count`` elements, in pieces of at most ``seg``."""

    @abstractmethod
    def cost(self, nbytes: int, size: int, link: Link) -> float:
        """Predicted seconds for a message of ``nbytes`` on ``size`` ranks."""

    def __repr__(self) -> str:
        return f"<{self.collective} algorithm {self.name!r}>"
