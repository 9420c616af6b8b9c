"""ringcomm.init(): a Communicator for the current ``mpirun`` or ``torchrun`` job.

Under mpirun nothing else is needed (no MASTER_ADDR): MPI supplies rank and size, and the
reference backends arrange their own rendezvous over it. Under torchrun (no MPI job: no PMI or
Open MPI variables) rank and size come from RANK and WORLD_SIZE and the ranks meet in
torchrun's store at MASTER_ADDR:MASTER_PORT (``init_from_store``: shared memory on one node).
``RINGCOMM_BACKEND`` picks the backend when the caller does not, so one training script
compares backends without edits; ``RINGCOMM_TIMEOUT`` sets the default deadline (seconds) of
every collective.

Launchers' variables are also read to refuse a job nobody can assemble: under srun without MPI
wired to Slurm (or torchrun's variables without its store) every process would initialise MPI
alone and get a world of its own, so N unsynchronised replicas would train; and an MPI job
whose torchrun variables say otherwise. See ``launcher_views``.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import socket
import stat
import sys
import threading
from dataclasses import dataclass
from typing import Mapping, Optional

from . import agreement, env
from .backends import NAMES, communicator_class
from .communicator import DEFAULT_TIMEOUT, Communicator
from .errors import UsageError, bad_type, bad_value
from .transport import polling


# ---- one init at a time -----------------------------------------------------------------------
_initialising = threading.Lock()   # guards _init_thread
_init_thread: Optional[threading.Thread] = None
_joined = False                    # an init of this process returned
_forked_from: Optional[int] = None   # the parent's pid, in a child forked after MPI or an init ran


def _note_fork() -> None:
    """After a fork: a child of a process that had started MPI (mpi4py.MPI imported: it starts MPI
    as it is imported) or joined the job cannot join it itself (``init`` refuses). A child given a
    store of its own (``init_from_store``: torch's MultiProcessTestCase forks its ranks) may."""
    global _forked_from
    if _forked_from is None and (_joined or "mpi4py.MPI" in sys.modules):
        _forked_from = os.getppid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def _one_at_a_time(call):
    """Refuse an init while another thread of this process is in one. Ranks pair their inits in
    the order they call them (each duplicates the job's communicator), so inits from two threads
    at once would pair differently on different ranks, and two threads would drive MPI_Init or
    MPI_COMM_WORLD together. The same thread may nest (init under torchrun calls init_from_store)."""
    @functools.wraps(call)
    def guarded(*args, **kwargs):
        global _init_thread, _joined
        me = threading.current_thread()
        with _initialising:
            if _init_thread is me:
                nested = True
            elif _init_thread is not None:
                raise UsageError(f"{call.__name__}: called from thread {me.name!r} while thread "
                                 f"{_init_thread.name!r} of this process is still in ringcomm.init. "
                                 f"Ranks pair their inits in the order they call them, so inits "
                                 f"from two threads at once would pair differently on different "
                                 f"ranks; call init from one thread, and give other threads comm.dup()")
            else:
                nested, _init_thread = False, me
        try:
            comm = call(*args, **kwargs)
            _joined = True
            return comm
        finally:
            if not nested:
                with _initialising:
                    _init_thread = None
    return guarded


@_one_at_a_time
def init(backend: Optional[str] = None, *, timeout: Optional[float] = None) -> Communicator:
    """Join the job launched by ``mpirun -n N`` and return its Communicator.

    ``backend``: "ringcomm" (default; ringcomm's algorithms over shared memory within a node
    and MPI between nodes), "mpi", "gloo" or "nccl". ``timeout``: seconds any one collective may
    take before it raises CommTimeoutError (default ``RINGCOMM_TIMEOUT`` or 300).
    Raises UsageError on every rank when torchrun's or Slurm's variables describe another job
    than MPI does (``launcher_views``).
    """
    if _forked_from is not None:
        raise UsageError(f"init: this process (pid {os.getpid()}) is a fork of pid {_forked_from}, which had "
                         f"started MPI or joined the job; the child's MPI state is a copy of its parent's, so it "
                         f"would join as the parent and its messages would reach the parent's peers (two "
                         f"children's all_reduces summed each other's data, and a parent's next all_reduce "
                         f"came out wrong). Only the processes the launcher started can join; a forked child (a "
                         f"DataLoader worker) works without one")
    backend = _backend(backend)
    timeout = _timeout(timeout)
    views = launcher_views()
    torchrun = _torchrun_store(views, backend, timeout)
    if torchrun is not None:
        return init_from_store(*torchrun, timeout=timeout)
    MPI = start_mpi(timeout)
    from .bootstrap import Bootstrap
    from .topology import Topology, node_name
    boot = Bootstrap(MPI.COMM_WORLD, timeout)   # every exchange until the transport exists is bounded
    try:
        _agree_with_launchers(boot, views)
        places = boot.allgather((socket.gethostname(), node_name()), "hosts and nodes")
        hosts = [host for host, _ in places]
        ranks_here = hosts.count(hosts[boot.rank])
        # before anything that depends on them (env.check_all runs there, on every rank at once)
        agreed = agreement.exchange(lambda text: boot.allgather(text, "settings"),
                                    agreement.local(backend, ranks_here))
        topology = Topology.from_names(boot.rank, [node for _, node in places])
        polling.set_ranks_here(ranks_here)
        world = boot.comm
        if backend != "ringcomm":
            comm = communicator_class(backend)(world, topology, timeout=timeout)
            comm.transport.ledger.merge(boot.ledger)   # init's exchanges ran over the same communicator
            comm.holders.on_clean_release(comm.transport.ledger.retire)
            return comm
        from .transport import factory
        transport = factory.build(world, topology, timeout, hosts=hosts, ledger=boot.ledger)
        comm = Communicator(transport, timeout=timeout,
                            local_rank=topology.local_rank, local_size=topology.local_size,
                            node_count=topology.node_count, topology=topology)
        # Once the world and its sub-communicators have closed, the node's segments go, and where
        # each closed cleanly its MPI communicators go back to MPI, if nothing sent on them is
        # left unreceived (transport/mpi.py retire_communicator).
        comm.holders.on_release(transport.forget)
        node = getattr(transport, "node", None)
        comm.holders.on_clean_release(boot.ledger.retire, *([node.ledger.retire] if node is not None else []))
        agreed.apply(comm.selector)
        _direct_reads_from(comm, comm.selector.tuning)
        return comm
    except BaseException:
        boot.free()   # a failed init leaves no MPI communicator behind
        raise


@_one_at_a_time
def init_from_store(store, rank: int, size: int, *, timeout: Optional[float] = None) -> Communicator:
    """A Communicator for a job with no MPI, whose ``size`` ranks all reach ``store`` (a
    torch.distributed Store: torchrun's, or the one torch hands a process group). Collective
    over them. Ranks on one host use shared memory bootstrapped through the store; ranks on
    several hosts raise UsageError naming mpirun (transport/factory.py ``build_from_store``)."""
    timeout = _timeout(timeout)
    global _from_store_inits
    import torch.distributed as dist

    from .transport import factory
    from .transport.store import StoreComm
    # Keys of their own for each init: torch hands the same store to an init_process_group after
    # destroy_process_group (torchrun's, under the same group name), and the ranks then read the
    # last init's handshakes, went out of step and timed out. Every rank counts its inits alike.
    _from_store_inits += 1
    store = dist.PrefixStore(f"ringcomm/init{_from_store_inits}/", store)
    settings = StoreComm(store, list(range(size)), rank, timeout, name="settings")
    agreed = agreement.exchange(settings.allgather, agreement.local("ringcomm", size))
    chosen = env.get("RINGCOMM_BACKEND") or "ringcomm"
    if chosen != "ringcomm":
        raise UsageError(f"init: RINGCOMM_BACKEND={chosen} runs over MPI, but this job was not started by "
                         f"mpirun; launch with mpirun, or unset RINGCOMM_BACKEND")
    transport, topology = factory.build_from_store(store, rank, size, timeout)
    polling.set_ranks_here(topology.local_size)   # one host: build_from_store refuses more
    comm = Communicator(transport, timeout=timeout, local_rank=topology.local_rank, local_size=topology.local_size,
                        node_count=topology.node_count, topology=topology)
    comm._store = store   # the node's later handshakes (allocate) still meet in it
    comm.holders.on_release(transport.forget)
    agreed.apply(comm.selector)
    _direct_reads_from(comm, comm.selector.tuning)
    return comm


def ranks_on_this_host(world) -> int:
    """The ranks of ``world`` on this machine (collective). How long waits poll before sleeping,
    and how the model prices oversubscription, depend on how many ranks share its cores: the
    real host's, so pretend nodes from RINGCOMM_NODE_ID still share them."""
    host = socket.gethostname()
    return sum(h == host for h in world.allgather(host))


# Set by MPICH's and Intel MPI's launchers (PMI), Open MPI's and PMIx-based ones (srun --mpi=pmix).
_MPI_LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
_store_inits = 0   # init_from_store calls on torchrun's store so far: each gets keys of its own
_from_store_inits = 0   # init_from_store calls so far, on any store: each gets keys of its own


def mpi_launched(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Was this process started by an MPI launcher (so MPI knows its job)?"""
    environ = os.environ if environ is None else environ
    return any(v in environ for v in _MPI_LAUNCH_VARIABLES)


def _torchrun_store(views: list, backend: str, timeout: float) -> Optional[tuple]:
    """(store, rank, size) when torchrun started this job and MPI did not; else None."""
    torchrun = next((v for v in views if v.launcher == "torchrun" and v.claims_company()), None)
    if torchrun is None or mpi_launched() or torchrun.rank is None or torchrun.size is None:
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not (port or "").isdigit():
        return None   # not torchrun's store either: launcher_problem refuses below
    if backend != "ringcomm":
        raise UsageError(f"init: backend {backend!r} runs over MPI, but torchrun started this job "
                         f"({torchrun.text}); launch it with mpirun, or use backend 'ringcomm', which "
                         f"meets its peers in torchrun's store")
    global _store_inits
    import datetime

    import torch.distributed as dist
    # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); without it rank 0 does,
    # as in torch's env:// rendezvous.
    master = torchrun.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(host, int(port), torchrun.size, master, timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    _store_inits += 1
    return dist.PrefixStore(f"ringcomm/init{_store_inits}/", store), torchrun.rank, torchrun.size


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


def start_mpi(timeout: Optional[float] = None, call: str = "ringcomm.init"):
    """Import mpi4py's MPI, asking for MPI_THREAD_MULTIPLE when ringcomm initialises MPI, and
    ending the process if MPI_Init has not returned after ``timeout`` seconds (bootstrap.py;
    ``call``: what the caller's program called, in the error's words).

    The progress thread runs async collectives while the caller may still use MPI, so anything
    below 'multiple' is only tolerable at 'serialized' (the communicator serialises its own calls).
    """
    import mpi4py
    from .bootstrap import mpi_init_deadline
    started = sys.modules.get("mpi4py.MPI")
    if started is not None and started.Is_initialized():
        MPI = started   # the program started MPI itself: nothing here can wait on the others
    else:
        orphan = inherited_launch(os.environ)
        if orphan is not None:
            raise UsageError(f"init: {orphan}")
        with mpi_init_deadline(timeout, call):
            if started is None:
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


def inherited_launch(environ: Mapping[str, str]) -> Optional[str]:
    """Why MPI cannot start here although MPICH's launcher variables are set, or None.

    PMI_FD names the socket mpirun's proxy gave the process it started. A process that one
    started in turn (multiprocessing's spawn, a DataLoader worker or a pool re-importing a script
    whose top level calls init) inherits the variables but not the socket, and MPICH's MPI_Init
    then ended it (exit 15, "PMI_Init returned -1") before Python could say why."""
    fd = environ.get("PMI_FD", "")
    if not fd.isdigit():
        return None
    try:
        if stat.S_ISSOCK(os.fstat(int(fd)).st_mode):
            return None
    except OSError:
        pass
    return (f"this process (pid {os.getpid()}) has mpirun's variables (PMI_RANK={environ.get('PMI_RANK', '?')}, "
            f"PMI_FD={fd}) but not its connection: it was started by one of mpirun's processes (a "
            f"multiprocessing spawn child, a DataLoader worker re-importing the script), not by mpirun, and "
            f"cannot join the MPI job. Call ringcomm.init only in the processes mpirun starts: put the "
            f"script's top level under `if __name__ == \"__main__\":`")


# ---- other launchers ----------------------------------------------------------------------------
_log = logging.getLogger("ringcomm.init")
_MPIRUN_HINT = ("ringcomm takes rank and size from MPI, or from torchrun with its store: launch with "
                "mpirun (for example `mpirun -n {n} python script.py`) or torchrun (which also sets "
                "MASTER_ADDR and MASTER_PORT)")


@dataclass(frozen=True)
class LauncherView:
    """What one launcher's variables say about this process."""
    launcher: str               # "torchrun" or "Slurm"
    rank: Optional[int]
    size: Optional[int]
    text: str                   # the variables as set, for messages: "RANK=1 WORLD_SIZE=2"

    def claims_company(self) -> bool:
        """Does it say this process is one of several?"""
        return (self.size or 1) > 1 or (self.rank or 0) > 0


# (launcher, rank variable, size variable, further variables checked as a (rank, size) pair)
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", None),
)


def launcher_views(environ: Optional[Mapping[str, str]] = None) -> list:
    """torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and Slurm's (SLURM_PROCID,
    SLURM_NTASKS) variables, parsed; a value that is not a rank or a count below/above what it
    pairs with raises UsageError naming the variable. Open MPI's, MPICH's and PMI's variables are
    MPI's own business: MPI reads them."""
    environ = os.environ if environ is None else environ
    views = []
    for launcher, rank_var, size_var, local in _LAUNCHERS:
        rank, size = _pair(environ, launcher, rank_var, size_var)
        if local is not None:
            local_rank, local_size = _pair(environ, launcher, *local)
            if local_size is not None and size is not None and local_size > size:
                raise UsageError(f"init: {local[1]}={local_size} exceeds {size_var}={size} ({launcher}'s "
                                 f"processes on this node cannot outnumber those of the job)")
        if rank is None and size is None:
            continue
        names = (rank_var, size_var) + (local or ())
        text = " ".join(f"{n}={environ[n].strip()}" for n in names if (environ.get(n) or "").strip())
        views.append(LauncherView(launcher, rank, size, text))
    return views


def _pair(environ, launcher: str, rank_var: str, size_var: str) -> tuple:
    rank = _count(environ, launcher, rank_var, 0, "a rank (an integer >= 0)")
    size = _count(environ, launcher, size_var, 1, "a number of processes (an integer >= 1)")
    if rank is not None and size is not None and rank >= size:
        raise UsageError(f"init: {rank_var}={rank} is not below {size_var}={size} ({launcher}'s rank "
                         f"must be less than its number of processes)")
    return rank, size


def _count(environ, launcher: str, name: str, least: int, expected: str) -> Optional[int]:
    text = (environ.get(name) or "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise UsageError(f"init: {name}={text!r}: expected {expected}; {launcher} sets it, and so may a "
                         f"shell or job script (unset it if this job is not started by {launcher})")
    return value


def launcher_problem(mpi_rank: int, mpi_size: int, views: list) -> Optional[str]:
    """Why the launchers' views cannot be this MPI job, or None.

    MPI alone while a launcher says the job has several processes: the silent world of one.
    MPI with several ranks: torchrun's view must match it exactly. Slurm's is not compared then:
    mpirun inside an allocation starts its per-node daemons with srun, so SLURM_PROCID and
    SLURM_NTASKS count those daemons, not the ranks.
    """
    if mpi_size == 1:
        crowd = [v for v in views if v.claims_company()]
        if not crowd:
            return None
        n = max(v.size or (v.rank or 0) + 1 for v in crowd)
        said = " and ".join(f"{v.launcher}'s variables ({v.text})" for v in crowd)
        slurm = (" Under Slurm, run mpirun inside the allocation (or srun with MPI wired to Slurm's "
                 "PMI, e.g. srun --mpi=pmi2)." if any(v.launcher == "Slurm" for v in crowd) else "")
        return (f"init: MPI started this process alone (rank 0 of an MPI world of 1), but {said} say "
                f"it is one of {n} processes. Each process would get a world of its own and {n} "
                f"unsynchronised copies would train. {_MPIRUN_HINT.format(n=n)}.{slurm}")
    for v in views:
        if v.launcher == "torchrun" and ((v.size is not None and v.size != mpi_size)
                                         or (v.rank is not None and v.rank != mpi_rank)):
            return (f"init: MPI says this is rank {mpi_rank} of {mpi_size}, but torchrun's variables say "
                    f"{v.text}. Launch with mpirun alone, or unset those variables if they were left "
                    f"over from another job. {_MPIRUN_HINT.format(n=mpi_size)}.")
    return None


def _agree_with_launchers(boot, views: list) -> None:
    """Raise the launcher problem on every rank (some ranks may not see one), before any other
    exchange (``boot``: bootstrap.Bootstrap); at RINGCOMM_DEBUG=info, say when this is a world
    of one."""
    mine = launcher_problem(boot.rank, boot.size, views)
    if boot.size == 1:
        if mine is not None:
            raise UsageError(mine)
    else:
        ranks_of: dict = {}
        for rank, text in enumerate(boot.allgather(mine, "launchers")):
            if text is not None:
                ranks_of.setdefault(text, []).append(rank)
        if ranks_of:
            raise UsageError(" | ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {text}"
                                        for text, rs in ranks_of.items()))
    if boot.size == 1:
        from .selection.selector import configure_debug_logging
        configure_debug_logging()
        said = " and ".join(f"{v.launcher}'s variables ({v.text})" for v in views)
        _log.info("init: a world of 1 process: MPI started this process alone, and %s", said or
                  "no torchrun or Slurm variables say otherwise")


def _direct_reads_from(comm: Communicator, tuning) -> None:
    """The sizes from which the shared-memory transport reads peers directly (CMA) instead of
    staging, for collectives and for sends: RINGCOMM_SHM_CMA_MIN / RINGCOMM_SHM_CMA_P2P_MIN if
    set, else what ``ringcomm.tune`` measured on this machine, else the transport's defaults.
    Every rank of a node reads the same tuning file, so they agree."""
    for attr, measured, variable in (("cma_min_bytes", tuning.cma_min, "RINGCOMM_SHM_CMA_MIN"),
                                     ("cma_p2p_min_bytes", tuning.cma_p2p_min, "RINGCOMM_SHM_CMA_P2P_MIN")):
        if measured is None or env.get(variable) is not None:
            continue
        for transport in (getattr(comm.transport, "routes", None) or {}).values():
            if hasattr(transport, attr):
                setattr(transport, attr, measured)
