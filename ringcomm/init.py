"""ringcomm.init(): a Communicator for the current ``mpirun`` job.

Nothing but mpirun is needed (no MASTER_ADDR, no torchrun): MPI supplies rank and size, and the
reference backends arrange their own rendezvous over it. ``RINGCOMM_BACKEND`` picks the backend
when the caller does not, so one training script compares backends without edits;
``RINGCOMM_TIMEOUT`` sets the default deadline (seconds) of every collective.
"""
from __future__ import annotations

import math
import socket
import sys
from typing import Optional

from . import env
from .backends import NAMES, communicator_class
from .communicator import DEFAULT_TIMEOUT, Communicator
from .errors import UsageError, bad_type, bad_value
from .transport import polling


def init(backend: Optional[str] = None, *, timeout: Optional[float] = None) -> Communicator:
    """Join the job launched by ``mpirun -n N`` and return its Communicator.

    ``backend``: "ringcomm" (default; ringcomm's algorithms over shared memory within a node
    and MPI between nodes), "mpi", "gloo" or "nccl". ``timeout``: seconds any one collective may
    take before it raises CommTimeoutError (default ``RINGCOMM_TIMEOUT`` or 300).
    """
    env.check_all()
    backend = _backend(backend)
    timeout = _timeout(timeout)
    MPI = _mpi()
    from .topology import discover
    world = MPI.COMM_WORLD.Dup()
    topology = discover(world)
    # How long waits poll before sleeping depends on how many ranks share this machine's cores
    # (the real host: pretend nodes from RINGCOMM_NODE_ID still share it).
    host = socket.gethostname()
    polling.set_ranks_here(sum(h == host for h in world.allgather(host)))
    try:
        if backend != "ringcomm":
            return communicator_class(backend)(world, topology, timeout=timeout)
        from .transport import factory
        return Communicator(factory.build(world, topology, timeout), timeout=timeout, local_rank=topology.local_rank,
                            local_size=topology.local_size, node_count=topology.node_count,
                            topology=topology)
    except BaseException:
        world.Free()   # a failed init leaves no MPI communicator behind
        raise


def _backend(backend) -> str:
    if backend is None:
        return env.get("RINGCOMM_BACKEND") or "ringcomm"
    if not isinstance(backend, str):
        raise bad_type("init", "backend", "a str or None", type(backend).__name__)
    if backend.lower() not in NAMES:
        raise bad_value("init", "backend", f"one of {', '.join(NAMES)}", backend)
    return backend.lower()


def _timeout(timeout) -> float:
    if timeout is None:
        return env.get("RINGCOMM_TIMEOUT") or DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise bad_type("init", "timeout", "a number of seconds or None", type(timeout).__name__)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise bad_value("init", "timeout", "a finite number of seconds > 0", timeout)
    return float(timeout)


def _mpi():
    """Import mpi4py's MPI, asking for MPI_THREAD_MULTIPLE when ringcomm initialises MPI.

    The progress thread runs async collectives while the caller may still use MPI, so anything
    below 'multiple' is only tolerable at 'serialized' (the communicator serialises its own calls).
    """
    import mpi4py
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled"}
        raise UsageError(f"init: MPI was initialised with thread level "
                         f"{names.get(MPI.Query_thread(), MPI.Query_thread())!r}, but ringcomm's progress "
                         f"thread calls MPI; set mpi4py.rc.thread_level = 'multiple' before importing "
                         f"mpi4py.MPI, or let ringcomm.init() import it")
    return MPI
