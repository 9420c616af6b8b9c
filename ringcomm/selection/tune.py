"""Measure this machine and write the tuning file the selector reads.

    mpirun -n 2 python -m ringcomm.tune [--out PATH] [--max-size 32M] [--quick]
    mpirun -n 2 python -m ringcomm.tune --check     # auto vs every forced algorithm, writes nothing

1. alpha and beta per transport: ping-pong through the real executor (so alpha includes the
   Python per-step overhead every algorithm pays) between two ranks of one node, and between two
   ranks of different nodes when the job has several (``RINGCOMM_NODE_ID`` can pretend);
   a least-squares fit of t(S) = alpha + S beta, weighted so small and large sizes count alike.
2. gamma per dtype: the reduction kernel itself, timed on rank 0.
3. the size from which the shared-memory transport reads peers directly (CMA) rather than
   staging: both timed, interleaved, for all-reduces from 1 MiB to 64 MiB and for sends from
   128 KiB to 16 MiB (``--quick``: to --max-size, at least 2 MiB).
4. the real crossover points: every algorithm of all_reduce, broadcast, all_gather,
   reduce_scatter and all_to_all (``SWEPT``), interleaved, at every doubling from 8 B to 32 MiB (medians of
   --rounds samples). The selector uses these measured times for exactly this job shape and
   the fitted model everywhere else; the links are fitted to the all-reduce sweep.

The file goes to ``--out``, else ``RINGCOMM_TUNING_FILE``, else ~/.cache/ringcomm/tuning.json
($XDG_CACHE_HOME respected); ``ringcomm.init()`` loads it from the same place.
"""
from __future__ import annotations

import os
import socket
import statistics
import time
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from .tuning import (
    DEFAULT_LINKS,
    Sweep,
    Tuning,
    default_path,
    load_tuning,
    parse_size,
    save_tuning,
)


def fit_link(points) -> tuple:
    """(alpha, beta) minimising the relative error of alpha + S beta over (S, seconds) points."""
    import numpy as np
    sizes = np.array([s for s, _ in points], dtype=float)
    times = np.array([t for _, t in points], dtype=float)
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    smallest = float(times[np.argmin(sizes)])
    alpha = float(alpha) if alpha > 0 else smallest
    beta = float(beta) if beta > 0 else float(times.max() / sizes.max())
    return alpha, beta


def fit_alpha(sizes, seconds: dict, link, local_sizes: tuple) -> tuple:
    """(alpha, fixed per-call seconds) that best explain the measured collectives, given beta and
    gamma: every algorithm's cost is linear in alpha, so this is a least-squares line through
    all (algorithm, size) points, relative errors, refitted once without gross outliers (bursts
    of load on a shared machine). Alpha as the collectives feel it includes what a ping-pong
    misses: posting several ops per step, and waiting for a descheduled peer when ranks
    outnumber cores. None when the data cannot say (too few points, or a non-positive fit)."""
    import numpy as np

    from .. import algorithms
    from .cost import Link, Network

    def cost(name, nbytes, unit):
        return algorithms.get("all_reduce", name).cost(nbytes, Network(unit, unit, local_sizes))
    rows, rhs = [], []
    for name, times in seconds.items():
        if algorithms.is_window("all_reduce", name):
            continue   # priced on the window link (fit_window), not this one
        for nbytes, t in zip(sizes, times):
            fixed = cost(name, nbytes, Link(0.0, link.beta, link.gamma))
            steps = cost(name, nbytes, Link(1.0, 0.0, 0.0))
            rows.append((1.0 / t, steps / t))
            rhs.append((t - fixed) / t)
    if len(rows) < 4:
        return None
    design, target = np.array(rows), np.array(rhs)
    keep = np.ones(len(rows), bool)
    for _ in range(2):
        (overhead, alpha), *_ = np.linalg.lstsq(design[keep], target[keep], rcond=None)
        residual = np.abs(design @ np.array([overhead, alpha]) - target)
        keep = residual <= max(3 * np.median(residual), 0.05)
    if not alpha > 0:
        return None
    return float(alpha), float(max(overhead, 0.0))


