"""Build the transport a ringcomm Communicator runs over, from the MPI job and its topology.

``RINGCOMM_TRANSPORT`` chooses: ``auto`` (default) uses shared memory between ranks of one node
(per the topology, and actually on the same host) and MPI between nodes; ``mpi`` uses MPI for
every pair; ``shm`` is ``auto`` but fails at init unless every peer can be reached through
shared memory. ``describe(transport)`` says which transport serves each peer.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from typing import Optional

from .. import env
from ..errors import UsageError
from ..topology import Topology, node_name
from .base import Transport

CHOICES = ("auto", "mpi", "shm")


def choice() -> str:
    return env.get("RINGCOMM_TRANSPORT")


def build(mpi_comm, topology: Topology, timeout: float = 300.0, hosts: Optional[list] = None,
          ledger=None) -> Transport:
    """Collective over ``mpi_comm``: every rank calls it, with the same environment.
    ``timeout`` bounds every handshake of the transports' setup (the communicator's timeout).
    ``hosts``: every rank's hostname where the caller has gathered them already (init's bounded
    exchange: bootstrap.py), else gathered here. ``ledger``: where others count their messages
    over ``mpi_comm`` (transport/mpi.py Ledger); the node's communicator gets its own."""
    from .mpi import MPITransport, new_communicator
    from .routed import RoutedTransport
    mode = choice()
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if mode == "mpi":
        return MPITransport(mpi_comm, ledger=ledger)
    # Pretend nodes (RINGCOMM_NODE_ID) split a host; a node id reused on two hosts must not
    # join them, so a shared-memory group is (topology node, real host).
    hosts = mpi_comm.allgather(socket.gethostname()) if hosts is None else hosts
    group_of = [(topology.node_of[r], hosts[r]) for r in range(size)]
    local = [r for r in range(size) if group_of[r] == group_of[rank]]
    color = min(local)
    with _watchdog("the node split (MPI_Comm_split)", timeout, rank):
        node_comm = new_communicator(lambda: mpi_comm.Split(color=color, key=rank),   # every rank takes part
                                     f"init on rank {rank}: the node split")
    if mode == "shm":
        remote = [r for r in range(size) if group_of[r] != group_of[rank]]
        if remote:
            node_comm.Free()
            raise UsageError(f"RINGCOMM_TRANSPORT=shm but ranks {remote} are not on the node of "
                             f"rank {rank}; use auto or mpi")
    if len(local) == 1:
        node_comm.Free()
        return MPITransport(mpi_comm, ledger=ledger)
    from .shm import ShmTransport
    shm = ShmTransport(node_comm, local, world_rank=rank, world_size=size, setup_timeout=timeout)
    if len(local) == size:
        return RoutedTransport(rank, size, {p: shm for p in range(size) if p != rank}, [shm], node=shm)
    mpi = MPITransport(mpi_comm, ledger=ledger)
    routes = {p: (shm if p in shm.local else mpi) for p in range(size) if p != rank}
    return RoutedTransport(rank, size, routes, [shm, mpi], node=shm)


def build_from_store(store, rank: int, size: int, timeout: float = 300.0) -> tuple:
    """(transport, topology) for a job that has no MPI, only a torch.distributed Store every rank
    reaches (torchrun, torch's test harness): collective over the ``size`` ranks.

    Ranks on one host talk through shared memory, bootstrapped through the store (store.py).
    Ranks on several nodes are refused at init, on every rank: between nodes ringcomm's path is
    MPI, which a job not started by mpirun does not have."""
    from .routed import RoutedTransport
    from .store import StoreComm
    world = StoreComm(store, list(range(size)), rank, timeout, name="world")
    names = world.allgather(f"{node_name()}\0{socket.gethostname()}")
    topology = Topology.from_names(rank, [n.split("\0")[0] for n in names])
    if len(set(names)) > 1:
        nodes = sorted(set(n.split("\0")[0] for n in names))
        raise UsageError(f"init: the {size} ranks of this job run on {len(nodes)} nodes ({', '.join(nodes)}), "
                         f"but it was not started by mpirun, and ringcomm reaches other nodes only through "
                         f"MPI (torch's store bootstraps shared memory within one node). Launch with mpirun "
                         f"(for example `mpirun -n {size} -ppn {topology.local_size} -hosts "
                         f"{','.join(nodes)} python script.py`), or use torch's gloo backend across nodes")
    if choice() == "mpi":
        raise UsageError("init: RINGCOMM_TRANSPORT=mpi, but this job was not started by mpirun (it has "
                         "no MPI); launch with mpirun, or use RINGCOMM_TRANSPORT=auto or shm")
    if size == 1:
        return RoutedTransport(0, 1, {}, []), topology
    from .shm import ShmTransport
    node = StoreComm(store, list(range(size)), rank, timeout, name="node", payloads=True)
    shm = ShmTransport(node, list(range(size)), world_rank=rank, world_size=size, setup_timeout=timeout)
    return RoutedTransport(rank, size, {p: shm for p in range(size) if p != rank}, [shm], node=shm), topology


def describe(transport: Transport) -> dict:
    """{peer: transport name} for every peer of this rank."""
    if hasattr(transport, "describe"):
        return transport.describe()
    return {p: transport.name for p in range(transport.size) if p != transport.rank}


@contextlib.contextmanager
def _watchdog(what: str, timeout: Optional[float], rank: int):
    """Around a blocking MPI call of init's (MPI is up; nothing can poll it): if it has not
    returned after ``timeout`` seconds, say so on stderr and end the job (MPI_Abort), since no
    exception can leave it. A rank late to init's last exchange can go on alone into the node
    split after its peers gave up (bootstrap.py), and waited there forever."""
    if timeout is None:
        yield
        return
    returned = threading.Event()

    def watch() -> None:
        if returned.wait(timeout):
            return
        sys.stderr.write(f"ringcomm: init on rank {rank}: {what} has not returned after {timeout:g} s (the init "
                         f"timeout): a process of the job never reached it, gave up, or is stopped; ending the job\n")
        sys.stderr.flush()
        # The launcher forwards a process's stderr through its proxy, which MPI_Abort ends: right
        # after the write, the reason was lost under load (make test: exit 1, stderr empty).
        time.sleep(0.5)
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(1)
        os._exit(1)   # not reached: MPI_Abort ends this process too
    threading.Thread(target=watch, name="ringcomm-init-watchdog", daemon=True).start()
    try:
        yield
    finally:
        returned.set()
