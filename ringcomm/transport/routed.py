"""One transport per peer: shared memory to ranks on this node, MPI to everyone else.

Algorithms see a single Transport; each call goes to the transport that serves its peer.
``describe()`` shows the choice ({peer: "shm" | "mpi"}), so tests and users can check that
ranks of one node really talk through shared memory.

CUDA arrays (cupy, e.g. from CUDA torch tensors) take another route for the length of the
collective they are staged for: the CUDA IPC transport, created on first use from the node's
communicator (every rank of the node stages the same collective, so creating it there is a
collective every rank joins). Peers on other nodes cannot be reached with device memory here
(MPI is not CUDA-aware): that is an error naming them, the nccl backend is the way there.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np

from ..errors import CommError
from .base import Transport
from .cuda_ipc import is_device_array


class RoutedTransport(Transport):
    name = "routed"

    def __init__(self, rank: int, size: int, routes: dict, transports: list, node=None):
        """``routes`` maps every peer (all ranks but ``rank``) to one of ``transports``;
        ``node`` is the ShmTransport of this node, if any (its communicator seeds CUDA IPC)."""
        self.rank, self.size = rank, size
        self.routes = routes
        self.transports = transports
        self.node = node
        self._device = None
        self._active = routes
        # Host arrays only (the communicator checks): the node's window spans the whole job only
        # when every peer is on this node.
        self.window = node.window if node is not None and all(t is node for t in routes.values()) else None

    def isend(self, buf: np.ndarray, peer: int, tag: int):
        return self._active[peer].isend(buf, peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int):
        return self._active[peer].irecv(buf, peer, tag)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch, own=None):
        return self._active[peer].irecv_reduce(buf, peer, tag, reduce, scratch, own)

    def probe(self, source, tag=None, context=0):
        if source is not None:
            return self._active[source].probe(source, tag, context)
        for t in self.transports:
            found = t.probe(None, tag, context)
            if found is not None:
                return found
        return None

    @contextlib.contextmanager
    def stage(self, arrays):
        if arrays and is_device_array(arrays[0]):
            device = self.device_transport()
            self._active = {p: device for p in self.routes}
            try:
                with device.stage(arrays):
                    yield
            finally:
                self._active = self.routes
            return
        with contextlib.ExitStack() as stack:
            for t in self.transports:
                stack.enter_context(t.stage(arrays))
            yield

    def device_transport(self):
        """The CUDA IPC transport of this node (created on first use, collectively)."""
        if self._device is None:
            remote = sorted(p for p, t in self.routes.items() if t is not self.node)
            if remote:
                raise CommError(f"rank {self.rank}: CUDA tensors reach ranks {remote} on other nodes "
                                f"only through the nccl backend; this transport carries them within "
                                f"a node (CUDA IPC)")
            from .cuda_ipc import CudaIpcTransport
            n = self.node
            self._device = CudaIpcTransport(n.comm, n.ranks, world_rank=self.rank, world_size=self.size,
                                            setup_timeout=n.setup_timeout)
        return self._device

    def allocate(self, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """An array in this node's shared memory (collective over the node), so ``stage`` and
        every send skip the copy; ordinary memory when no peer shares the node."""
        if self.node is not None:
            return self.node.allocate(nbytes, dtype)
        return np.empty(nbytes // np.dtype(dtype).itemsize, dtype)

    def describe(self, device: Optional[str] = None) -> dict:
        """{peer: transport name}; ``device="cuda"`` for the route CUDA arrays take."""
        if device == "cuda":
            return {peer: "cuda_ipc" for peer in sorted(self.routes)}
        return {peer: t.name for peer, t in sorted(self.routes.items())}

    def split(self, members, color, key, context, slot=None):
        """Peers on this node through a view of the node's transport, the others through an MPI
        communicator split off this one's (collective: every rank calls it, members or not).
        This transport's ranks are its local transport's ranks, so members map straight across."""
        if not self.transports:   # a communicator of one rank: its splits have one rank too
            return None if members is None else RoutedTransport(0, 1, {}, [])
        local = self.node if self.node is not None else self.transports[0]
        remote = next((t for t in self.transports if t is not local), None)
        split_remote = None if remote is None else remote.split(members, color, key, context, slot)
        if members is None:
            return None
        me = members.index(self.rank)
        on_node = [m for m in members if m == self.rank or self.routes[m] is local]
        split_local = local.split(members, color, key, context, slot) if len(on_node) > 1 else None
        routes = {i: (split_local if self.routes[m] is local else split_remote)
                  for i, m in enumerate(members) if i != me}
        sub = RoutedTransport(me, len(members), routes, [t for t in (split_local, split_remote) if t is not None])
        everyone_here = split_local is not None and all(t is split_local for t in routes.values())
        sub.window = split_local.window if everyone_here else None
        return sub

    def group(self, members, context):
        """``split`` for ``members`` alone: a view of the node's transport for members on this
        node, and an MPI communicator of the members (MPI_Comm_create_group) when some are on
        other nodes. Every member sees a remote member exactly when the members span nodes, so
        either all of them create the MPI communicator or none does."""
        if not self.transports:
            return RoutedTransport(0, 1, {}, [])
        local = self.node if self.node is not None else self.transports[0]
        remote = next((t for t in self.transports if t is not local), None)
        me = members.index(self.rank)
        far = [m for m in members if m != self.rank and self.routes[m] is not local]
        group_remote = remote.group(members, context) if far else None
        near = [m for m in members if m != self.rank and self.routes[m] is local]
        group_local = local.group(members, context) if near else None
        routes = {i: (group_local if self.routes[m] is local else group_remote)
                  for i, m in enumerate(members) if i != me}
        return RoutedTransport(me, len(members), routes, [t for t in (group_local, group_remote) if t is not None])

    def open_window(self, slot: int) -> None:
        local = self.transports[0] if len(self.transports) == 1 else None
        if local is not None and self.window is None:
            local.open_window(slot)
            self.window = local.window

    def free_window_slots(self) -> int:
        """The node transport's free window slots, where one node holds this whole communicator."""
        local = self.node if self.node is not None else (self.transports[0] if self.transports else None)
        free = getattr(local, "free_window_slots", None)
        if free is None or not all(t is local for t in self.routes.values()):
            return 0
        return free()

    def abort(self, reason: BaseException) -> None:
        for t in self.transports + ([self._device] if self._device else []):
            t.abort(reason)

    def close(self) -> None:
        for t in self.transports + ([self._device] if self._device else []):
            t.close()