def fit_window(sizes, times, gamma: float, n: int, capacity: int) -> Optional[tuple]:
    """(alpha, beta) of the shared window from the one-shot sweep: within one piece (S <= the
    window's capacity) a round costs alpha + n S beta + (n-1) S gamma, so with gamma known
    this is fit_link on (n S, t - (n-1) S gamma). None with fewer than 3 usable sizes."""
    points = [(n * s, t - (n - 1) * s * gamma) for s, t in zip(sizes, times) if s <= capacity]
    points = [(s, t) for s, t in points if t > 0]
    return fit_link(points) if len(points) >= 3 else None


def measure_link(comm, a: int, b: int, sizes, budget: float):
    """Fit (alpha, beta) on the pair (a, b); every rank calls, only a and b move data."""
    points = []
    if comm.rank in (a, b):
        peer = b if comm.rank == a else a
        points = [(nbytes, _pingpong(comm, peer, nbytes, a, budget)) for nbytes in sizes]
    comm.barrier()
    return fit_link(points) if comm.rank == a else None


def _pingpong(comm, peer: int, nbytes: int, a: int, budget: float) -> float:
    """Ping-pong for a number of rounds both sides know beforehand (from a probe of 3 rounds)."""
    import numpy as np

    from ..core import executor
    from ..core.envelope import PINGPONG_TAG, ControlEnvelope
    from ..core.schedule import Recv, Send
    envelope = ControlEnvelope(PINGPONG_TAG)   # apart from collectives; FIFO within the pair
    work = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    pair = [(Send(peer, 0, nbytes),), (Recv(peer, 0, nbytes),)]
    program = executor.compile_program(pair if comm.rank == a else pair[::-1])
    count = np.zeros(1, np.int64)

    def rounds(n):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            executor.run(program, comm.transport, (work, work, None), None, envelope=envelope, timeout=60,
                         what="tune ping-pong")
            out.append((time.perf_counter() - t0) / 2)
        return out
    probe = rounds(3)
    # a tells b how many more rounds fit the budget, over the same pair, so both stop together.
    tell = executor.compile_program([(Send(peer, 0, 1),)] if comm.rank == a else [(Recv(peer, 0, 1),)])
    if comm.rank == a:
        count[0] = max(3, min(200, int(budget / max(2 * statistics.median(probe), 1e-7))))
    executor.run(tell, comm.transport, (count, count, None), None, envelope=envelope, timeout=60,
                 what="tune ping-pong")
    return statistics.median(probe + rounds(int(count[0])))


def measure_gammas(budget: float = 0.05) -> dict:
    """Seconds per byte of ``dst = dst + src`` for every dtype, from the slope between 4 MiB and
    16 MiB (sizes past the caches, like the collectives' real operands)."""
    import numpy as np

    from ..core.ops import DTYPES, ReduceOp, reducer
    out = {}
    for name, dtype in DTYPES.items():
        reduce = reducer(ReduceOp.SUM, dtype)
        times = []
        for nbytes in (4 << 20, 16 << 20):
            n = nbytes // dtype.itemsize
            dst, src = np.ones(n, dtype.storage), np.zeros(n, dtype.storage)   # no overflow to inf
            samples, start = [], time.perf_counter()
            while len(samples) < 3 or (time.perf_counter() - start < budget and len(samples) < 50):
                t0 = time.perf_counter()
                reduce(dst, src)
                samples.append(time.perf_counter() - t0)
            times.append(min(samples))   # the kernel's speed, not the noise of a shared machine
        out[name] = max((times[1] - times[0]) / (12 << 20), times[1] / (16 << 20) / 2)
    return out


SWEPT = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")   # the collectives tune times


def candidates(comm, collective: str = "all_reduce") -> list:
    """The algorithms of ``collective`` worth timing on this job: on one node (or one rank per
    node) the hierarchical schedules are plain rings and trees, so they are not timed twice."""
    from .. import algorithms
    from ..algorithms.hierarchical import degenerate
    from .cost import DEFAULT_LINK, Network
    from .selector import local_sizes
    shape = Network(DEFAULT_LINK, DEFAULT_LINK, local_sizes(comm.topology.node_of, comm.size))
    return [n for n in algorithms.names(collective, comm.transport)
            if not (algorithms.get(collective, n).kind == "schedule"
                    and algorithms.get(collective, n).topology_aware and degenerate(shape))]


