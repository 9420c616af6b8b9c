"""Sub-communicators: ``comm.split`` (MPI_Comm_split) and the groups of the torch backend
(``_group``: MPI_Comm_create_group, made by its members alone).

A split is one collective of the parent: every rank's (color, key, free window slots) travel in
an all-gather under split's own envelope code, each rank picks its group, and the transport
gives the new communicator a view of itself (transport/view.py) with its own context id in the
high bits of every tag, so its messages never meet the parent's or a sibling's, and, when all
its members share a node, a shared-window slot that none of them uses yet or offers to another
split in flight (two threads may split two communicators at once). Nothing new is
created in /dev/shm. The context id hashes the split's path from the world, so every member
computes the same one without asking.

``SubCommunicators`` is a mixin of Communicator (communicator.py keeps ``split``, ``dup`` and
``_sub``, which makes the new Communicator). ``Holders`` keeps what an init made (the node's
transport, gloo's group) until the world and every sub-communicator sharing it closed.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from typing import TYPE_CHECKING, Optional

import numpy as np

from . import algorithms
from .collectives import Call
from .core import executor
from .core.envelope import Envelope, register_collective
from .core.schedule import Shape
from .errors import CommunicatorLimitError, MismatchError, bad_type, bad_value
from .transport.base import WindowSlot

if TYPE_CHECKING:
    from .communicator import Communicator


class Holders:
    """The world communicator and its live sub-communicators, which share the world's transports:
    when the last of them closes, ``on_release``'s calls let go what init made for them (the
    node's shared memory, gloo's group and store), and where every one of them closed cleanly
    (nothing failed, nothing in flight) ``on_clean_release``'s too (the world's MPI
    communicators: transport/mpi.py retire_communicator)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 1   # the world's hold
        self._release: list = []
        self._clean_release: list = []
        self._clean = True

    def on_release(self, *calls) -> None:
        self._release.extend(calls)

    def on_clean_release(self, *calls) -> None:
        self._clean_release.extend(calls)

    def join(self) -> None:
        with self._lock:
            self._count += 1

    def leave(self, clean: bool = True) -> None:
        with self._lock:
            self._count -= 1
            self._clean = self._clean and clean
            calls = []
            if self._count == 0:
                # The retirement first: it posts its exchange and waits for nobody, and a peer
                # stuck in a collective this rank left learns from it that this rank closed
                # (its MismatchError) before gloo's release waits for that peer to exit.
                calls = (self._clean_release if self._clean else []) + self._release
                self._release, self._clean_release = [], []
        for call in calls:
            call()


SPLIT_CODE = 11    # the envelope code of comm.split()'s exchange
register_collective(SPLIT_CODE, "split or dup")   # dup is a split: the two meet


