"""One transport per peer: shared memory to ranks on this node, MPI to everyone else.

Algorithms see a single Transport; each call goes to the transport that serves its peer.
``describe()`` shows the choice ({peer: "shm" | "mpi"}), so tests and users can check that
ranks of one node really talk through shared memory.

Device memory (cupy arrays, and CUDA tensors as cupy views) takes another route, chosen per
buffer: the CUDA IPC transport of this node (cuda_ipc.py). It is created on first use from the
node's MPI communicator, a handshake every rank of the node joins, so it is created inside a
collective (``device_transport``, called by the communicator with that call's deadline and a
test for peers' abort notices; every rank of the node runs the same collective). Peers on other
nodes cannot be reached with device memory by collectives here (MPI is not CUDA-aware): the
communicator refuses that before the call (``device_refusal``); the nccl backend is the way there.
Point-to-point sends of device memory go over CUDA IPC once it exists, and before that (or to
another node) through a host copy over the host route, which needs no handshake.

A sub-communicator gets an MPI communicator of its members on this node at split time (every
rank of the parent takes part in a split), so it can create a CUDA IPC transport of its own,
among its members only.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple, Optional

import numpy as np

from ..errors import UsageError
from .base import Request, Transport
from .devices import is_device_array
from .mpi import free_communicator, new_communicator


class DeviceSeed(NamedTuple):
    """What creating a CUDA IPC transport needs: an MPI communicator of exactly the ranks of this
    transport on this node, their ranks (this transport's numbering), the handshake timeout, and
    where messages over ``comm`` are counted when the node's host transport shares it."""
    comm: object
    ranks: list
    timeout: float
    ledger: object = None


class RoutedTransport(Transport):
    name = "routed"

    def __init__(self, rank: int, size: int, routes: dict, transports: list, node=None,
                 seed: Optional[DeviceSeed] = None):
        """``routes`` maps every peer (all ranks but ``rank``) to one of ``transports``;
        ``node`` is the ShmTransport of this node, if any; ``seed`` creates CUDA IPC (default:
        from ``node``)."""
        self.rank, self.size = rank, size
        self.routes = routes
        self.transports = transports
        self.node = node
        if seed is None and node is not None:
            seed = DeviceSeed(node.comm, node.ranks, node.setup_timeout, node.ledger)
        self.seed = seed
        self._own_seed = False   # the seed's MPI communicator was split for this transport
        self._seed_used = False  # a CUDA IPC set-up ran over it (messages may be in flight to it)
        self.local = node   # the transport of this node's peers (a view of it, in a sub-communicator)
        self._device = None
        # Host arrays only (the communicator checks): the node's window spans the whole job only
        # when every peer is on this node.
        self.window = node.window if node is not None and all(t is node for t in routes.values()) else None

    # ---- point to point: host arrays take the peer's route, device arrays CUDA IPC ----------------
    def isend(self, buf, peer: int, tag: int):
        if type(buf) is np.ndarray or not is_device_array(buf):
            return self.routes[peer].isend(buf, peer, tag)
        if self._device is None:
            return _BouncedSend(self.routes[peer], buf, peer, tag)
        return self._device.isend(buf, peer, tag)

    def isend_p2p(self, buf, peer: int, tag: int):
        if type(buf) is np.ndarray or not is_device_array(buf):
            return self.routes[peer].isend_p2p(buf, peer, tag)
        return self.isend(buf, peer, tag)

    def irecv(self, buf, peer: int, tag: int):
        if type(buf) is np.ndarray or not is_device_array(buf):
            return self.routes[peer].irecv(buf, peer, tag)
        if self._device is None:
            return _BouncedRecv(self.routes[peer], buf, peer, tag)
        return self._device.irecv(buf, peer, tag)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch, own=None):
        if type(buf) is np.ndarray or self._device is None:   # a device collective staged (created) it
            return self.routes[peer].irecv_reduce(buf, peer, tag, reduce, scratch, own)
        return self._device.irecv_reduce(buf, peer, tag, reduce, scratch, own)

    def probe(self, source, tag=None, context=0, skip=0):
        """The device route first (a CUDA collective's own messages), then the host routes
        (abort notices always travel there, and a peer already in a host collective sends there)."""
        device = [self._device] if self._device is not None else []
        if source is not None:
            for t in device + [self.routes[source]]:
                found = t.probe(source, tag, context, skip)
                if found is not None:
                    return found
            return None
        for t in device + self.transports:
            found = t.probe(None, tag, context, skip)
            if found is not None:
                return found
        return None

    def peer_gone(self, peer, as_rank=None):
        route = self.routes.get(peer)
        return None if route is None else route.peer_gone(peer, as_rank)

    @contextlib.contextmanager
    def stage(self, arrays):
        if arrays and is_device_array(arrays[0]) and self.routes:
            with self.device_transport().stage(arrays):
                yield
            return
        with contextlib.ExitStack() as stack:
            for t in self.transports:
                stack.enter_context(t.stage(arrays))
            yield

    # ---- the device route --------------------------------------------------------------------------
    def device_refusal(self, device: Optional[str]) -> Optional[str]:
        """Why collectives on memory of ``device`` ("cuda:k"; None: any) cannot run here, or None."""
        remote = sorted(p for p, t in self.routes.items() if t is not self.local)
        if remote:
            return (f"ranks {remote} are on other nodes, and CUDA tensors reach other nodes only through "
                    f"backend 'nccl' (this MPI is not CUDA-aware); backend 'ringcomm' carries them within "
                    f"a node, over CUDA IPC")
        if self.routes and self.seed is None:
            return "this communicator has no MPI communicator of its node's ranks to set up CUDA IPC over"
        if device is not None and self._device is not None and f"cuda:{self._device.device}" != device:
            return (f"this communicator's CUDA IPC transport lives on cuda:{self._device.device} (set up by its "
                    f"first CUDA call); every CUDA call of one communicator must use that device")
        return None

    def device_transport(self, timeout: Optional[float] = None, aborted=None):
        """The CUDA IPC transport of this node: created on first use, collectively over the node,
        on the current device; ``timeout`` bounds that handshake and ``aborted()`` (a reason, or
        None) releases it when a peer gave up."""
        if self._device is None:
            seed, why = self.seed, self.device_refusal(None)
            if why is not None:
                raise UsageError(f"rank {self.rank}: {why}")
            from .cuda_ipc import CudaIpcTransport
            self._seed_used = True
            self._device = CudaIpcTransport(seed.comm, seed.ranks, world_rank=self.rank, world_size=self.size,
                                            setup_timeout=seed.timeout if timeout is None else timeout,
                                            setup_aborted=aborted, timeout=seed.timeout, ledger=seed.ledger)
        return self._device

    def close_device(self) -> None:
        """Release the CUDA IPC transport's device memory (collective over the node: each rank
        frees its memory once every peer has closed its mappings). A later device call creates a
        new one."""
        device, self._device = self._device, None
        if device is not None:
            device.close()

    def allocate(self, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """An array in this node's shared memory (collective over the node), so ``stage`` and
        every send skip the copy; ordinary memory when no peer shares the node."""
        if self.node is not None:
            return self.node.allocate(nbytes, dtype)
        return np.empty(nbytes // np.dtype(dtype).itemsize, dtype)

    def describe(self, device: Optional[str] = None) -> dict:
        """{peer: transport name}. ``device="cuda"``: the route device memory takes now, per peer:
        "cuda_ipc" once that transport exists, else where point-to-point device sends bounce
        through host memory ("host copy over shm"/"... over mpi"). What actually carried the bytes
        of past calls: ``carried()``."""
        if device == "cuda":
            if self._device is not None:
                return {peer: self._device.name for peer in sorted(self.routes)}
            return {peer: f"host copy over {t.name}" for peer, t in sorted(self.routes.items())}
        return {peer: t.name for peer, t in sorted(self.routes.items())}

    def carried(self) -> dict:
        """Bytes this rank received from peers over CUDA IPC, by how they came (cuda_ipc.py):
        {"device": read from a peer's device memory, "host": bounced through host memory}."""
        return self._device.carried() if self._device is not None else {"device": 0, "host": 0}

    # ---- sub-communicators ---------------------------------------------------------------------
    def _remote(self):
        """The MPI transport to other nodes, or None. Known by not being ``local``, never by its
        place in ``transports``: a member alone on its node in a sub-communicator has only this
        one, and taking it for the node's would skip the MPI split its other members make
        (they would wait in MPI_Comm_split for it forever)."""
        return next((t for t in self.transports if t is not self.local), None)

    def split(self, members, color, key, context, slot=None):
        """Peers on this node through a view of the node's transport, the others through an MPI
        communicator split off this one's (collective: every rank calls it, members or not).
        This transport's ranks are its local transport's ranks, so members map straight across."""
        if not self.transports:   # a communicator of one rank: its splits have one rank too
            return None if members is None else RoutedTransport(0, 1, {}, [])
        local, remote = self.local, self._remote()
        split_remote = None if remote is None else remote.split(members, color, key, context, slot)
        seed = self._split_seed(members, color)
        if members is None:
            return None
        me = members.index(self.rank)
        on_node = [m for m in members if m == self.rank or self.routes[m] is local]
        split_local = local.split(members, color, key, context, slot) if len(on_node) > 1 else None
        routes = {i: (split_local if self.routes[m] is local else split_remote)
                  for i, m in enumerate(members) if i != me}
        sub = RoutedTransport(me, len(members), routes, [t for t in (split_local, split_remote) if t is not None],
                              seed=seed)
        sub._own_seed = seed is not None
        sub.local = split_local
        everyone_here = split_local is not None and all(t is split_local for t in routes.values())
        sub.window = split_local.window if everyone_here else None
        return sub

    def _split_seed(self, members, color) -> Optional[DeviceSeed]:
        """The sub-communicator's DeviceSeed: its members on this node, from an MPI split of this
        transport's node communicator (every rank of it calls split)."""
        if self.seed is None:
            return None
        from mpi4py import MPI
        inside = members is not None and len(members) > 1
        position = members.index(self.rank) if inside else 0
        sub_comm = new_communicator(lambda: self.seed.comm.Split(color if inside else MPI.UNDEFINED, position))
        if not inside:
            return None
        ranks = [i for i, m in enumerate(members) if m in self.seed.ranks]
        if len(ranks) < 2:
            free_communicator(sub_comm)
            return None
        return DeviceSeed(sub_comm, ranks, self.seed.timeout)

    def group(self, members, context):
        """``split`` for ``members`` alone: a view of the node's transport for members on this
        node, and an MPI communicator of the members (MPI_Comm_create_group) when some are on
        other nodes. Every member sees a remote member exactly when the members span nodes, so
        either all of them create the MPI communicator or none does."""
        if not self.transports:
            return RoutedTransport(0, 1, {}, [])
        local, remote = self.local, self._remote()
        me = members.index(self.rank)
        far = [m for m in members if m != self.rank and self.routes[m] is not local]
        group_remote = remote.group(members, context) if far else None
        near = [m for m in members if m != self.rank and self.routes[m] is local]
        group_local = local.group(members, context) if near else None
        routes = {i: (group_local if self.routes[m] is local else group_remote)
                  for i, m in enumerate(members) if i != me}
        # No DeviceSeed: CUDA IPC would be set up over an MPI communicator of the node's members,
        # which a group made by its members alone does not have; CUDA tensors go through host memory.
        sub = RoutedTransport(me, len(members), routes, [t for t in (group_local, group_remote) if t is not None])
        sub.local = group_local
        return sub

    def open_window(self, slot) -> None:
        """The window over the node's view, where the view reaches every member."""
        local = self.local
        if local is not None and self.window is None and all(t is local for t in self.routes.values()):
            local.open_window(slot)
            self.window = local.window

    def reserve_window_slots(self) -> int:
        """The node transport's free window slots, even where this communicator spans nodes: a
        split whose members all sit on one node takes its window from them (the node transport's
        ``window_of`` gives none to a split that reaches off the node)."""
        reserve = getattr(self.local, "reserve_window_slots", None)
        return 0 if reserve is None else reserve()

    def window_rounds(self, offered: int) -> int:
        rounds = getattr(self.local, "window_rounds", None)
        return 0 if rounds is None else rounds(offered)

    def release_window_slots(self, offered: int) -> None:
        if offered:
            self.local.release_window_slots(offered)

    def abort(self, reason: BaseException) -> None:
        for t in self.transports + ([self._device] if self._device else []):
            t.abort(reason)

    def leave(self) -> None:
        for t in self.transports:
            t.leave()
        self.window = None   # the node view's, let go with it
        # A split's seed goes back to MPI if CUDA IPC never sent on it: nothing can be in
        # flight to it then (transport/mpi.py new_communicator). Most jobs never make one.
        if self._own_seed and not self._seed_used:
            self._own_seed = False
            free_communicator(self.seed.comm)

    def retire(self) -> None:
        for t in self.transports:
            t.retire()

    def close(self) -> None:
        for t in self.transports + ([self._device] if self._device else []):
            t.close()

    def forget(self) -> None:
        """``close``, and the node's segments let go (ShmTransport.forget)."""
        self.close()
        self.window = None
        for t in self.transports:
            t.forget()


# ---- device memory through host memory (point to point before CUDA IPC exists, or across nodes) --
class _BouncedSend(Request):
    """A send of device memory from a host copy, taken now (the job's stream already waited for
    the caller's, core/streams.py), so the send does not read ``buf`` afterwards."""

    def __init__(self, route: Transport, buf, peer: int, tag: int):
        import cupy
        self.host = cupy.asnumpy(buf.reshape(-1).view(cupy.uint8))
        self.inner = route.isend(self.host, peer, tag)

    def wait(self, timeout):
        return self.inner.wait(timeout)

    def test(self):
        return self.inner.test()


class _BouncedRecv(Request):
    """A receive into host memory, copied to the device buffer when it completes."""

    def __init__(self, route: Transport, buf, peer: int, tag: int):
        self.buf = buf
        self.host = np.empty(buf.nbytes, np.uint8)
        self.inner = route.irecv(self.host, peer, tag)
        self.copied = False

    def _finish(self) -> bool:
        if not self.copied:
            import cupy
            self.buf.reshape(-1).view(cupy.uint8)[...] = cupy.asarray(self.host)
            self.copied = True
        return True

    def wait(self, timeout):
        return self.inner.wait(timeout) and self._finish()

    def test(self):
        return self.inner.test() and self._finish()

    def cancel(self) -> None:
        self.inner.cancel()
