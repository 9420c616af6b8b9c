"""Collective benchmark in the spirit of nccl-tests: time, algbw, busbw and #wrong per size.

    mpirun -n 2 python benchmarks/allreduce_perf.py -b 8 -e 256M -f 2 \
        --backend ringcomm,mpi,gloo --algorithm auto,ring,tree --collective all_reduce

Sizes are the total buffer in bytes, as in nccl-tests: the whole vector for all_reduce and
broadcast, the gathered output for all_gather and gather, the input for reduce_scatter, scatter
and all_to_all (each rank's), the message for sendrecv (every rank sends to its right neighbour
and receives from its left one at once). ``--tensor numpy,torch`` runs every ringcomm
configuration on numpy arrays and on torch tensors, labelled ``ringcomm[torch]``: torch tensors
are what DDP and torch users pass, so they are allocated by torch (``torch.empty``), not made
views of numpy's memory: the two allocators back large buffers differently (numpy asks for
transparent huge pages, torch only under THP_MEM_ALLOC_ENABLE=1, which ``import ringcomm`` sets
unless it is set already: core/hugepages.py), and a CMA read's speed depends on it. For every size all
backend/algorithm configurations run one after another (interleaved, not sweep after sweep), so
that noise from a busy machine hits them alike; ``--rounds`` repeats that interleaving and reports
the median round. Time is the mean over ``-n`` back-to-back calls, taken as the maximum across
ranks. busbw = algbw x the nccl-tests factor of the collective (``bus_factor``).

Besides the backends of ``ringcomm.init`` two rows help read the others:
- ``floor``: one local in-place ``x += y`` of the size, on every rank at once: the memory
  bandwidth floor a reducing collective cannot beat on one node; and ``floor/copy``, one
  ``x[:] = y``, the price of each extra pass a transport makes over the data (staging, bounce).
- backend ``mpi4py``: MPI's own collective called straight through mpi4py, no ringcomm in the
  path (a backend "mpi" of ringcomm.init should land close to it). With ``--tensor`` torch also
  ``mpi4py[torch]``: the same calls on the memory the torch rows use, their reference. A
  transfer MPICH makes by CMA costs what that memory's pages cost to pin and copy (1 MiB
  send/recv: 25-74 us on torch's memory against 73-87 on numpy's over twelve runs;
  docs/performance.md, round forty-six), so a torch row over MPI on numpy's memory measured the
  allocators as much as the library.
A backend that cannot start is reported as ``backend X unavailable: <reason>`` and skipped.

``--split parity`` runs every collective on the two halves of a split by rank parity at once
(``comm.split(rank % 2)``, ``MPI_Comm_split`` for mpi4py), as tensor-parallel groups beside data
parallelism do; with ranks told they sit on two nodes (RINGCOMM_NODE_ID: even ranks on one, odd
on the other) each half is one node of a job that spans two. Rows then show a half's rank count.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "gather", "scatter",
               "sendrecv")
SPLIT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")   # the buffer splits per rank
DTYPES = ("float32", "float64", "int32", "int64")
SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw, as each collective's own file states it (sendrecv: 1)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"bus_factor got unexpected value for argument \"collective\" "
                         f"(expected one of {', '.join(COLLECTIVES)}, got {collective!r})")
    from ringcomm import collectives
    return collectives.get("send" if collective == "sendrecv" else collective).bus_factor(n)


def parse_size(text: str) -> int:
    """'8', '1K', '64M', '1G' (binary units) -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in SUFFIX and t[-1:] else ""
    number = t[:-1] if unit else t
    try:
        value = float(number) * SUFFIX[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 8, 1K, 64M or 1G, got {text!r}") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole number of bytes, got {text!r}")
    return int(value)


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= SUFFIX[unit] and nbytes % SUFFIX[unit] == 0:
            return f"{nbytes // SUFFIX[unit]}{unit}"
    return str(nbytes)


BACKENDS = ("ringcomm", "mpi", "gloo", "nccl", "mpi4py")


def sweep(begin: int, end: int, factor: float, step: int = 0) -> list[int]:
    if factor <= 1 and step <= 0:
        raise ValueError("sweep needs -f > 1 or -i > 0, or the sizes never grow")
    if begin > end:
        raise ValueError(f"-b ({begin} bytes) is above -e ({end} bytes): no size to measure")
    sizes, s = [], begin
    while s <= end:
        sizes.append(s)
        s = s + step if step > 0 else int(s * factor)
    return sizes


