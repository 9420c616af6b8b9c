"""Measure this machine and write the tuning file the selector reads.

    mpirun -n 2 python -m ringcomm.tune [--out PATH] [--max-size 32M] [--quick]

1. alpha and beta per transport: ping-pong through the real executor (so alpha includes the
   Python per-step overhead every algorithm pays) between two ranks of one node, and between two
   ranks of different nodes when the job has several (``RINGCOMM_NODE_ID`` can pretend);
   a least-squares fit of t(S) = alpha + S beta, weighted so small and large sizes count alike.
2. gamma per dtype: the reduction kernel itself, timed on rank 0.
3. the real crossover points: every all-reduce algorithm, interleaved, at sizes 8 B .. 32 MiB
   (medians). The selector uses these measured times for exactly this job shape and the fitted
   model everywhere else.

The file goes to ``--out``, else ``RINGCOMM_TUNING_FILE``, else ~/.cache/ringcomm/tuning.json
($XDG_CACHE_HOME respected); ``ringcomm.init()`` loads it from the same place.
"""
from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .cost import DEFAULT_LINK, Link
from .errors import UsageError

FORMAT = 1

# Built-in per-transport links (alpha s/message, beta s/byte) and per-dtype reduction costs,
# from a 2-core x86 box, Python executor included; `ringcomm.tune` replaces them with measurements.
DEFAULT_LINKS = {
    "mpi": (DEFAULT_LINK.alpha, DEFAULT_LINK.beta),
    "shm": (8e-6, 1 / 6.0e9),        # one copy through shared memory, no MPI matching
    "threads": (20e-6, 1 / 4.0e9),   # in-process mailbox: a copy and a condition variable
}
DEFAULT_GAMMAS = {
    "float32": DEFAULT_LINK.gamma, "float64": DEFAULT_LINK.gamma, "int32": DEFAULT_LINK.gamma,
    "int64": DEFAULT_LINK.gamma, "uint8": DEFAULT_LINK.gamma,
    "float16": 1 / 1.0e9,            # numpy widens to float32 and rounds back per op
    "bfloat16": 1 / 0.5e9,           # widened and rounded by hand (ops.py)
}


@dataclass(frozen=True)
class Sweep:
    """Measured seconds of each algorithm of one collective, for one job shape."""
    collective: str
    local_sizes: tuple
    routes: tuple
    dtype: str
    sizes: tuple          # bytes, ascending
    seconds: dict         # algorithm -> tuple of seconds, one per size

    def at(self, nbytes: int) -> dict:
        """Times at ``nbytes``, interpolated in log-log between the two measured neighbours;
        empty outside the measured range (the model answers there)."""
        sizes = self.sizes
        if not sizes or nbytes < sizes[0] or nbytes > sizes[-1]:
            return {}
        hi = next(i for i, s in enumerate(sizes) if s >= nbytes)
        lo = max(hi - 1, 0)
        if sizes[hi] == nbytes or lo == hi:
            return {name: ts[hi] for name, ts in self.seconds.items()}
        w = math.log(nbytes / sizes[lo]) / math.log(sizes[hi] / sizes[lo])
        return {name: math.exp((1 - w) * math.log(ts[lo]) + w * math.log(ts[hi]))
                for name, ts in self.seconds.items()}