class SubCommunicators:
    """Communicator's split and group machinery (the module docstring)."""

    def _rows(self, seq: int, what: str, row: list) -> np.ndarray:
        """Every rank's int64 ``row`` (same length everywhere), as a (size, len) table: the
        exchange of split and _group, under split's envelope code."""
        width = len(row)
        table = np.zeros(width * self.size, np.int64)
        table[width * self.rank:width * (self.rank + 1)] = row
        program = algorithms.plan("all_gather", "ring", self.rank, Shape(self.size, table.size, seg=table.size))
        executor.run(program, self.transport, (table, table, None), None,
                     envelope=Envelope(seq, SPLIT_CODE, "int64", table.size), timeout=self.timeout,
                     what=f"{what} #{seq}")
        return table.reshape(self.size, width)

    def _split(self, seq: int, color: Optional[int], key: int, what: str = "split") -> Optional["Communicator"]:
        """``what``: the call the user made (split or dup), in the words of its errors."""
        with self._offered_window_slots() as offered:
            return self._split_with(seq, color, key, offered, what)

    def _split_with(self, seq: int, color: Optional[int], key: int, offered: int,
                    what: str) -> Optional["Communicator"]:
        rows = self._rows(seq, what, [-1 if color is None else color, key, offered, self._window_rounds(offered)])
        self._splits += 1
        groups: dict = {}
        for r in range(self.size):
            if rows[r, 0] >= 0:
                groups.setdefault(int(rows[r, 0]), []).append(r)
        for members in groups.values():
            members.sort(key=lambda r: (int(rows[r, 1]), r))
        members = groups.get(color) if color is not None else None
        path = self.context + ((self._splits, color),)
        slot = None if members is None else _agreed_slot(rows[members, 2], rows[members, 3])
        try:
            transport = self.transport.split(members, color, key, _context_id(path), slot)
        except CommunicatorLimitError as err:   # MPI's refusal to make one more (transport/mpi.py)
            raise CommunicatorLimitError(f"{what} #{seq} on rank {self.rank}: {err}") from err
        if members is None:
            return None
        nodes = None if self.topology is None else tuple(self.topology.node_of[r] for r in members)
        from .topology import Topology
        topology = None if nodes is None else Topology.from_names(members.index(self.rank), nodes)
        return type(self)._sub(self, transport, topology, path)

    def _group(self, members, key: str, *, agree: bool = True) -> "Communicator":
        """MPI_Comm_create_group: a communicator of ``members`` (ranks of this one, in the new
        communicator's order), made by the members alone: ranks outside it do not call this.
        ``key`` names the group identically on every member (torch's group name); the context id
        that keeps its messages apart derives from it, so members agree without asking anyone.
        Its first collective checks that every member made the same group, and agrees on a
        shared-window slot for one-shot all-reduces. ``agree=False`` skips that exchange: for a
        communicator that only carries point-to-point messages (it takes no window slot)."""
        members = _member_list(members, self.size, self.rank)
        if not isinstance(key, str) or not key:
            raise bad_value("_group", "key", "a non-empty str naming the group on every member", key)
        # A group made again of the same members under the same name (torch re-creating a
        # destroyed group, split_group reusing a name) gets a context of its own: the last one's
        # closed window regions still say "closed" under its context, and a member that opened
        # its window before a slower one would read that one as having closed the new group.
        # Each member made every earlier one (members make a group together), so they count alike.
        group = (key, tuple(members))
        with self.engine.state:
            self._check_usable("_group")
            generation = self._groups_made.get(group, 0)
            self._groups_made[group] = generation + 1
        path = self.context + (("group", *group, generation),)
        transport = self.transport.group(members, _context_id(path))
        nodes = None if self.topology is None else tuple(self.topology.node_of[r] for r in members)
        from .topology import Topology
        topology = None if nodes is None else Topology.from_names(members.index(self.rank), nodes)
        sub = self._sub(transport, topology, path)
        if not agree:
            return sub
        fingerprint = _context_id((key, tuple(members)))
        call = Call(_SPLIT, None, None, dtype=None, count=0, result=None)
        sub._submit(call, lambda seq: sub._agree(seq, fingerprint, members), async_op=False)
        return sub

    def _agree(self, seq: int, fingerprint: int, members: list) -> None:
        with self._offered_window_slots() as offered:
            rows = self._rows(seq, "group", [fingerprint, offered, self._window_rounds(offered)])
            odd = [members[r] for r in range(self.size) if rows[r, 0] != fingerprint]
            if odd:
                raise MismatchError(f"group #{seq} on rank {self.rank}: ranks {odd} of {members} made another "
                                    f"group under this name (their members or name differ)")
            slot = _agreed_slot(rows[:, 1], rows[:, 2])
            if slot is not None:
                self.transport.open_window(slot)

    def _window_rounds(self, offered: int) -> int:
        """The highest round this rank's regions of the ``offered`` window slots show (0 where
        its transport has no shared windows)."""
        rounds = getattr(self.transport, "window_rounds", None)
        return 0 if rounds is None or not offered else rounds(offered)

    @contextlib.contextmanager
    def _offered_window_slots(self):
        """Bit mask of the shared-window slots this rank offers the sub-communicator being made,
        reserved while it is made: free ones that no other split in flight on this rank (another
        thread's) offers, so two communicators made at once never take the same slot."""
        reserve = getattr(self.transport, "reserve_window_slots", None)
        offered = 0 if reserve is None else reserve()
        try:
            yield offered
        finally:
            if offered:
                self.transport.release_window_slots(offered)


class _Split:
    """Stands in for a collective object in the records of comm.split() and comm.dup()."""
    code = SPLIT_CODE

    def __init__(self, name: str):
        self.name = name

    def envelope_count(self, call):
        return 0


_SPLIT, _DUP = _Split("split"), _Split("dup")


def _member_list(members, size: int, rank: int) -> list:
    if isinstance(members, (str, bytes)) or not hasattr(members, "__iter__"):
        raise bad_type("_group", "members", "a list of ranks", type(members).__name__)
    out = [int(m) for m in members]
    if not out or len(set(out)) != len(out) or not all(0 <= m < size for m in out):
        raise bad_value("_group", "members", f"distinct ranks in [0, {size - 1}]", out)
    if rank not in out:
        raise bad_value("_group", "members", f"a list that holds this rank ({rank}): only members call it", out)
    return out


def _agreed_slot(offers, rounds) -> Optional[WindowSlot]:
    """The lowest window slot every member offered (their ``offers`` masks), counting its rounds
    from past the highest any member's region of an offered slot shows (``rounds``): a slot an
    earlier communicator had still holds its flags and stamps, which the new window's first
    rounds must not take for its own. None if no slot is free on all of them."""
    free = int(np.bitwise_and.reduce(offers)) if len(offers) else 0
    if not free:
        return None
    return WindowSlot((free & -free).bit_length() - 1, int(max(rounds)))


def _context_id(path: tuple) -> int:
    """A 29-bit id for a sub-communicator, the same on every member: its path of splits from the
    world (which split of which parent, which color). Transports keep streams apart with it above
    bit 32 of a tag, whose 62 bits it must fit."""
    digest = hashlib.blake2b(repr(path).encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "little") & 0x1FFFFFFF) or 1