def priced(collective: str, nbytes: int, n: int) -> int:
    """The bytes the selector prices tune's float32 call of ``collective`` at, for about ``nbytes``
    (Collective.nbytes: the vector of all_reduce and broadcast, the gathered output of
    all_gather, the input of reduce_scatter and of all_to_all), counts even across the ``n`` ranks."""
    return 4 * (max(1, nbytes // 4) if collective == "all_reduce" else max(1, nbytes // 4 // n) * n)


def operands(comm, collective: str, nbytes: int):
    """``run(algorithm)``: one float32 call of ``collective`` on ``priced(...)`` bytes."""
    import numpy as np
    count = priced(collective, nbytes, comm.size) // 4
    if collective == "all_reduce":
        x = np.zeros(count, np.float32)   # sums stay finite however often they run
        return lambda algorithm: comm.all_reduce(x, algorithm=algorithm)
    # Written, not np.zeros: an untouched zeros array maps the kernel's one zero page, which a
    # direct read (CMA) finds in cache every time; tune timed direct broadcast 1.4x too fast so.
    whole = np.ones(count, np.float32)
    part = np.ones(count // comm.size, np.float32)
    if collective == "all_to_all":
        out = np.ones(count, np.float32)
        return lambda algorithm: comm.all_to_all(out, whole, algorithm=algorithm)
    runs = {"broadcast": lambda algorithm: comm.broadcast(whole, 0, algorithm=algorithm),
            "all_gather": lambda algorithm: comm.all_gather(whole, part, algorithm=algorithm),
            "reduce_scatter": lambda algorithm: comm.reduce_scatter(part, whole, algorithm=algorithm)}
    return runs[collective]


def time_collective(comm, collective: str, sizes, entries, rounds: int, budget: float) -> dict:
    """Median seconds per call of each (label, algorithm) entry at each size; algorithm None is
    the selector's choice, passed as if forced: every entry then runs on the same road (repeated
    small calls left to the selector take the remembered road of persistent.py, which forced
    ones never do, so auto would win by that alone). Entries are interleaved within every round,
    so a burst of load elsewhere on a shared machine hits them all alike; each sample times
    enough calls to last about ``budget``."""
    import numpy as np
    seconds = {label: [] for label, _ in entries}
    for nbytes in sizes:
        run = operands(comm, collective, nbytes)
        chosen = comm.selector.choose(collective, priced(collective, nbytes, comm.size), comm.size,
                                      nodes=comm.topology.node_of, transport=comm.transport)
        todo = [(label, chosen if algorithm is None else algorithm) for label, algorithm in entries]
        for _, algorithm in todo:
            run(algorithm)                                    # plans cached before timing
        probes = []
        for _, algorithm in todo:
            t0 = time.perf_counter()
            run(algorithm)
            probes.append(time.perf_counter() - t0)
        per = np.array([statistics.median(probes)])
        comm.broadcast(per)                                   # every rank runs the same count
        iters = int(max(1, min(100, budget / max(per[0], 1e-6))))
        samples = {label: [] for label, _ in entries}
        for _ in range(rounds):
            for label, algorithm in todo:
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    run(algorithm)
                samples[label].append((time.perf_counter() - t0) / iters)
        for label in seconds:
            seconds[label].append(statistics.median(samples[label]))
    return seconds


def check(comm, sizes, rounds: int, budget: float, collectives=SWEPT) -> int:
    """Auto against every forced algorithm of each collective, interleaved; prints a table per
    collective, returns how many (collective, size) points auto was more than 10% slower than the
    best. Auto is timed twice ("auto" and "again"): the spread between two runs of the very same
    call is the noise floor of the comparison."""
    from .selector import routes_of
    misses = 0
    for collective in collectives:
        names = candidates(comm, collective)
        seconds = time_collective(comm, collective, sizes, [("auto", None), ("again", None)] + [(n, n) for n in names],
                                  rounds, budget)
        if comm.rank != 0:
            continue
        print(f"{collective}\n{'bytes':>10} {'auto picks':<20}{'best forced':<20}{'auto':>11}{'best':>11}"
              f"{'ratio':>7}{'noise':>7}")
        for i, nbytes in enumerate(sizes):
            best = min(names, key=lambda n: seconds[n][i])
            pick = comm.selector.choose(collective, priced(collective, nbytes, comm.size), comm.size,
                                        nodes=comm.topology.node_of, transport=comm.transport)
            ratio = seconds["auto"][i] / seconds[best][i]
            noise = max(seconds["auto"][i], seconds["again"][i]) / min(seconds["auto"][i], seconds["again"][i])
            miss = ratio > 1.10 and pick != best   # the same algorithm twice: only noise apart
            misses += miss
            print(f"{nbytes:>10} {pick:<20}{best:<20}{seconds['auto'][i] * 1e6:>9.1f}us"
                  f"{seconds[best][i] * 1e6:>9.1f}us{ratio:>7.2f}{noise:>7.2f}{'  > 10%' if miss else ''}")
    if comm.rank == 0:
        points = len(sizes) * len(collectives)
        print(f"auto within 10% of the best forced algorithm at {points - misses} of {points} points "
              f"(routes {routes_of(comm.transport, comm.topology.node_of)}, tuning: {comm.selector.tuning.source}); "
              f"noise = slower/faster of two interleaved runs of auto itself")
    return misses


def direct_reader(comm):
    """The shared-memory transport of this job if it can read peers directly (CMA), else None."""
    for transport in (getattr(comm.transport, "routes", None) or {}).values():
        if getattr(transport, "_direct", False) and hasattr(transport, "cma_min_bytes"):
            return transport
    return None


def measure_cma_floor(comm, rounds: int, budget: float, top: int = 64 << 20) -> Optional[tuple]:
    """(bytes, {size: (staged s, direct s)}): the smallest all-reduce size from which reading
    peers directly (CMA) beats staging through shared memory at it and at every larger size
    measured, auto algorithm. None when this job cannot read directly."""
    import numpy as np
    sizes = [s for s in (1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20) if s <= top]

    def case(nbytes):
        x = np.zeros(nbytes // 4, np.float32)
        return lambda: comm.all_reduce(x)
    return _cma_floor(comm, "cma_min_bytes", sizes, case, rounds, budget)


def measure_p2p_cma_floor(comm, rounds: int, budget: float, top: int = 16 << 20) -> Optional[tuple]:
    """The same for sends (``cma_p2p_min_bytes``): every rank sends to its right neighbour and
    receives from its left at once (benchmarks/allreduce_perf.py --collective sendrecv), from
    128 KiB. A send is copied, not reduced, so CMA pays for itself far sooner than in a collective."""
    import numpy as np
    sizes = [128 << 10 << k for k in range(12) if 128 << 10 << k <= top]
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size

    def case(nbytes):
        x, y = np.zeros(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)

        def exchange():
            work = comm.send(x, right, async_op=True)
            comm.recv(y, left)
            work.wait()
        return exchange
    return _cma_floor(comm, "cma_p2p_min_bytes", sizes, case, rounds, budget)


def _cma_floor(comm, floor: str, sizes: list, case, rounds: int, budget: float) -> Optional[tuple]:
    """Time ``case(nbytes)()`` at each size with the shm transport's ``floor`` attribute set so
    that nothing reads directly (staged) and so that everything does (direct), interleaved. The
    result is the smallest size from which direct wins at it and at every larger size; where
    direct never wins, twice the largest size: staging everywhere measured."""
    import numpy as np
    shm = direct_reader(comm)
    if shm is None or not sizes:
        return None
    old, table = getattr(shm, floor), {}
    modes = ((1 << 62), 0)   # staged (a floor no call reaches), direct (every call)
    try:
        for nbytes in sizes:
            run = case(nbytes)
            samples = {m: [] for m in modes}
            for mode in modes:
                setattr(shm, floor, mode)
                run()   # segments and plans ready before timing
            probe = time.perf_counter()
            run()
            per = np.array([time.perf_counter() - probe])
            comm.broadcast(per)   # every rank runs the same number of calls
            iters = int(max(2, min(50, budget / max(per[0], 1e-6))))
            for r in range(rounds):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    setattr(shm, floor, mode)
                    comm.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        run()
                    t = np.array([(time.perf_counter() - t0) / iters])
                    comm.all_reduce(t, op="max")   # every rank keeps the same figure
                    samples[mode].append(float(t[0]))
            table[nbytes] = tuple(statistics.median(samples[m]) for m in modes)
    finally:
        setattr(shm, floor, old)
    found = 2 * sizes[-1]
    for nbytes in reversed(sizes):
        staged, direct = table[nbytes]
        if direct >= staged:
            break
        found = nbytes
    return found, table


def crossovers(sizes, seconds: dict) -> list:
    """[(size where the winner changes, previous winner, new winner), ...]."""
    out, prev = [], None
    for i, nbytes in enumerate(sizes):
        best = min(seconds, key=lambda name: seconds[name][i])
        if prev is not None and best != prev:
            out.append((nbytes, prev, best))
        prev = best
    return out


def _communicator() -> tuple:
    """(communicator, ranks on this host, crowded): what ringcomm.init() builds, polling and
    pricing oversubscription and direct reads as a job of this shape does, but selecting with
    the built-in defaults and nothing forced: an old (even corrupt) tuning file or RINGCOMM_ALGO
    must not steer the measurement. ``crowded``: on some host of the job, ranks outnumber cores."""
    from mpi4py import MPI

    from ..communicator import Communicator
    from ..init import ranks_on_this_host
    from ..topology import discover
    from ..transport import factory, polling
    from .selector import Selector
    world = MPI.COMM_WORLD.Dup()
    topology = discover(world)
    ranks_here = ranks_on_this_host(world)
    polling.set_ranks_here(ranks_here)
    crowded = world.allreduce(ranks_here > polling.cores(), op=MPI.LOR)
    comm = Communicator(factory.build(world, topology, 120), timeout=120, selector=Selector(),
                        local_rank=topology.local_rank, local_size=topology.local_size,
                        node_count=topology.node_count, topology=topology)
    # The hosts' read probe, agreed as init agrees it (agreement.py), without its tuning file.
    from ..agreement import host_read_cost
    from ..transport.shm.cma import reads_fast
    fast = world.allreduce(reads_fast(host_read_cost("ringcomm", ranks_here)), op=MPI.LAND)
    comm.selector.set_host(ranks_here, polling.cores(), fast_reads=fast)
    return comm, ranks_here, crowded


def _unwritable(path: Path) -> Optional[str]:
    """Why the tuning file cannot be written at ``path``, or None: tried before the minutes of
    measuring, not after them."""
    probe = path.with_name(path.name + f".probe{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        return f"cannot write the tuning file {path}: {err}"
    return None


def _all_hear(comm, why: Optional[str]) -> None:
    """Rank 0's verdict (why the command cannot go on, or None) reaches every rank, and every rank
    exits with it: a rank left waiting in a collective would hang until its timeout."""
    import numpy as np
    flag = np.array([0 if why is None else 1], np.int64)
    comm.broadcast(flag, 0)
    if flag[0]:
        comm.close()
        raise SystemExit(f"ringcomm.tune: {why}" if comm.rank == 0 else
                         "ringcomm.tune: rank 0 could not write the tuning file (its message says why)")


def main(argv=None) -> int:
    import argparse

    from ..transport.polling import cores
    from .selector import Selector, predict, routes_of
    parser = argparse.ArgumentParser(prog="python -m ringcomm.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where to write (default: RINGCOMM_TUNING_FILE or "
                                      "~/.cache/ringcomm/tuning.json)")
    parser.add_argument("--max-size", default="32M", help="largest size swept (default 32M)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size (default 5)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds (a smoke test)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing: time auto (with the current tuning file) against every "
                             "forced algorithm and report where auto is more than 10%% off the best")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        top = parse_size(args.max_size)
    except UsageError as err:
        parser.error(f"--max-size: {err}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, got {args.rounds}")
    sizes = [8 << k for k in range(40) if 8 << k <= top]     # every doubling from 8 B
    if args.quick:
        sizes = sizes[::3]
    comm, ranks_here, crowded = _communicator()
    fast = comm.selector.fast_reads
    topo = comm.topology
    if comm.size < 2:
        raise SystemExit("ringcomm.tune needs at least 2 ranks: mpirun -n 2 python -m ringcomm.tune")
    if args.check:
        comm.selector = Selector.from_env()
        comm.selector.set_host(ranks_here, cores(), fast_reads=fast)   # auto picks what a job of this shape picks
        check(comm, sizes, args.rounds, 0.01 if args.quick else 0.03)
        comm.barrier()
        comm.close()
        return 0
    intra_route, inter_route = routes_of(comm.transport, topo.node_of)
    pairs = {}
    same = [r for r in range(1, comm.size) if topo.same_node(0, r)]
    other = [r for r in range(1, comm.size) if not topo.same_node(0, r)]
    if same:
        pairs[intra_route] = same[0]
    if other:
        pairs.setdefault(inter_route, other[0])
    budget = 0.02 if args.quick else 0.1
    link_sizes = [8, 1 << 10, 8 << 10, 64 << 10, 512 << 10, 4 << 20]
    path = Path(args.out).expanduser() if args.out else default_path()
    _all_hear(comm, _unwritable(path) if comm.rank == 0 else None)
    old = None
    if comm.rank == 0 and path.exists():
        try:
            old = load_tuning(path)
        except UsageError as err:   # an unusable old file is replaced, and the user told so
            print(f"replacing it: {err}")
    links = dict(DEFAULT_LINKS)
    if crowded:
        # The model crowds every link itself (cost.crowded) by the ranks a job puts on each
        # core; links fitted to crowded timings would be crowded twice, and jobs that fit the
        # cores would inherit them (and the CMA floors, which every job of the machine uses).
        # Links and floors stay the file's (or the defaults); only this shape's sweeps are new.
        if old is not None:
            links.update(old.links)
        if comm.rank == 0:
            print(f"ranks outnumber cores ({ranks_here} ranks, {cores()} cores here): the links and CMA floors "
                  f"are kept as they were; only this shape's sweeps are measured")
    else:
        for route, peer in pairs.items():
            fitted = measure_link(comm, 0, peer, link_sizes, budget)
            if comm.rank == 0:
                links[route] = fitted
    gammas = measure_gammas() if comm.rank == 0 else None
    cma = p2p_cma = None   # (floor, table) each, where measured
    if not crowded:
        cma = measure_cma_floor(comm, 3 if args.quick else args.rounds, 0.05 if args.quick else 0.2,
                                top=max(top, 2 << 20) if args.quick else 64 << 20)
        p2p_cma = measure_p2p_cma_floor(comm, 3 if args.quick else args.rounds, 0.05 if args.quick else 0.2,
                                        top=max(top, 2 << 20) if args.quick else 16 << 20)
    timed = {collective: time_collective(comm, collective, sizes, [(n, n) for n in candidates(comm, collective)],
                                         2 if args.quick else args.rounds, 0.01 if args.quick else 0.03)
             for collective in SWEPT}
    seconds = timed["all_reduce"]   # the links are fitted to the all-reduce sweep
    failed = None   # rank 0's: why the file could not be written
    if comm.rank == 0:
        from .selector import local_sizes
        shape = local_sizes(topo.node_of, comm.size)
        sweeps = tuple(Sweep(collective, shape, (intra_route, inter_route), "float32", tuple(sizes),
                             {k: tuple(v) for k, v in timed[collective].items()}) for collective in SWEPT)
        if intra_route == inter_route and intra_route in pairs and not crowded:   # one link: calibrate its alpha
            alpha_b = links[intra_route]
            fitted = fit_alpha(sizes, seconds, Tuning(links, gammas).link(intra_route), shape)
            if fitted is not None:
                links[intra_route] = (fitted[0], alpha_b[1], fitted[1])
                print(f"{intra_route}: ping-pong alpha {alpha_b[0] * 1e6:.2f} us; alpha as the collectives feel it "
                      f"{fitted[0] * 1e6:.2f} us, plus {fitted[1] * 1e6:.1f} us per call")
        window = comm.transport.window
        if window is not None and "one_shot" in seconds and not crowded:
            # The sweep ran the compiled round where there is one (it reduces as it reads: no gamma).
            name = f"{intra_route}-round" if window.core is not None else f"{intra_route}-window"
            gamma = 0.0 if window.core is not None else Tuning(links, gammas).link(intra_route).gamma
            fitted = fit_window(sizes, seconds["one_shot"], gamma, comm.size, window.capacity)
            if fitted is not None:
                links[name] = fitted
                print(f"{name} alpha {fitted[0] * 1e6:.2f} us   beta {1 / fitted[1] / 1e9:.2f} GB/s "
                      f"(from the one-shot sweep)")
        # Keep the sweeps of other job shapes (tune at -n 2, then at -n 4, into one file).
        kept = () if old is None else tuple(s for s in old.sweeps
                                            if (s.local_sizes, s.routes) != (shape, (intra_route, inter_route))
                                            or s.collective not in SWEPT)
        tuning = Tuning(links, gammas, kept + sweeps, source="measured",
                        cma_min=cma[0] if cma else old.cma_min if crowded and old else None,
                        cma_p2p_min=p2p_cma[0] if p2p_cma else old.cma_p2p_min if crowded and old else None)
        for what, found in (("all_reduce auto", cma), ("sendrecv", p2p_cma)):
            if found:
                print(f"direct reads (CMA) against staging, {what}: " + "  ".join(
                    f"{n >> 10}K {d / s:.2f}x" for n, (s, d) in found[1].items()) + f"; from {found[0] >> 10} KiB on")
        try:
            save_tuning(tuning, path, host=socket.gethostname(), ranks=comm.size, local_sizes=list(shape),
                        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        except OSError as err:   # the measurements below are still worth reading
            failed = f"cannot write the tuning file {path}: {err}"
        for route in pairs:
            a, b = links[route][:2]
            print(f"{route:8s} alpha {a * 1e6:8.2f} us   beta {1 / b / 1e9:6.2f} GB/s")
        print("gamma    " + "  ".join(f"{k} {1 / v / 1e9:.2f} GB/s" for k, v in gammas.items()))
        model = Selector(tuning=Tuning(links, gammas))
        model.set_host(ranks_here, cores(), fast_reads=fast)   # the model as a job of this shape prices it
        window = comm.transport.window
        net = model.network(comm.size, topo.node_of, "float32", (intra_route, inter_route),
                            0 if window is None else window.capacity, window is not None and window.reader is not None,
                            window is not None and window.core is not None)
        for collective, measured in timed.items():
            predicted = {name: [dict(predict(collective, s, net))[name] for s in sizes] for name in measured}
            print(f"{collective}\n{'bytes':>10}  {'measured best':<20}{'model best':<20}"
                  + "".join(f"{n[:12]:>13}" for n in measured))
            for i, s in enumerate(sizes):
                best = min(measured, key=lambda n: measured[n][i])
                guess = min(predicted, key=lambda n: predicted[n][i])
                print(f"{s:>10}  {best:<20}{guess:<20}" + "".join(f"{measured[n][i] * 1e6:>11.1f}us" for n in measured))
            for what, table in (("measured", measured), ("model", predicted)):
                print(f"{collective} {what} crossovers: "
                      + ("; ".join(f"{a} -> {b} at {s} B" for s, a, b in crossovers(sizes, table)) or "none"))
        if failed is None:
            print(f"wrote {path} in {time.perf_counter() - started:.1f} s")
    _all_hear(comm, failed)
    comm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
