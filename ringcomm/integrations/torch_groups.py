"""Which ringcomm Communicator each torch.distributed "ringcomm" process group runs on.

torch calls the backend's creator (registered with ``extended_api=True``, autoregister.py) for
the default group on every rank and for every other group on its members only, with
``_DistributedBackendOptions``: the group's store, rank, size, timeout, name (``group_id``) and
global ranks (empty for the default group).

- **The default group** gets the world Communicator: the one ``ringcomm.init_process_group``
  made (or was given), else ``ringcomm.init()`` when an MPI launcher started this process
  (mpirun: ``init.mpi_launched``), else one bootstrapped through the store torch hands over
  (``ringcomm.init_from_store``: torchrun, torch's test harness with env://, tcp://, file://).
  Its rank and size must be torch's, or the creator raises.
- **Every other group** (``new_group``, ``new_subgroups``, DeviceMesh dimensions, the groups of
  ``split_group``) gets a Communicator of its own, made from the world's by its members alone
  (``Communicator._group``: the context id derives from the group's name, which torch makes the
  same on every member). Groups therefore run concurrently with the world and with each other,
  each in its own issue order.
"""
from __future__ import annotations

import math
import os
import socket
import threading
from datetime import timedelta
from typing import Optional

import numpy as np
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ..errors import CommError, UsageError, bad_type, bad_value
from .autoregister import BACKEND, register as _register
from .torch_engine import Engine
from .torch_monitored import MonitoredBarrier
from .torch_work import seconds


class Shared:
    """One Communicator, the process groups that issue on it, the Engine that orders and
    completes their calls (torch_engine.py), and their monitored barrier (torch_monitored.py)."""

    def __init__(self, comm, owned: bool):
        self.comm, self.owned = comm, owned   # owned: made for torch, so closed with its last group
        self.engine = Engine(f"ringcomm-c10d-{comm.rank}", comm)
        self.monitor = MonitoredBarrier(comm)
        self.groups: list = []
        self.aborted = False
        self.lock = threading.Lock()

    def join(self, group) -> None:
        with self.lock:
            self.groups.append(group)
        self.retime()

    def leave(self, group) -> bool:
        """Forget ``group``; True when it was the last one."""
        with self.lock:
            if group in self.groups:
                self.groups.remove(group)
            return not self.groups

    def retime(self) -> None:
        # ringcomm's own deadline (which names the peer it waited for) must not cut a group's
        # longer timeout short; a group's shorter one is enforced as its calls settle
        # (torch_work.Pending.settle aborts the communicator).
        with self.lock:
            if self.groups:
                self.comm.timeout = max(g.timeout for g in self.groups)

    def abort(self, reason: str) -> None:
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
        self.comm.abort(reason)
        self.engine.fail_queued(CommError(f"not issued: {reason}"))


_WORLD: list = []     # the Shared of the default group, while it lives
_PREPARED: list = []  # (comm, owned) ringcomm.init_process_group made for the next default group


def world() -> Optional[Shared]:
    return _WORLD[-1] if _WORLD else None


def forget_world(shared: Shared) -> None:
    if _WORLD and _WORLD[-1] is shared:
        _WORLD.clear()


def _explicit(timeout) -> Optional[float]:
    """A group's own timeout in seconds; None when torch passed its 30-minute default (that group
    then takes the communicator's timeout, RINGCOMM_TIMEOUT or init's)."""
    return None if timeout is None or timeout == default_pg_timeout else seconds(timeout)


def create(opts, backend_options=None):
    """The creator torch calls (autoregister.py): a RingcommProcessGroup for ``opts``."""
    from .torch_backend import RingcommProcessGroup
    timeout = _explicit(opts.timeout)
    members = list(opts.global_ranks_in_group)
    if not members:
        comm, owned = _world_comm(opts, timeout)
        shared = Shared(comm, owned)
        _WORLD[:] = [shared]
        return RingcommProcessGroup(shared, opts.group_rank, opts.group_size, timeout, name=opts.group_id)
    parent = world()
    if parent is None:
        raise UsageError(f'torch.distributed backend "ringcomm": group {opts.group_id!r} needs a default group '
                         f'on "ringcomm" (init_process_group("ringcomm") first)')
    return group_on(parent, members, opts.group_id, opts.group_rank, opts.group_size, timeout)


def group_on(parent: Shared, members: list, name: str, rank: int, size: int, timeout: Optional[float]):
    """A process group of ``members`` (ranks of ``parent``'s communicator) on a communicator of
    its own; called by the members alone."""
    from .torch_backend import RingcommProcessGroup
    comm = parent.comm._group(members, str(name))
    if (comm.rank, comm.size) != (rank, size):
        comm.close()
        raise UsageError(f"ringcomm process group {name!r}: torch says rank {rank} of {size}, the group of "
                         f"{members} made rank {comm.rank} of {comm.size}")
    return RingcommProcessGroup(Shared(comm, owned=True), rank, size, timeout, name=name, ranks=members)


def _world_comm(opts, timeout: Optional[float]) -> tuple:
    """(the default group's Communicator, whether torch's group owns it)."""
    from ..init import init, init_from_store, mpi_launched
    if _PREPARED:
        comm, owned = _PREPARED.pop()
    elif mpi_launched():
        comm, owned = init(timeout=timeout), True
    else:
        comm, owned = init_from_store(opts.store, opts.group_rank, opts.group_size, timeout=timeout), True
    if (comm.rank, comm.size) != (opts.group_rank, opts.group_size):
        if owned:
            comm.close()
        raise UsageError(f'torch.distributed backend "ringcomm": init_process_group says rank {opts.group_rank} '
                         f'of {opts.group_size}, but the ringcomm communicator is rank {comm.rank} of {comm.size} '
                         f'(MPI started this job: let rank and world_size default, or match mpirun -n)')
    return comm, owned


