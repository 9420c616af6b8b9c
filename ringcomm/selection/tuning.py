"""The tuning file: per-transport links, per-dtype reduction costs and measured sweeps.

Written by ``python -m ringcomm.tune`` (see there), read by every Communicator (through
``Selector.from_env``) from ``RINGCOMM_TUNING_FILE``, else ~/.cache/ringcomm/tuning.json
($XDG_CACHE_HOME respected). Without a file, the built-in defaults below apply. A file that
cannot be used raises UsageError naming the file and what is wrong with it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import env
from ..env import parse_size  # noqa: F401  (re-exported: callers parse sizes here)
from ..errors import UsageError
from .cost import DEFAULT_LINK, Link

FORMAT = 1

# Built-in per-transport links (alpha s/message, beta s/byte) and per-dtype reduction costs,
# from a 2-core x86 box, Python executor included; `ringcomm.tune` replaces them with measurements.
DEFAULT_LINKS = {
    "mpi": (DEFAULT_LINK.alpha, DEFAULT_LINK.beta),
    # shm: a message through the staging pool (descriptor, copy, acknowledgement), plus what a
    # schedule pays once per call; fitted by `mpirun -n 2 python -m ringcomm.tune` on this 2-core
    # VM (2026-12-01 02:56 UTC: "alpha as the collectives feel it 28.83 us, plus 85.5 us per call").
    "shm": (29e-6, 1 / 5.4e9, 85e-6),
    "threads": (20e-6, 1 / 4.0e9),   # in-process mailbox: a copy and a condition variable
    # Shared windows (one-shot rounds): alpha is one flag store and a poll of the peers' flags,
    # no descriptors, no executor; beta a plain copy in and out of the mapped slots.
    # shm-window: beta from the same run's one-shot sweep; alpha per 64 KiB round such that, with
    # the default gamma, one_shot's predicted 1 MiB time is what that sweep measured (309 us).
    "shm-window": (6e-6, 1 / 15.5e9),
    "threads-window": (20e-6, 1 / 4.0e9),
    # shm-window-cached: the same window while every rank's vector fits in half the last-level
    # cache (Network.window_beta; broadcast and reduce_scatter price their one_shot copies with
    # it). Forced one_shot broadcasts of 512 KiB-4 MiB on 2 ranks of this VM (2026-12-02 23:30
    # UTC, `mpirun -n 2 python -m ringcomm.tune --check`) ran at 10-20 us per MiB beyond their
    # rounds' alpha (50-100 GB/s); 30 GB/s is kept, for the VM's slower state.
    "shm-window-cached": (6e-6, 1 / 30e9),
    # shm-round: the compiled one-shot all-reduce round (core/_round.c) on the same window: alpha
    # per round, beta per byte written or read per rank, its reduction included. Fitted to forced
    # one_shot on 2 ranks of this VM (2026-12-01 08:00 UTC, benchmarks/allreduce_perf.py
    # --algorithm one_shot,direct): 1 KiB 1.3 us a round, 64 KiB 23 us, 256 KiB 73 us, 1 MiB
    # 184 us, 4 MiB 610-700 us, where direct took 610-660 us: the two tie at 4 MiB, and from
    # 8 MiB one_shot's full reduction on every rank loses (64 MiB: 13-19 ms against 11-13).
    "shm-round": (1.5e-6, 1 / 8.5e9),
    # shm-round-cached: the same round while every rank's vector fits in half the last-level cache
    # (Network.round_beta). Forced one_shot against direct on 2 ranks of this VM's EPYC host
    # (2026-12-06 18:14-18:16 UTC, two launches of `mpirun -n 2 python benchmarks/allreduce_perf.py
    # -b 2M -e 64M -f 2 --tensor numpy,torch --algorithm auto,one_shot,direct,ring`): one_shot ran
    # 2 S per rank at 32-34 GB/s in the VM's fast state and 21-23 in its slow one (4 MiB 250 and
    # 371 us, 8 MiB 519 and 777), where direct took 316-401 us at 4 MiB; 20 GB/s is kept, for the
    # slow state. Beyond the cache (16 MiB on 2 ranks) the plain round above holds.
    "shm-round-cached": (1.5e-6, 1 / 20e9),
    # Direct reads of a peer's buffer (the direct algorithms): a process_vm_readv system call.
    # Fitted to forced direct against one_shot runs of all four collectives at 64 KiB-16 MiB on
    # 2 ranks of this VM (2026-12-01 05:48 UTC): 8.5 GB/s, and 30 us per read, which also carries
    # what a direct call costs beyond its rounds (a 64 KiB direct all_reduce took 100 us against
    # one_shot's 36). Between threads a memmove.
    "shm-direct": (30e-6, 1 / 8.5e9),
    # The same reads on a host whose start-up probe finds them fast (cma.read_cost at most
    # cma.READ_FAST memcpys; the job agrees on it, agreement.py): an Intel Xeon host of this VM,
    # where a 1 MiB read costs 1.4-2.1 memcpys against the EPYC's 3.8, and where forced direct
    # beat one_shot from 1 MiB in six collectives (2026-12-04 15:55-16:04 UTC, `mpirun -n 2 python
    # benchmarks/allreduce_perf.py -b 256K -e 64M -f 4 --algorithm auto,all`: broadcast 1 MiB 40
    # us against 74, all_reduce 114 against 158, all_gather 71 against 102). The values are the
    # ones that choose the faster of the two at every size measured (all_to_all's 1 MiB since its
    # one_shot is priced without the cached window on such hosts, one_shot_all_to_all.py); they
    # under-price direct's time beyond the cache (16 MiB: 0.5-0.7x measured), where it is the
    # fastest anyway. Used only while "shm-direct" is the built-in guess above: a tuning file's
    # measured link is this host's own answer (Tuning.direct_name).
    "shm-direct-fast": (15e-6, 1 / 16e9),
    # The direct all-to-all's two rounds and reads run compiled (core/_round.c, ``direct``) where
    # the job runs the compiled rounds and reads fast: alpha per peer read, both rounds included,
    # beta per byte read. Forced on 2 ranks of the Xeon host (2026-12-04 21:10 UTC, /tmp script
    # timing 500 calls after mpi4py barriers): direct 6.3 us flat from 1 KiB to 32 KiB, 7.3 at
    # 64 KiB, 21 at 512 KiB, 67 at 1 MiB; one_shot 3.5, 4.2, 5.7 (16 KiB), 6.7 (32 KiB), 9.8
    # (64 KiB), 38.6 (512 KiB). The compiled round of one_shot is still priced on "shm-window"
    # (6 us a round), so alpha is the value that puts the crossover where it was measured, at
    # 16-32 KiB, rather than direct's own ~4 us.
    "shm-direct-round": (7e-6, 1 / 16e9),
    "threads-direct": (2e-6, 1 / 4.0e9),
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
    smooth: dict = field(init=False, compare=False, repr=False)   # seconds, running median

    def at(self, nbytes: int) -> dict:
        """Times at ``nbytes``, interpolated in log-log between the two measured neighbours;
        empty outside the measured range (the model answers there). Each algorithm's series is
        first smoothed by a running median over five neighbouring sizes: bursts of load that
        spoiled one or two sizes are dropped, a real crossover (which persists over sizes) stays,
        moved by at most two doublings, where the algorithms around it are close anyway."""
        sizes = self.sizes
        if not sizes or nbytes < sizes[0] or nbytes > sizes[-1]:
            return {}
        series = self.smooth
        hi = next(i for i, s in enumerate(sizes) if s >= nbytes)
        lo = max(hi - 1, 0)
        if sizes[hi] == nbytes or lo == hi:
            return {name: ts[hi] for name, ts in series.items()}
        w = math.log(nbytes / sizes[lo]) / math.log(sizes[hi] / sizes[lo])
        return {name: math.exp((1 - w) * math.log(ts[lo]) + w * math.log(ts[hi]))
                for name, ts in series.items()}

    def __post_init__(self):
        object.__setattr__(self, "smooth", {name: running_median(ts) for name, ts in self.seconds.items()})


def running_median(ts, reach: int = 2) -> tuple:
    """Median of each point and up to ``reach`` neighbours on each side (the window is clipped at
    the ends of the series, so an end point, too, is outvoted by its neighbours)."""
    out = []
    for i in range(len(ts)):
        window = sorted(ts[max(0, i - reach):i + reach + 1])
        out.append(window[len(window) // 2])
    return tuple(out)


@dataclass(frozen=True)
class Tuning:
    links: dict = field(default_factory=lambda: dict(DEFAULT_LINKS))     # transport -> (alpha, beta)
    gammas: dict = field(default_factory=lambda: dict(DEFAULT_GAMMAS))   # dtype -> gamma
    sweeps: tuple = ()
    source: str = "built-in defaults"
    cma_min: Optional[int] = None   # bytes from which the shm transport reads peers directly (tune measures it)
    cma_p2p_min: Optional[int] = None   # the same for sends (comm.send)

    def link(self, transport: str, dtype: str = "float32") -> Link:
        alpha, beta, *call = self.links.get(transport) or self.links.get("mpi") or DEFAULT_LINKS["mpi"]
        gamma = self.gammas.get(dtype, self.gammas.get("float32", DEFAULT_LINK.gamma))
        return Link(alpha, beta, gamma, call[0] if call else 0.0)

    def direct_name(self, route: str, fast_reads: bool = False) -> str:
        """The name of the direct algorithms' link over ``route``: "<route>-direct-fast" where the
        job's hosts read fast and "<route>-direct" is still the built-in guess, else
        "<route>-direct"."""
        name = f"{route}-direct"
        fast = f"{name}-fast"
        if fast_reads and fast in self.links and self.guessed(name):
            return fast
        return name

    def guessed(self, name: str) -> bool:
        """Whether link ``name`` is still the built-in guess, not a tuning file's measurement:
        the guesses made beside it (a fast-read host's reads, the round from cache) hold only
        then, as a measured link is this host's own answer."""
        return self.links.get(name) == DEFAULT_LINKS.get(name)

    def measured_times(self, collective: str, nbytes: int, local_sizes: tuple, routes: tuple,
                       dtype: str = "float32") -> dict:
        """The sweep's times for this job shape, if one was measured with a dtype that reduces
        about as fast per byte (float32 speaks for float64 and the ints; not for bfloat16,
        whose reductions are a hundred times slower here and move the crossovers)."""
        for sweep in self.sweeps:
            if (sweep.collective, sweep.local_sizes, sweep.routes) == (collective, tuple(local_sizes),
                                                                       tuple(routes)) \
                    and self._alike(dtype, sweep.dtype):
                return sweep.at(nbytes)
        return {}

    def _alike(self, a: str, b: str) -> bool:
        ga, gb = self.link("mpi", a).gamma, self.link("mpi", b).gamma
        return max(ga, gb) <= 2 * min(ga, gb)

    def to_json(self, **meta) -> dict:
        return {
            "format": FORMAT, **meta,
            "links": {t: {"alpha": v[0], "beta": v[1], **({"call": v[2]} if len(v) > 2 else {})}
                      for t, v in self.links.items()},
            "gamma": dict(self.gammas),
            "sweeps": [{"collective": s.collective, "local_sizes": list(s.local_sizes),
                        "routes": list(s.routes), "dtype": s.dtype, "sizes": list(s.sizes),
                        "seconds": {k: list(v) for k, v in s.seconds.items()}} for s in self.sweeps],
            **({} if self.cma_min is None else {"cma_min": self.cma_min}),
            **({} if self.cma_p2p_min is None else {"cma_p2p_min": self.cma_p2p_min}),
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
            if "call" in entry:   # zero allowed: a transport with no per-call cost of its own
                call = entry["call"]
                if call != 0:
                    call = positive(call, f"links.{name}.call")
                links[name] += (float(call),)
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
        from .. import algorithms
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
        floors = {}
        for key in ("cma_min", "cma_p2p_min"):
            value = floors[key] = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise bad(f'"{key}" must be a byte count >= 0, got {value!r}')
        return cls(links, gammas, tuple(sweeps), source=source, **floors)


DEFAULT_TUNING = Tuning()


def default_path() -> Path:
    explicit = env.get("RINGCOMM_TUNING_FILE")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ringcomm" / "tuning.json"


_loaded: dict = {}


def load_tuning(path: Optional[os.PathLike] = None) -> Tuning:
    """The tuning at ``path`` (default: ``default_path()``); built-in defaults when the default
    file does not exist. A file named explicitly must exist. Parsed once per file version."""
    explicit = path is not None or bool(env.get("RINGCOMM_TUNING_FILE"))
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