def elements(collective: str, nbytes: int, itemsize: int, n: int) -> int:
    """Elements of the total buffer: a multiple of n where the collective splits it per rank."""
    count = nbytes // itemsize
    if collective in SPLIT:
        count -= count % n
    return count


# ---- correctness data: small integers, so every sum is exact in every dtype -------------------
def pattern(count: int, dtype, offset: int = 0) -> np.ndarray:
    return ((np.arange(offset, offset + count) % 13) + 1).astype(dtype)


def chunk(count: int, parts: int, i: int) -> tuple[int, int]:
    lo, hi = i * count // parts, (i + 1) * count // parts
    return lo, hi - lo


@dataclass
class Case:
    """The buffers of one collective at one size on this rank, and how to check them."""
    collective: str
    count: int
    dtype: np.dtype
    rank: int
    n: int
    arena: Optional[np.ndarray] = None   # uint8 memory to carve the buffers from (else np.empty)
    torch_owned: bool = False            # allocated by torch.empty (x and out are numpy views of it)
    x: np.ndarray = field(init=False)
    out: Optional[np.ndarray] = field(init=False, default=None)

    def __post_init__(self):
        c = self.collective
        per = self.count // self.n
        used = 0

        def empty(k: int) -> np.ndarray:
            nonlocal used
            if self.torch_owned:
                import torch
                return torch.empty(k, dtype=getattr(torch, self.dtype.name)).numpy()
            if self.arena is None:
                return np.empty(k, self.dtype)
            nbytes = k * self.dtype.itemsize
            view = self.arena[used:used + nbytes].view(self.dtype)
            used += -(-nbytes // 64) * 64
            return view
        if c in ("all_gather", "gather"):
            self.x, self.out = empty(per), empty(self.count)
        elif c in ("reduce_scatter", "scatter"):
            self.x, self.out = empty(self.count), empty(per)
        elif c in ("all_to_all", "sendrecv"):
            self.x, self.out = empty(self.count), empty(self.count)
        else:
            self.x = empty(self.count)
        self.tensors = None

    def as_torch(self) -> "Case":
        """The same buffers as torch tensors (views of the same memory, whoever allocated it), made once."""
        if self.tensors is None:
            import torch
            self.tensors = Case.__new__(Case)
            self.tensors.__dict__.update(self.__dict__)
            self.tensors.x = torch.from_numpy(self.x)
            self.tensors.out = None if self.out is None else torch.from_numpy(self.out)
        return self.tensors

    def fill(self) -> None:
        c, r = self.collective, self.rank
        if c in ("all_reduce", "reduce_scatter"):
            np.multiply(pattern(self.x.size, self.dtype), r + 1, out=self.x)
        elif c in ("all_gather", "gather"):
            self.x[...] = pattern(self.x.size, self.dtype, offset=r * self.x.size)
        elif c in ("all_to_all", "sendrecv"):   # block j of rank r: pattern at offset r * count + j
            self.x[...] = pattern(self.x.size, self.dtype, offset=r * self.count)
        else:   # broadcast and scatter from rank 0
            self.x[...] = pattern(self.x.size, self.dtype) if r == 0 else 0
        if self.out is not None:
            self.out[...] = 0

    def wrong(self) -> int:
        c, n = self.collective, self.n
        if c == "all_reduce":
            return int(np.count_nonzero(self.x != pattern(self.x.size, self.dtype) * (n * (n + 1) // 2)))
        if c == "reduce_scatter":
            off, k = chunk(self.count, n, self.rank)
            return int(np.count_nonzero(self.out != pattern(k, self.dtype, off) * (n * (n + 1) // 2)))
        if c == "all_gather" or (c == "gather" and self.rank == 0):
            return int(np.count_nonzero(self.out != pattern(self.count, self.dtype)))
        if c == "gather":
            return 0
        if c == "scatter":
            off, k = chunk(self.count, n, self.rank)
            return int(np.count_nonzero(self.out != pattern(k, self.dtype, off)))
        if c == "all_to_all":
            per = self.count // n
            want = np.concatenate([pattern(per, self.dtype, offset=j * self.count + self.rank * per) for j in range(n)])
            return int(np.count_nonzero(self.out != want))
        if c == "sendrecv":
            left = (self.rank - 1) % n
            return int(np.count_nonzero(self.out != pattern(self.count, self.dtype, offset=left * self.count)))
        return int(np.count_nonzero(self.x != pattern(self.x.size, self.dtype)))


# ---- backends: each returns call(case) running the collective once -------------------------
class Unavailable(Exception):
    pass


def ringcomm_call(comm, collective: str, algorithm: Optional[str], torch_tensors: bool = False
                  ) -> Callable[[Case], None]:
    call = _ringcomm_call(comm, collective, algorithm)
    if torch_tensors:
        return lambda c: call(c.as_torch())
    return call


def _ringcomm_call(comm, collective: str, algorithm: Optional[str]) -> Callable[[Case], None]:
    rank, n = comm.rank, comm.size
    if collective == "all_reduce":
        return lambda c: comm.all_reduce(c.x, algorithm=algorithm)
    if collective == "all_gather":
        return lambda c: comm.all_gather(c.out, c.x, algorithm=algorithm)
    if collective == "reduce_scatter":
        return lambda c: comm.reduce_scatter(c.out, c.x, algorithm=algorithm)
    if collective == "all_to_all":
        return lambda c: comm.all_to_all(c.out, c.x, algorithm=algorithm)
    if collective == "gather":
        return lambda c: comm.gather(c.out if rank == 0 else None, c.x, 0, algorithm=algorithm)
    if collective == "scatter":
        return lambda c: comm.scatter(c.out, c.x if rank == 0 else None, 0, algorithm=algorithm)
    if collective == "sendrecv":
        def sendrecv(c):
            work = comm.send(c.x, (rank + 1) % n, async_op=True)
            comm.recv(c.out, (rank - 1) % n)
            work.wait()
        return sendrecv
    return lambda c: comm.broadcast(c.x, 0, algorithm=algorithm)


def persistent_call(comm, torch_tensors: bool) -> Callable[[Case], None]:
    """``comm.all_reduce_init`` once per case, then ``p()`` per call (MPI_Allreduce_init's idea)."""
    plans: dict = {}

    def call(c):
        c = c.as_torch() if torch_tensors else c
        plan = plans.get(id(c))
        if plan is None or plan[0] is not c:
            plan = plans[id(c)] = (c, comm.all_reduce_init(c.x))
        plan[1]()
    return call


def mpi4py_call(mpi_comm, collective: str) -> Callable[[Case], None]:
    from mpi4py import MPI
    rank, n = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if collective == "all_reduce":
        return lambda c: mpi_comm.Allreduce(MPI.IN_PLACE, c.x, op=MPI.SUM)
    if collective == "all_gather":
        return lambda c: mpi_comm.Allgather(c.x, c.out)
    if collective == "reduce_scatter":
        return lambda c: mpi_comm.Reduce_scatter_block(c.x, c.out, op=MPI.SUM)
    if collective == "all_to_all":
        return lambda c: mpi_comm.Alltoall(c.x, c.out)
    if collective == "gather":
        return lambda c: mpi_comm.Gather(c.x, c.out if rank == 0 else None, root=0)
    if collective == "scatter":
        return lambda c: mpi_comm.Scatter(c.x if rank == 0 else None, c.out, root=0)
    if collective == "sendrecv":
        return lambda c: mpi_comm.Sendrecv(c.x, (rank + 1) % n, 0, c.out, (rank - 1) % n, 0)
    return lambda c: mpi_comm.Bcast(c.x, root=0)


def open_backend(name: str, world):
    """The communicator of one backend, opened on every rank or on none."""
    error = ""
    comm = None
    try:
        if name == "mpi4py":
            comm = world.Dup()
        else:
            import ringcomm
            comm = ringcomm.init(backend=name)
    except Exception as exc:   # reported as a row, never fatal: the other backends still run
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    errors = world.allgather(error)
    if any(errors):
        if comm is not None and hasattr(comm, "close"):
            try:
                comm.close()
            except Exception:
                pass
        first = next(e for e in errors if e)
        raise Unavailable(first)
    return comm


@dataclass
class Config:
    backend: str
    algorithm: str          # "auto", a forced ringcomm algorithm, or "native" for other backends
    call_for: Callable      # collective -> call(case)
    chooser: Optional[Callable] = None   # () -> the algorithm the last call ran (auto rows)
    arena: Optional[np.ndarray] = None   # the buffers live here (transport memory), not np.empty
    comm: object = None                  # the ringcomm communicator, for ringcomm rows
    torch_owned: bool = False            # runs on torch tensors, in memory torch allocated

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.algorithm}"


def build_configs(args, world) -> tuple[list[Config], list[str]]:
    configs, notes = [], []
    for backend in args.backends:
        try:
            comm = open_backend(backend, world)
        except Unavailable as exc:
            notes.append(f"backend {backend} unavailable: {exc}")
            continue
        if args.split:   # parity: every rank's half, made on every rank at once
            parity = world.Get_rank() % 2
            comm = comm.Split(parity, world.Get_rank()) if backend == "mpi4py" else comm.split(parity)
        if backend == "mpi4py":
            configs.append(Config(backend, "native", lambda c, m=comm: mpi4py_call(m, c)))
            if "torch" in args.tensors:   # the torch rows' reference: MPI on the memory they use
                configs.append(Config(f"{backend}[torch]", "native", lambda c, m=comm: mpi4py_call(m, c),
                                      torch_owned=True))
            continue
        if getattr(comm, "backend", backend) != "ringcomm":
            # A reference backend runs its own library's algorithm; algorithm= is ringcomm's.
            configs.append(Config(backend, "native", lambda c, m=comm: ringcomm_call(m, c, None)))
            continue
        for kind in args.tensors:
            label = backend if kind == "numpy" else f"{backend}[torch]"
            for algorithm in args.algorithms:
                if algorithm == "persistent":
                    configs.append(Config(label, algorithm, lambda c, m=comm, t=kind == "torch": persistent_call(m, t),
                                          lambda m=comm: last_algorithm(m), comm=comm, torch_owned=kind == "torch"))
                    continue
                forced = None if algorithm == "auto" else algorithm
                configs.append(Config(label, algorithm,
                                      lambda c, m=comm, a=forced, t=kind == "torch": ringcomm_call(m, c, a, t),
                                      (lambda m=comm: last_algorithm(m)) if forced is None else None, comm=comm,
                                      torch_owned=kind == "torch"))
        if args.transport_buffers:
            allocate = getattr(comm.transport, "allocate", None)
            if allocate is None:
                notes.append(f"backend {backend}: --transport-buffers skipped: its transport "
                             f"{comm.transport.name} has no allocate()")
                continue
            # Room for the largest case (all_gather: x + out) in one allocation, made on every rank.
            arena = allocate(2 * args.maxbytes + 256)
            configs.append(Config(backend + "+tbuf", "auto", lambda c, m=comm: ringcomm_call(m, c, None),
                                  lambda m=comm: last_algorithm(m), arena, comm=comm))
        if args.empty_buffers:
            import ringcomm
            arena = ringcomm.empty(2 * args.maxbytes + 256, np.uint8)
            configs.append(Config(backend + "+empty", "auto", lambda c, m=comm: ringcomm_call(m, c, None),
                                  lambda m=comm: last_algorithm(m), arena, comm=comm))
    return configs, notes


def last_algorithm(comm) -> str:
    """What the communicator's latest call ran (its flight recorder says): sendrecv's last call
    is a recv, which runs no algorithm but point-to-point messages."""
    from ringcomm.diagnostics.flight_recorder import P2PEntry
    entries = comm.recorder.entries
    if not entries:
        return ""
    return "send/recv" if isinstance(entries[-1], P2PEntry) else (entries[-1].algorithm or "")


def algorithm_usable(config: Config, collective: str) -> Optional[str]:
    """None if the config can run ``collective``, else why not."""
    if config.algorithm == "persistent":
        return None if collective == "all_reduce" else "persistent calls are all_reduce_init only"
    if collective == "sendrecv" and config.algorithm not in ("auto", "native"):
        return "sendrecv has no algorithms (auto runs it)"
    if config.backend == "mpi4py" or config.algorithm in ("auto", "native"):
        return None
    from ringcomm import algorithms
    if config.algorithm in algorithms.names(collective, config.comm.transport):
        return None
    if config.algorithm in algorithms.names(collective):
        return (f"{collective} algorithm {config.algorithm!r} needs ranks that share memory; the "
                f"{config.comm.transport.name} transport of this job offers no window")
    return f"{collective} has no algorithm {config.algorithm!r} (it has: {', '.join(algorithms.names(collective))})"


# ---- timing ------------------------------------------------------------------------------
def time_calls(world, fn: Callable[[], None], warmup: int, iters: int) -> float:
    """Mean seconds per call of ``iters`` back-to-back calls, maximum across ranks."""
    for _ in range(warmup):
        fn()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - t0) / iters
    return world.allreduce(mine, op=_mpi_max())


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX


def floor_times(world, count: int, dtype, warmup: int, iters: int) -> tuple[float, float]:
    """(x += y, x[:] = y) on every rank at once: the reduce floor, and one copy to price staging."""
    x, y = np.ones(count, dtype), np.ones(count, dtype)
    add = time_calls(world, lambda: np.add(x, y, out=x), warmup, iters)
    return add, time_calls(world, lambda: np.copyto(x, y), warmup, iters)


@dataclass
class Row:
    collective: str
    size: int               # bytes of the total buffer
    count: int              # elements of the total buffer
    dtype: str
    ranks: int
    backend: str
    algorithm: str
    chosen: str             # what auto picked ("" otherwise)
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int
    x_floor: float          # time / floor time at this size
    rounds_us: list = field(default_factory=list)


def measure_size(world, collective, nbytes, dtype, configs, args, rank, n) -> list[Row]:
    count = elements(collective, nbytes, np.dtype(dtype).itemsize, n)
    size = count * np.dtype(dtype).itemsize
    if count == 0 or (collective in SPLIT and count < n):
        return []
    plain = Case(collective, count, np.dtype(dtype), rank, n)
    owned = Case(collective, count, np.dtype(dtype), rank, n, torch_owned=True) if any(
        cfg.torch_owned for cfg in configs) else None
    cases = {cfg.label: Case(collective, count, np.dtype(dtype), rank, n, cfg.arena) if cfg.arena is not None
             else owned if cfg.torch_owned else plain for cfg in configs}
    calls = [(cfg, cfg.call_for(collective), cases[cfg.label]) for cfg in configs]
    wrong = {}
    for cfg, call, case in calls:   # correctness first, on fresh data (also the first warm-up call)
        case.fill()
        call(case)
        wrong[cfg.label] = world.allreduce(case.wrong())
    for case in {id(c): c for c in cases.values()}.values():
        # Timed on zeros: thousands of back-to-back sums of real data overflow to inf, and
        # inf/NaN arithmetic is slow on some CPUs; zeros cost the same as any finite data.
        case.x[...] = 0
        if case.out is not None:
            case.out[...] = 0
    samples: dict[str, list[float]] = {cfg.label: [] for cfg, *_ in calls}
    ran: dict[str, str] = {}
    floors, copies = [], []
    iters = iterations(args, size)
    for r in range(args.rounds):
        # Each round starts one config further on, so that no config always runs first after
        # the floor (or always right after gloo's threads); every position is shared out.
        for cfg, call, case in calls[r % len(calls):] + calls[:r % len(calls)]:
            samples[cfg.label].append(time_calls(world, lambda: call(case), args.warmup, iters))
            if cfg.chooser:
                ran[cfg.label] = cfg.chooser()
        add, copy = floor_times(world, count, dtype, args.warmup, iters)
        floors.append(add)
        copies.append(copy)
    floor, copy = statistics.median(floors), statistics.median(copies)
    factor = bus_factor(collective, n)
    rows = [Row(collective, size, count, dtype, n, "floor", "x+=y", "", floor * 1e6, size / floor / 1e9,
                float("nan"), 0, 1.0, [f * 1e6 for f in floors]),
            Row(collective, size, count, dtype, n, "floor", "copy", "", copy * 1e6, size / copy / 1e9,
                float("nan"), 0, copy / floor, [c * 1e6 for c in copies])]
    for cfg, *_ in calls:
        t = statistics.median(samples[cfg.label])
        chosen = ran.get(cfg.label, "")
        rows.append(Row(collective, size, count, dtype, n, cfg.backend, cfg.algorithm, chosen, t * 1e6,
                        size / t / 1e9, size / t / 1e9 * factor, wrong[cfg.label], t / floor,
                        [s * 1e6 for s in samples[cfg.label]]))
    return rows


def iterations(args, nbytes: int) -> int:
    """-n, cut down for big sizes when --time-budget is set so a sweep stays bounded."""
    if args.iter_bytes <= 0:
        return args.iters
    return max(args.min_iters, min(args.iters, args.iter_bytes // max(nbytes, 1)))


# ---- output ------------------------------------------------------------------------------
HEADER = (f"{'size':>10} {'count':>11} {'backend/algorithm':<40} {'time(us)':>11} {'algbw':>8} "
          f"{'busbw':>8} {'xfloor':>7} {'#wrong':>7}")


def format_row(r: Row) -> str:
    label = f"{r.backend}/{r.algorithm}" + (f" ({r.chosen})" if r.chosen else "")
    busbw = "-" if r.backend == "floor" else f"{r.busbw_gbs:8.3f}"
    wrong = "-" if r.backend == "floor" else str(r.wrong)
    return (f"{r.size:>10} {r.count:>11} {label:<40} {r.time_us:>11.1f} {r.algbw_gbs:>8.3f} "
            f"{busbw:>8} {r.x_floor:>7.2f} {wrong:>7}")


def summary(rows: list[Row]) -> list[str]:
    """Ratios the performance targets are stated in, and whether auto ever lost to every forced."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault((r.collective, r.size), {})[f"{r.backend}/{r.algorithm}"] = r
    for (collective, size), group in sorted(by.items()):
        auto = group.get("ringcomm/auto")
        if auto is None:
            continue
        parts = [f"{collective} {format_size(size):>5}: auto({auto.chosen}) {auto.time_us:.1f} us"]
        for label, r in sorted(group.items()):
            if r.algorithm == "native" and not r.backend.endswith("[torch]"):   # auto runs on numpy's memory
                parts.append(f"busbw x{auto.busbw_gbs / r.busbw_gbs:.2f} vs {r.backend}, "
                             f"time x{auto.time_us / r.time_us:.2f}")
        parts.append(f"{auto.x_floor:.2f}x floor")
        forced = [r for label, r in group.items() if r.backend == "ringcomm" and r.algorithm not in ("auto", "persistent")]
        if forced:
            slowest = max(forced, key=lambda r: r.time_us)
            if auto.time_us <= slowest.time_us:
                verdict = "ok"
            elif auto.chosen == slowest.algorithm:   # one schedule timed twice: the gap is noise
                verdict = f"ok (auto ran {slowest.algorithm} itself; the gap is run-to-run noise)"
            else:
                verdict = "SLOWER THAN EVERY FORCED"
            parts.append(f"slowest forced {slowest.algorithm} {slowest.time_us:.1f} us: {verdict}")
        lines.append("; ".join(parts))
    return lines


# The targets of the performance issue (round two): 2 ranks, float32, each ringcomm subject (numpy
# arrays, torch tensors, transport buffers; auto and persistent) judged on its own, side by side.
LATENCY_SIZE = 1 << 10      # time <= MPI_Allreduce's
FLOOR_SIZE = 64 << 20       # time <= one local x += y
OTHERS_AT = (1 << 20, 64 << 20)   # reduce_scatter, all_gather, broadcast: busbw >= MPI's own call


def reference(backend: str) -> str:
    """The MPI row a ringcomm row is judged against: the one on the same memory (``[torch]``)."""
    return "mpi4py[torch]" if backend.endswith("[torch]") else "mpi4py"


def target_lines(rows: list[Row]) -> list[str]:
    """Each target that this run measured, met or missed; auto against its slowest forced algorithm."""
    lines = []
    two = [r for r in rows if r.ranks == 2 and r.dtype == "float32"]
    pick = {(r.collective, r.size, r.backend, r.algorithm): r for r in two}
    subjects = [(c, s, b, a) for (c, s, b, a) in pick if b.startswith("ringcomm") and a in ("auto", "persistent")]

    def judge(what, x, bound, at_least):
        met = x >= bound if at_least else x <= bound
        lines.append(f"{what:<60} x{x:6.2f} (target {'>=' if at_least else '<='} {bound}): "
                     f"{'met' if met else 'MISSED'}")
    for collective, size, backend, algorithm in sorted(subjects, key=lambda k: (k[0], k[2], k[3], k[1])):
        r = pick[(collective, size, backend, algorithm)]
        who = f"{format_size(size):>4} {collective} {backend}/{algorithm}"
        mpi = (pick.get((collective, size, reference(backend), "native"))
               or pick.get((collective, size, "mpi4py", "native")))   # launches before mpi4py[torch]
        if mpi is not None:
            if collective == "all_reduce" and size == LATENCY_SIZE:
                judge(f"{who} time vs {mpi.backend}", r.time_us / mpi.time_us, 1.0, False)
            elif collective == "all_reduce" or size in OTHERS_AT:
                judge(f"{who} busbw vs {mpi.backend}", r.busbw_gbs / mpi.busbw_gbs, 1.0, True)
        floor = pick.get((collective, size, "floor", "x+=y"))
        if collective == "all_reduce" and size == FLOOR_SIZE and floor is not None:
            judge(f"{who} time vs the x+=y floor", r.time_us / floor.time_us, 1.0, False)
    worst = None
    for size in sorted({r.size for r in two if r.collective == "all_reduce"}):
        auto = pick.get(("all_reduce", size, "ringcomm", "auto"))
        forced = [r for (c, s, b, a), r in pick.items() if c == "all_reduce" and s == size and b == "ringcomm"
                  and a not in ("auto", "persistent")]
        if auto is None or len(forced) < 2:
            continue
        x = auto.time_us / max(r.time_us for r in forced)
        worst = max(worst or (0.0, 0), (x, size))
    if worst is not None:
        x, size = worst
        lines.append(f"auto / slowest forced, worst size ({format_size(size)}) x{x:6.2f} (target <= 1): "
                     f"{'met' if x <= 1 else 'MISSED'}")
    return lines


class Progress:
    """A one-line progress bar on stderr (rank 0 only)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        full = width * self.done // max(self.total, 1)
        elapsed = time.monotonic() - self.start
        sys.stderr.write(f"\r[{'#' * full}{'.' * (width - full)}] {self.done}/{self.total} {what:<28} "
                         f"{elapsed:6.1f} s")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def metadata(args, n: int) -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    import ringcomm
    return {"command": " ".join(sys.argv), "ranks": n, "host": socket.gethostname(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": load,
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "ringcomm": ringcomm.__version__, "warmup": args.warmup, "iters": args.iters,
            "rounds": args.rounds}


def _json_row(r: Row) -> dict:
    """Strict JSON has no NaN: a missing figure (the floor's busbw) becomes null."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(r).items()}


def write_outputs(args, rows: list[Row], notes: list[str], meta: dict) -> None:
    if args.csv:
        import csv
        with open(args.csv, "w", newline="") as f:
            names = [k for k in Row.__dataclass_fields__ if k != "rounds_us"]
            writer = csv.DictWriter(f, fieldnames=names)
            writer.writeheader()
            for r in rows:
                d = asdict(r)
                d.pop("rounds_us")
                writer.writerow(d)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "notes": notes, "rows": [_json_row(r) for r in rows]}, f, indent=1)
    if args.plot:
        from plot import plot_rows   # matplotlib is imported only here
        plot_rows([_json_row(r) for r in rows], args.plot, title=f"{meta['ranks']} ranks, {meta['host']}")


# ---- main ------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0, help="add instead of multiply")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed calls before each timing")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size and config")
    p.add_argument("--iter-bytes", type=parse_size, default=0,
                   help="cap iterations at this many bytes per timing (big sizes run fewer, at least "
                        "--min-iters); 0: always -n")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("-r", "--rounds", type=int, default=1,
                   help="repeat the interleaved timings; the median round is reported")
    p.add_argument("-d", "--dtype", default="float32", choices=DTYPES)
    p.add_argument("--backend", default="ringcomm", help="comma list: ringcomm, mpi, gloo, nccl, mpi4py")
    p.add_argument("--algorithm", default="auto,all",
                   help="comma list for the ringcomm backend: auto, all, algorithm names, or persistent "
                        "(all_reduce_init once, then p() per call)")
    p.add_argument("--collective", default="all_reduce", help=f"comma list of {', '.join(COLLECTIVES)}")
    p.add_argument("--csv"), p.add_argument("--json"), p.add_argument("--plot", help="PNG: busbw vs size")
    p.add_argument("--transport-buffers", action="store_true",
                   help="also run ringcomm/auto on buffers from comm.transport.allocate() (shared memory "
                        "peers read in place, as DDP buckets use), labelled backend 'ringcomm+tbuf'")
    p.add_argument("--empty-buffers", action="store_true",
                   help="also run ringcomm/auto on buffers from ringcomm.empty() (blocks the node's ranks "
                        "map into each other), labelled backend 'ringcomm+empty'")
    p.add_argument("--tensor", default="numpy",
                   help="comma list: numpy, torch (ringcomm configs run on each; torch tensors are "
                        "allocated by torch)")
    p.add_argument("--split", choices=("parity",),
                   help="run on both halves of a split by rank parity at once (the module docstring)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    args.collectives = [c.strip() for c in args.collective.split(",") if c.strip()]
    args.tensors = [t.strip() for t in args.tensor.split(",") if t.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if not args.backends or unknown:
        p.error(f"--backend: expected a comma list of {', '.join(BACKENDS)}, got {args.backend!r}")
    if not args.tensors or any(t not in ("numpy", "torch") for t in args.tensors):
        p.error(f"--tensor: expected a comma list of numpy, torch, got {args.tensor!r}")
    for c in args.collectives:
        if c not in COLLECTIVES:
            p.error(f"--collective: expected one of {', '.join(COLLECTIVES)}, got {c!r}")
    wanted = [a.strip() for a in args.algorithm.split(",") if a.strip()]
    from ringcomm import algorithms as registry
    known = {name for c in args.collectives if c != "sendrecv" for name in registry.names(c)}
    algorithms = []
    for a in wanted:
        if a == "all":
            algorithms += sorted(known - set(algorithms))
        elif a not in algorithms:
            if a not in known | {"auto", "persistent"}:
                p.error(f"--algorithm: {a!r} is no algorithm of {', '.join(args.collectives)} (expected auto, all, "
                        f"persistent or one of {', '.join(sorted(known))})")
            algorithms.append(a)
    args.algorithms = algorithms
    if args.warmup < 0 or args.iters < 1 or args.rounds < 1:
        p.error("-w must be >= 0, -n and -r >= 1")
    try:
        args.sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    if args.split and n % 2:
        raise SystemExit(f"--split parity: needs an even number of ranks (halves of equal size), got {n}")
    configs, notes = build_configs(args, world)
    say = print if rank == 0 else (lambda *a, **k: None)
    meta = metadata(args, n)
    say(f"# {meta['command']}")
    say(f"# {n} ranks on {meta['host']} ({meta['cpus']} cpus), {args.dtype}, warm-up {args.warmup}, "
        f"iters {args.iters}, rounds {args.rounds}, {meta['utc']}, load {meta['loadavg']}")
    if args.split:   # from here on rank and n are this rank's half's; timing still spans the world
        rank, n = rank // 2, n // 2
        say(f"# every collective on both halves of a split by rank parity at once, {n} ranks each")
    for note in notes:
        say(f"# {note}")
    plan = []
    for collective in args.collectives:
        usable = []
        for cfg in configs:
            why = algorithm_usable(cfg, collective)
            if why:
                notes.append(f"{collective}: skipped {cfg.label}: {why}")
                say(f"# {notes[-1]}")
            else:
                usable.append(cfg)
        plan += [(collective, s, usable) for s in args.sizes]
    progress = Progress(len(plan), world.Get_rank() == 0 and not args.no_progress)
    rows: list[Row] = []
    current = None
    for collective, size, usable in plan:
        if collective != current:
            current = collective
            say(f"\n# {collective}, busbw factor {bus_factor(collective, n):.3f}; time = mean over -n "
                f"calls, max over ranks; GB/s = 1e9 B/s")
            say(HEADER)
        if usable:
            got = measure_size(world, collective, size, args.dtype, usable, args, rank, n)
            rows += got
            for r in got:
                say(format_row(r), flush=True)
        progress.step(f"{collective} {format_size(size)}")
    lines = summary(rows)
    if lines:
        say("\n# ringcomm auto against the others")
        for line in lines:
            say(f"# {line}")
    targets = target_lines(rows)
    if targets:
        say("\n# targets measured in this run (performance round two: time <= MPI at 1K, busbw >= MPI, "
            "64M <= the floor)")
        for line in targets:
            say(f"# {line}")
    total_wrong = sum(r.wrong for r in rows)
    say(f"\n# out of bounds values: {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    if world.Get_rank() == 0:
        write_outputs(args, rows, notes, meta)
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # for `plot` beside this file
    sys.exit(main())
