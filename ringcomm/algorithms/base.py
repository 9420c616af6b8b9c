"""The two kinds of algorithm: a schedule of messages, or a round on a shared window.

A ``ScheduleAlgorithm`` is a pure function from (rank, Shape) to a program of sends and receives
over the collective's named buffers (core/schedule.py); the executor runs it over any transport
and ``schedule.verify`` proves it for every world size. A ``WindowAlgorithm`` has no messages:
it runs on a ``Window`` (transport/window.py), a mailbox per rank that every rank reads in
place, which only transports whose ranks share memory offer. Both state their predicted time
under the alpha-beta-gamma model on a ``Network`` (selection/cost.py), so the selector can price
them against each other.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..core.schedule import Program, Shape
from ..selection.cost import Network


class ScheduleAlgorithm(ABC):
    kind = "schedule"
    name: str
    collective: str
    # The program reads IN and writes OUT itself when shape.in_place is False. Otherwise (all-reduce
    # and broadcast only, whose IN and OUT have the same size) the caller copies IN to OUT first.
    out_of_place = False
    even_only = False        # needs equal per-rank counts: priced infinite for uneven calls
    topology_aware = False   # the program reads shape.nodes

    @abstractmethod
    def program(self, rank: int, shape: Shape) -> Program:
        """Rank's steps for a call of this shape."""

    @abstractmethod
    def cost(self, nbytes: int, net: Network) -> float:
        """Predicted seconds for a call of ``nbytes`` (the collective's vector) on ``net``."""

    def __repr__(self) -> str:
        return f"<{self.collective} algorithm {self.name!r} ({self.kind})>"


class WindowAlgorithm(ABC):
    kind = "window"
    name: str
    collective: str

    @abstractmethod
    def run(self, window, src, dst, reduce, combine, stamp: int, trouble) -> None:
        """Run one call on ``window``: ``src`` is this rank's input, ``dst`` where the result goes
        (the same array for an in-place call)."""

    @abstractmethod
    def cost(self, nbytes: int, net: Network) -> float:
        """Predicted seconds; infinite where ``net`` has no window."""

    def __repr__(self) -> str:
        return f"<{self.collective} algorithm {self.name!r} ({self.kind})>"


Algorithm = ScheduleAlgorithm | WindowAlgorithm
