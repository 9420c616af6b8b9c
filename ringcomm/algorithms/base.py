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

import functools
import math
from abc import ABC, abstractmethod
from typing import Callable, Optional

from ..core.schedule import Program, Shape
from ..selection.cost import Network
from . import _planned


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
    reads_directly = False   # reaches peers' buffers in place (window.reader/writer) rather than slots
    even_only = False        # every window algorithm takes uneven counts

    def runs_on(self, window) -> bool:
        """Whether this algorithm can run on ``window`` (a transport's, or None)."""
        return window is not None and (not self.reads_directly or window.reader is not None)

    @abstractmethod
    def run(self, window, src, dst, shape: Shape, reducer, stamp: int, word: int, trouble) -> None:
        """Run one call on ``window`` (2 or more ranks): ``src`` and ``dst`` are the call's IN
        and OUT (the same array for an in-place call; None where this rank has none), ``shape``
        its Shape, ``reducer`` the op's kernels (ops.py) or None, ``stamp`` and ``word`` what
        every rank's rounds must carry (_rounds.sync), ``trouble()`` the guard for stalls and
        mismatches."""

    def has_work(self, shape: Shape) -> bool:
        """Whether a call of this shape needs a round at all."""
        return shape.count > 0

    def planned(self, window, src, dst, shape: Shape, reducer, word: int) -> Optional[tuple]:
        """(plan, code) when the compiled core can run this whole call as one round
        (algorithms/_planned.py), else None (``run``'s arguments). The same for every call of
        these buffers, shape and word, so a persistent call asks once."""
        return None

    def road(self, window, src, dst, shape: Shape, reducer, word: int) -> Optional[Callable]:
        """The whole call as ``road(stamp, word, trouble)`` when the compiled core runs it with
        nothing left to decide per call (a persistent call asks once, persistent.WindowCall),
        else None: by default the one round of ``planned``."""
        planned = self.planned(window, src, dst, shape, reducer, word)
        return None if planned is None else functools.partial(_planned.run, window, src, dst, *planned)

    def cost(self, nbytes: int, net: Network) -> float:
        """Predicted seconds; infinite where ``net`` has no window (or, for a direct algorithm, no
        direct reads), or spans several nodes."""
        if net.window is None or net.window_bytes <= 0 or net.nodes > 1 or \
                (self.reads_directly and net.direct is None):
            return math.inf
        if net.size == 1 or nbytes == 0:
            return 0.0
        return self.seconds(nbytes, net)

    @abstractmethod
    def seconds(self, nbytes: int, net: Network) -> float:
        """Predicted seconds of a call of ``nbytes`` (> 0) on 2 or more ranks that can run it."""

    def __repr__(self) -> str:
        return f"<{self.collective} algorithm {self.name!r} ({self.kind})>"


Algorithm = ScheduleAlgorithm | WindowAlgorithm


class PlannedAlgorithm(WindowAlgorithm):
    """A window algorithm whose call the compiled core runs where it can (``road``: by default one
    round from a plan, ``planned``, algorithms/_planned.py; the direct algorithms' own calls,
    algorithms/_direct.py); ``rounds`` is its Python road, for every call."""

    def run(self, window, src, dst, shape: Shape, reducer, stamp: int, word: int, trouble) -> None:
        road = self.road(window, src, dst, shape, reducer, word)
        if road is not None:
            road(stamp, word, trouble)
        else:
            self.rounds(window, src, dst, shape, reducer, stamp, word, trouble)

    @abstractmethod
    def rounds(self, window, src, dst, shape: Shape, reducer, stamp: int, word: int, trouble) -> None:
        """The call in Python rounds (``run``'s arguments)."""
