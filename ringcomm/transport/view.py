"""A sub-communicator's view of a transport that carries any tag (threads, shared memory).

``comm.split()`` gives the new communicator a view over its parent's transport instead of a new
one: no new segments, no new connections. The view renumbers ranks (rank i of the view is parent
rank ``members[i]``) and keeps its messages apart from every other communicator's by putting its
context id above bit 32 of each tag; the 29 bits below stay the communicator's own (envelope.py).
Probes of "any tag" see only this context's messages. The MPI transport cannot carry such tags
(MPICH's bound is 2**29): its sub-communicators get an MPI communicator of their own instead.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CommError, PeerAbortedError
from .base import Transport

CONTEXT_SHIFT = 32


class TransportView(Transport):
    def __init__(self, base: Transport, members: list, context: int, window=None):
        # Context ids are hashes of the split path (subcommunicators._context_id): two live views of
        # one transport with the same id would read each other's messages. Refuse, never mix.
        live = getattr(base, "_view_contexts", None)
        if live is None:
            live = base._view_contexts = set()
        if context in live:
            raise CommError(f"sub-communicator context id {context:#x} is already in use on rank {base.rank} "
                            f"(a hash collision of two split paths): split again with another color or key")
        live.add(context)
        self.base, self.members, self.context = base, list(members), context
        revive = getattr(base, "revive_context", None)
        if revive is not None:
            revive(context, self.members)   # never changed after this: the transport may keep it
        self.rank, self.size = self.members.index(base.rank), len(self.members)
        self.name = base.name
        self.window = window
        self._shift = context << CONTEXT_SHIFT
        self._index = {r: i for i, r in enumerate(self.members)}
        self._aborted: Optional[str] = None

    def _check(self) -> None:
        if self._aborted is not None:
            raise PeerAbortedError(self._aborted)

    def isend(self, buf, peer, tag):
        self._check()
        return self.base.isend(buf, self.members[peer], tag | self._shift)

    def isend_p2p(self, buf, peer, tag):
        self._check()
        return self.base.isend_p2p(buf, self.members[peer], tag | self._shift)

    def irecv(self, buf, peer, tag):
        self._check()
        return self.base.irecv(buf, self.members[peer], tag | self._shift)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch, own=None):
        self._check()
        return self.base.irecv_reduce(buf, self.members[peer], tag | self._shift, reduce, scratch, own)

    def stage(self, arrays):
        return self.base.stage(arrays)

    def probe(self, source, tag=None, context=0, skip=0):
        found = self.base.probe(None if source is None else self.members[source],
                                None if tag is None else tag | self._shift, context=self.context, skip=skip)
        if found is None or found[0] not in self._index:
            return None
        src, t, nbytes = found
        return self._index[src], t & ((1 << CONTEXT_SHIFT) - 1), nbytes

    def peer_gone(self, peer, as_rank=None):
        return self._aborted or self.base.peer_gone(self.members[peer], peer)   # named as this view numbers it

    def reserve_window_slots(self) -> int:
        reserve = getattr(self.base, "reserve_window_slots", None)
        return 0 if reserve is None else reserve()

    def window_rounds(self, offered: int) -> int:
        rounds = getattr(self.base, "window_rounds", None)
        return 0 if rounds is None else rounds(offered)

    def release_window_slots(self, offered: int) -> None:
        if offered:
            self.base.release_window_slots(offered)

    def split(self, members, color, key, context, slot=None):
        parent = [self.members[m] for m in members] if members is not None else None
        return self.base.split(parent, color, key, context, slot)

    def open_window(self, slot) -> None:
        make = getattr(self.base, "window_of", None)
        if self.window is None and make is not None:
            self.window = make(self.members, slot, self.context)

    def abort(self, reason: BaseException) -> None:
        # Only this communicator gives up: its peers learn it from the abort notices it sends.
        self._aborted = f"aborted: {reason}"

    def leave(self) -> None:
        self.close()

    def close(self) -> None:
        getattr(self.base, "_view_contexts", set()).discard(self.context)
        release = getattr(self.base, "release_window", None)
        if release is not None and self.window is not None:
            release(self.context)   # its slot may serve a later communicator (shm/transport.py)
        self.window = None   # a view into the node's segment: a closed communicator kept it mapped
        # What peers sent this communicator and it never received would hold slots of rings that
        # every communicator of the pair shares (shm): dropped, acknowledged unread.
        drop = getattr(self.base, "drop_context", None)
        if drop is not None:
            drop(self.context)

    def describe(self) -> dict:
        full = self.base.describe() if hasattr(self.base, "describe") else {}
        return {i: full.get(r, self.name) for i, r in enumerate(self.members) if i != self.rank}