@dataclass(frozen=True)
class Tuning:
    links: dict = field(default_factory=lambda: dict(DEFAULT_LINKS))     # transport -> (alpha, beta)
    gammas: dict = field(default_factory=lambda: dict(DEFAULT_GAMMAS))   # dtype -> gamma
    sweeps: tuple = ()
    source: str = "built-in defaults"

    def link(self, transport: str, dtype: str = "float32") -> Link:
        alpha, beta = self.links.get(transport) or self.links.get("mpi") or DEFAULT_LINKS["mpi"]
        gamma = self.gammas.get(dtype, self.gammas.get("float32", DEFAULT_LINK.gamma))
        return Link(alpha, beta, gamma)

    def measured_times(self, collective: str, nbytes: int, local_sizes: tuple, routes: tuple,
                       dtype: str = "float32") -> dict:
        for sweep in self.sweeps:
            if (sweep.collective, sweep.local_sizes, sweep.routes) == (collective, tuple(local_sizes),
                                                                       tuple(routes)):
                return sweep.at(nbytes)
        return {}

    def to_json(self, **meta) -> dict:
        return {
            "format": FORMAT, **meta,
            "links": {t: {"alpha": a, "beta": b} for t, (a, b) in self.links.items()},
            "gamma": dict(self.gammas),
            "sweeps": [{"collective": s.collective, "local_sizes": list(s.local_sizes),
                        "routes": list(s.routes), "dtype": s.dtype, "sizes": list(s.sizes),
                        "seconds": {k: list(v) for k, v in s.seconds.items()}} for s in self.sweeps],
        }

    @classmethod
    def from_json(cls, data, source: str) -> "Tuning":
        """Parse and validate; any defect raises UsageError naming ``source`` and the field."""
        def bad(what):
            return UsageError(f"tuning file {source}: {what}; fix or delete it, or re-run "
                              f"`mpirun -n 2 python -m ringcomm.tune`")
        if not isinstance(data, dict):
            raise bad(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise bad(f'"format" is {data.get("format")!r}, this ringcomm reads format {FORMAT}')

        def positive(value, where):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise bad(f"{where} must be a positive number, got {value!r}")
            return float(value)
        links = dict(DEFAULT_LINKS)
        raw_links = data.get("links", {})
        if not isinstance(raw_links, dict):
            raise bad('"links" must be an object of transport -> {"alpha", "beta"}')
        for name, entry in raw_links.items():
            if not isinstance(entry, dict):
                raise bad(f'links.{name} must be an object with "alpha" and "beta"')
            links[name] = (positive(entry.get("alpha"), f"links.{name}.alpha"),
                           positive(entry.get("beta"), f"links.{name}.beta"))
        gammas = dict(DEFAULT_GAMMAS)
        raw_gamma = data.get("gamma", {})
        if not isinstance(raw_gamma, dict):
            raise bad('"gamma" must be an object of dtype -> seconds per byte')
        for name, value in raw_gamma.items():
            gammas[name] = positive(value, f"gamma.{name}")
        sweeps = []
        raw_sweeps = data.get("sweeps", [])
        if not isinstance(raw_sweeps, list):
            raise bad('"sweeps" must be a list')
        from . import algorithms
        for i, s in enumerate(raw_sweeps):
            try:
                collective, sizes = s["collective"], tuple(int(x) for x in s["sizes"])
                valid = algorithms.names(collective)
                seconds = {k: tuple(positive(t, f"sweeps[{i}].seconds.{k}") for t in v)
                           for k, v in s["seconds"].items()}
                sweep = Sweep(collective, tuple(int(x) for x in s["local_sizes"]),
                              tuple(str(r) for r in s["routes"]), str(s.get("dtype", "float32")),
                              sizes, seconds)
            except UsageError:
                raise
            except (KeyError, TypeError, ValueError) as err:
                raise bad(f"sweeps[{i}] is malformed ({type(err).__name__}: {err})") from None
            unknown = set(seconds) - set(valid)
            if unknown:
                raise bad(f"sweeps[{i}] names unknown {collective} algorithms {sorted(unknown)} "
                          f"(expected some of {', '.join(valid)})")
            if list(sizes) != sorted(set(sizes)) or any(len(v) != len(sizes) for v in seconds.values()):
                raise bad(f"sweeps[{i}]: sizes must ascend and every algorithm needs one time per size")
            sweeps.append(sweep)
        return cls(links, gammas, tuple(sweeps), source=source)


DEFAULT_TUNING = Tuning()


def default_path() -> Path:
    explicit = os.environ.get("RINGCOMM_TUNING_FILE")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ringcomm" / "tuning.json"


_loaded: dict = {}


def load_tuning(path: Optional[os.PathLike] = None) -> Tuning:
    """The tuning at ``path`` (default: ``default_path()``); built-in defaults when the default
    file does not exist. A file named explicitly must exist. Parsed once per file version."""
    explicit = path is not None or bool(os.environ.get("RINGCOMM_TUNING_FILE"))
    path = Path(path) if path is not None else default_path()
    try:
        stat = path.stat()
    except FileNotFoundError:
        if explicit:
            raise UsageError(f"tuning file {path} does not exist (from RINGCOMM_TUNING_FILE or the "
                             f"path given); create it with `mpirun -n 2 python -m ringcomm.tune "
                             f"--out {path}` or unset RINGCOMM_TUNING_FILE") from None
        return DEFAULT_TUNING
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _loaded:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UsageError(f"tuning file {path}: not readable JSON ({err}); fix or delete it, or "
                             f"re-run `mpirun -n 2 python -m ringcomm.tune`") from None
        _loaded[key] = Tuning.from_json(data, str(path))
    return _loaded[key]


def save_tuning(tuning: Tuning, path: os.PathLike, **meta) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(tuning.to_json(**meta), indent=1))
    os.replace(tmp, path)
    return path