def register() -> None:
    _register(dist)


# ---- ringcomm.init_process_group ----------------------------------------------------------------
def _rendezvous_store(comm, timeout: timedelta):
    """A TCPStore on rank 0, its address sent to the other ranks over the communicator itself."""
    host = os.environ.get("MASTER_ADDR")
    if host is None:
        single_node = getattr(comm, "node_count", 1) == 1
        host = "127.0.0.1" if single_node else socket.gethostname()
    store = None
    address = np.zeros(256, np.uint8)
    if comm.rank == 0:
        store = dist.TCPStore(host, int(os.environ.get("MASTER_PORT", 0)), comm.size, is_master=True,
                              timeout=timeout, wait_for_workers=False)
        text = f"{host} {store.port}".encode()
        address[:len(text)] = np.frombuffer(text, np.uint8)
    comm.broadcast(address, root=0)
    host, port = bytes(address).rstrip(b"\0").decode().split()
    if store is None:
        store = dist.TCPStore(host, int(port), comm.size, is_master=False, timeout=timeout)
    # Rank 0 must not run ahead and destroy the store (dist.destroy_process_group) before every
    # rank has connected: torch's init_process_group does not wait for them.
    comm.barrier()
    return store


def mpi_rendezvous(url: str, timeout: Optional[timedelta]):
    """torch's env:// rendezvous for a job mpirun started (autoregister.py): rank and size are
    MPI's; rank 0 serves a TCPStore whose address goes to the others over MPI. Yields (store,
    rank, size) once, as torch's handlers do. A rank or world_size in ``url`` must be MPI's."""
    from urllib.parse import parse_qs, urlparse

    from ..bootstrap import Bootstrap
    from ..init import start_mpi
    timeout = timeout or default_pg_timeout
    limit = timeout.total_seconds()
    # Every wait bounded by torch's timeout, as in ringcomm.init: MPI_Init (which waits for every
    # process of the job), then exchanges polled under it instead of MPI's blocking allgather and
    # bcast, where a rank that never called init_process_group held the others forever.
    world = start_mpi(limit, "init_process_group").COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    for name, mine in (("rank", rank), ("world_size", size)):
        if name in query and int(query[name]) != mine:
            raise UsageError(f"init_process_group got unexpected value for argument {name!r} (expected MPI's "
                             f"{mine}: mpirun started this job, rank {rank} of {size}; got {query[name]})")
    boot = Bootstrap(world, limit, call="init_process_group")
    hosts = boot.allgather(socket.gethostname(), "hosts")
    host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
    port = boot.allgather(None if store is None else store.port, "rank 0's store")[0]
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    # Rank 0 must not run ahead and destroy the store before every rank has connected.
    _mpi_barrier(boot.comm, limit, rank)
    boot.free()
    yield store, rank, size
    raise RuntimeError("Unable to perform re-rendezvous using env:// under mpirun")


def _mpi_barrier(world, timeout: float, rank: int) -> None:
    """A barrier over MPI bounded by ``timeout`` (MPI's own would wait forever), sleeping between polls."""
    import time
    request = world.Ibarrier()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise CommError(f"init_process_group (env:// under mpirun) on rank {rank}: not every rank connected "
                            f"to rank 0's store within {timeout:g} s")
        time.sleep(0.001)


def _check_timeout(timeout) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise bad_type("init_process_group", "timeout", "a number of seconds or None", type(timeout).__name__)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise bad_value("init_process_group", "timeout", "a finite number of seconds > 0", timeout)


def init_process_group(backend: Optional[str] = None, *, comm=None, timeout: Optional[float] = None):
    """Initialise torch.distributed with backend "ringcomm" under mpirun or torchrun; returns the
    world Communicator.

    ``backend`` picks the ringcomm backend under mpirun (as for ``ringcomm.init``); the
    torch.distributed backend is always "ringcomm". Pass ``comm`` to reuse an existing
    Communicator (it stays open after ``dist.destroy_process_group()``; one made here is closed
    then). ``timeout`` (seconds): the world group's timeout, and the communicator's. Under
    torchrun (no MPI) this is ``dist.init_process_group("ringcomm")``: the ranks meet in
    torchrun's store.
    """
    from ..init import mpi_launched
    if dist.is_initialized():
        raise UsageError("init_process_group got unexpected value for argument \"state\" (expected "
                         "torch.distributed not yet initialised, got an initialised default group)")
    _check_timeout(timeout)
    register()
    td = None if timeout is None else timedelta(seconds=timeout)
    if comm is None and not mpi_launched() and os.environ.get("MASTER_ADDR") and os.environ.get("WORLD_SIZE"):
        if backend not in (None, BACKEND):
            raise UsageError(f"init_process_group: backend {backend!r} runs over MPI, but this job was not started "
                             f"by mpirun; use backend None (ringcomm's own), or launch with mpirun")
        dist.init_process_group(backend=BACKEND, **({} if td is None else {"timeout": td}))
        return world().comm
    owned = comm is None
    if owned:
        from ..init import init
        comm = init(backend, timeout=timeout)
    td = td or timedelta(seconds=getattr(comm, "timeout", None) or default_pg_timeout.total_seconds())
    store = _rendezvous_store(comm, td)
    _PREPARED[:] = [(comm, owned)]
    try:
        dist.init_process_group(backend=BACKEND, store=store, rank=comm.rank, world_size=comm.size, timeout=td)
    except BaseException:
        _PREPARED.clear()
        raise
    return comm