# ---- measurement (runs under mpirun) ------------------------------------------------------------

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


def parse_size(text: str) -> int:
    """"4096", "64K", "1M", "32MiB" -> bytes (binary units)."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = -1
    if not value >= 0 or value != int(value):
        raise UsageError(f'size {text!r}: expected bytes like 4096, 64K, 1M or 32MiB')
    return int(value)


def measure_link(comm, a: int, b: int, sizes, budget: float) -> Optional[tuple]:
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

    from . import executor
    from .schedule import Recv, Send
    work = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    pair = [(Send(peer, 0, nbytes),), (Recv(peer, 0, nbytes),)]
    program = executor.compile_program(pair if comm.rank == a else pair[::-1])
    count = np.zeros(1, np.int64)

    def rounds(n, seq0):
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            executor.run(program, comm.transport, work, None, seq=seq0 + i, timeout=60, what="tune ping-pong")
            out.append((time.perf_counter() - t0) / 2)
        return out
    probe = rounds(3, 1)
    # a tells b how many more rounds fit the budget, over the same pair, so both stop together.
    tell = executor.compile_program([(Send(peer, 0, 1),)] if comm.rank == a else [(Recv(peer, 0, 1),)])
    if comm.rank == a:
        count[0] = max(3, min(200, int(budget / max(2 * statistics.median(probe), 1e-7))))
    executor.run(tell, comm.transport, count, None, seq=5000, timeout=60, what="tune ping-pong")
    return statistics.median(probe + rounds(int(count[0]), 10))


def measure_gammas(budget: float = 0.05) -> dict:
    """Seconds per byte of ``dst = dst + src`` for every dtype, from 1 MiB and 4 MiB (slope)."""
    import numpy as np

    from .ops import DTYPES, ReduceOp, reducer
    out = {}
    for name, dtype in DTYPES.items():
        reduce = reducer(ReduceOp.SUM, dtype)
        times = []
        for nbytes in (1 << 20, 4 << 20):
            n = nbytes // dtype.itemsize
            dst, src = np.ones(n, dtype.storage), np.ones(n, dtype.storage)
            samples, start = [], time.perf_counter()
            while len(samples) < 3 or (time.perf_counter() - start < budget and len(samples) < 50):
                t0 = time.perf_counter()
                reduce(dst, src)
                samples.append(time.perf_counter() - t0)
            times.append(min(samples))   # the kernel's speed, not the noise of a shared machine
        out[name] = max((times[1] - times[0]) / (3 << 20), times[1] / (4 << 20) / 2)
    return out


def sweep_all_reduce(comm, sizes, rounds: int, budget: float) -> dict:
    """Median seconds of each all-reduce algorithm at each size, algorithms interleaved."""
    import numpy as np

    from . import algorithms
    names = algorithms.names("all_reduce")
    seconds = {name: [] for name in names}
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        comm.all_reduce(x, algorithm="ring")                     # warm the plan caches
        probe = time.perf_counter()
        comm.all_reduce(x, algorithm="ring")
        per = np.array([time.perf_counter() - probe])
        comm.broadcast(per)                                       # every rank runs the same count
        iters = int(max(1, min(50, budget / max(per[0], 1e-6))))
        samples = {name: [] for name in names}
        for name in names:
            comm.all_reduce(x, algorithm=name)                    # plan cached before timing
        for _ in range(rounds):
            for name in names:
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x, algorithm=name)
                samples[name].append((time.perf_counter() - t0) / iters)
        for name in names:
            seconds[name].append(statistics.median(samples[name]))
    return seconds


def crossovers(sizes, seconds: dict) -> list:
    """[(size where the winner changes, previous winner, new winner), ...]."""
    out, prev = [], None
    for i, nbytes in enumerate(sizes):
        best = min(seconds, key=lambda name: seconds[name][i])
        if prev is not None and best != prev:
            out.append((nbytes, prev, best))
        prev = best
    return out


def main(argv=None) -> int:
    import argparse

    import numpy as np

    import ringcomm

    from .selector import Selector, predict, routes_of
    parser = argparse.ArgumentParser(prog="python -m ringcomm.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where to write (default: RINGCOMM_TUNING_FILE or "
                                      "~/.cache/ringcomm/tuning.json)")
    parser.add_argument("--max-size", default="32M", help="largest all-reduce size swept (default 32M)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size (default 5)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds (a smoke test)")
    args = parser.parse_args(argv)
    os.environ.pop("RINGCOMM_ALGO", None)    # tune must be free to run every algorithm
    started = time.perf_counter()
    comm = ringcomm.init()
    topo = comm.topology
    if comm.size < 2:
        raise SystemExit("ringcomm.tune needs at least 2 ranks: mpirun -n 2 python -m ringcomm.tune")
    intra_route, inter_route = routes_of(comm.transport)
    pairs = {}
    same = [r for r in range(1, comm.size) if topo.same_node(0, r)]
    other = [r for r in range(1, comm.size) if not topo.same_node(0, r)]
    if same:
        pairs[intra_route] = same[0]
    if other:
        pairs.setdefault(inter_route, other[0])
    budget = 0.02 if args.quick else 0.1
    link_sizes = [8, 1 << 10, 8 << 10, 64 << 10, 512 << 10, 4 << 20]
    links = dict(DEFAULT_LINKS)
    for route, peer in pairs.items():
        fitted = measure_link(comm, 0, peer, link_sizes, budget)
        if comm.rank == 0:
            links[route] = fitted
    gammas = measure_gammas() if comm.rank == 0 else None
    top = parse_size(args.max_size)
    sizes = [8 << (2 * k) for k in range(20) if 8 << (2 * k) <= top]
    if args.quick:
        sizes = sizes[::2]
    seconds = sweep_all_reduce(comm, sizes, 2 if args.quick else args.rounds, 0.01 if args.quick else 0.03)
    if comm.rank == 0:
        from .selector import local_sizes
        shape = local_sizes(topo.node_of, comm.size)
        sweep = Sweep("all_reduce", shape, (intra_route, inter_route), "float32", tuple(sizes),
                      {k: tuple(v) for k, v in seconds.items()})
        tuning = Tuning(links, gammas, (sweep,), source="measured")
        path = Path(args.out).expanduser() if args.out else default_path()
        save_tuning(tuning, path, host=socket.gethostname(), ranks=comm.size, local_sizes=list(shape),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        for route in pairs:
            a, b = links[route]
            print(f"{route:8s} alpha {a * 1e6:8.2f} us   beta {1 / b / 1e9:6.2f} GB/s")
        print("gamma    " + "  ".join(f"{k} {1 / v / 1e9:.2f} GB/s" for k, v in gammas.items()))
        model = Selector(tuning=Tuning(links, gammas))
        net = model.network(comm.size, topo.node_of, "float32", (intra_route, inter_route))
        predicted = {name: [dict(predict("all_reduce", s, net))[name] for s in sizes] for name in seconds}
        print(f"{'bytes':>10}  {'measured best':<20}{'model best':<20}" + "".join(f"{n[:12]:>13}" for n in seconds))
        for i, s in enumerate(sizes):
            best = min(seconds, key=lambda n: seconds[n][i])
            guess = min(predicted, key=lambda n: predicted[n][i])
            print(f"{s:>10}  {best:<20}{guess:<20}" + "".join(f"{seconds[n][i] * 1e6:>11.1f}us" for n in seconds))
        print("measured crossovers: " + ("; ".join(f"{a} -> {b} at {s} B" for s, a, b in crossovers(sizes, seconds)) or "none"))
        print("model crossovers:    " + ("; ".join(f"{a} -> {b} at {s} B" for s, a, b in crossovers(sizes, predicted)) or "none"))
        print(f"wrote {path} in {time.perf_counter() - started:.1f} s")
    comm.barrier()
    comm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
