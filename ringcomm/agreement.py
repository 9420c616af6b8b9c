"""The settings every rank must share, compared over the job at init before anything else runs.

Each rank reads its own environment and files, and the ranks choose an algorithm for every call
independently, trusting that the same inputs give the same choice. A job where a variable is set
on some ranks only (an MPMD launch line, a per-node shell profile) or whose nodes hold different
tuning files breaks that trust: measured on 2 ranks with one variable set on rank 0 only,
RINGCOMM_ALGO=ring and RINGCOMM_TRANSPORT=mpi ended in a 20 s timeout, RINGCOMM_DEBUG=detail and
RINGCOMM_CHECK_FINITE=1 in a MismatchError about a count both ranks agreed on, and
RINGCOMM_COMPILED=0 in one rank reading a peer's window data as an address (an EFAULT that time;
an address that happened to be mapped would have been read as data): the tuning file prices the
compiled round, so the two ranks chose different algorithms.

So ``init`` gathers each rank's ``Settings`` (one exchange) and raises UsageError on every rank,
naming each setting that differs and which ranks hold which value, or the problem a rank found
in its own environment (a malformed variable, an unreadable tuning file), so that no rank is
left waiting for one that gave up alone.

Some inputs of the cost model may differ honestly between ranks: the cores a rank may run on
(taskset, cgroups), the machine's last-level cache (nodes of two kinds), and whether a rank runs
the compiled window rounds (they work with the Python rounds, tests/mpi_jobs/compiled_round.py,
but cost less), and how fast its host reads a peer's memory by CMA (the hosts this VM lands on
differ 2x: cma.read_cost). The job agrees on them instead: the most crowded rank's share of a
core, the smallest cache, the Python rounds' price if any rank runs them, the slow-read price if
any rank's host reads slowly (``Agreed``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

from . import env
from .errors import UsageError

# What each field holds, in the words of the error.
_NAMES = {
    "backend": "the backend (ringcomm.init's argument or RINGCOMM_BACKEND)",
    "transport": "RINGCOMM_TRANSPORT",
    "algo": "RINGCOMM_ALGO",
    "preflight": "the pre-flight check (RINGCOMM_DEBUG=detail, RINGCOMM_CHECK_FINITE)",
    "tuning": "the tuning table (RINGCOMM_TUNING_FILE or the default location)",
}


@dataclass(frozen=True)
class Settings:
    """One rank's view: the fields that must be equal, then what the job agrees on, and its own problem."""
    backend: str
    transport: str
    algo: str
    preflight: str
    tuning: str              # a digest of the table's content: nodes may keep equal files in different places
    tuning_source: str = ""  # where it came from (said in the error, not compared)
    ranks_here: int = 1      # ranks of the job on this rank's machine
    cores: int = 1           # cores this rank may run on
    cache: int = 0           # bytes of this machine's last-level cache (0: unknown)
    compiled: bool = True    # this rank runs the compiled window rounds
    read_cost: float = 0.0   # a CMA read of 1 MiB over a memcpy on this host (cma.read_cost); 0: not measured
    problem: str = ""        # what this rank could not read (its own UsageError), else ""

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "Settings":
        return cls(**json.loads(text))


def local(backend: str, ranks_here: int) -> Settings:
    """This rank's settings; a problem reading them is kept in ``problem``, not raised, so that
    every rank still takes part in the exchange and raises it together."""
    from .core import compiled
    from .topology import last_level_cache
    from .transport.polling import cores
    problem, fields = "", {}
    try:
        env.check_all()
        fields = _fields(backend)
    except UsageError as err:
        problem = str(err)
    blank = {**dict.fromkeys(_NAMES, "?"), "tuning_source": "?"}
    return Settings(**{**blank, **fields}, ranks_here=ranks_here, cores=cores(), cache=last_level_cache(),
                    compiled=compiled.enabled(), read_cost=host_read_cost(backend, ranks_here), problem=problem)


def host_read_cost(backend: str, ranks_here: int) -> float:
    """This host's CMA read cost (about 3 ms, measured once per process: the shm transport's
    send floor asks for the same), where the direct algorithms may run: ringcomm's own backend,
    several ranks on this host, CMA not turned off. 0 elsewhere, and where the read fails."""
    if backend != "ringcomm" or ranks_here < 2:
        return 0.0
    from .transport.shm import cma
    try:
        if cma.blocked() is not None:
            return 0.0
        cost = cma.read_cost()
    except UsageError:   # RINGCOMM_SHM_CMA malformed: env.check_all reports it as this rank's problem
        return 0.0
    return cost if math.isfinite(cost) else 0.0


def _fields(backend: str) -> dict:
    from .selection.tuning import load_tuning
    debug, finite = env.get("RINGCOMM_DEBUG"), env.get("RINGCOMM_CHECK_FINITE")
    tuning = load_tuning()
    digest = hashlib.sha1(json.dumps(tuning.to_json(), sort_keys=True).encode()).hexdigest()[:12]
    return {
        "backend": backend,
        "transport": env.get("RINGCOMM_TRANSPORT"),
        "algo": (env.raw("RINGCOMM_ALGO") or "").strip() or "(unset)",
        "preflight": "off" if not (debug == "detail" or finite) else
                     f"on ({'fields' if debug == 'detail' else 'finite values only'})",
        "tuning": digest,
        "tuning_source": _short(tuning.source),
    }


def _short(path: str, keep: int = 60) -> str:
    return path if len(path) <= keep else "..." + path[-keep:]


def check(gathered: list) -> None:
    """Raise UsageError (the same text on every rank) if any rank found a problem or the ranks'
    settings differ; ``gathered``: every rank's Settings, in rank order."""
    problems = _grouped({i: s.problem for i, s in enumerate(gathered) if s.problem})
    if problems:
        raise UsageError("init: " + " | ".join(f"{who}: {text}" for text, who in problems.items()))
    differ = []
    for field, words in _NAMES.items():
        values = {i: getattr(s, field) for i, s in enumerate(gathered)}
        if len(set(values.values())) > 1:
            differ.append(f"{words}: " + "; ".join(f"{_shown(field, value, gathered)!r} on {who}"
                                                   for value, who in _grouped(values).items()))
    if differ:
        raise UsageError("init: the ranks of this job must share these settings, and do not (each rank "
                         "would choose its algorithms differently): " + " | ".join(differ) +
                         ". Set the same values on every rank (and copy one tuning file to every node)")


def _shown(field: str, value: str, gathered: list) -> str:
    """A value as the error says it: a tuning digest with where the ranks holding it read it."""
    if field != "tuning":
        return value
    sources = dict.fromkeys(s.tuning_source for s in gathered if s.tuning == value)
    return f"{value} from {', '.join(sources)}"


@dataclass(frozen=True)
class Agreed:
    """What every rank prices the cost model with: the most crowded rank's ranks and cores, the
    smallest cache any machine reports (0 if one does not say), whether every rank runs the
    compiled window rounds, and whether every rank's host reads peers' memory fast."""
    ranks_here: int
    cores: int
    cache: int
    compiled_everywhere: bool
    fast_reads: bool = False

    def apply(self, selector) -> None:
        selector.set_host(self.ranks_here, self.cores, self.cache, fast_reads=self.fast_reads)
        selector.set_job(self.compiled_everywhere)


def agreed(gathered: list) -> Agreed:
    from .transport.shm.cma import reads_fast
    crowded = max(gathered, key=lambda s: (s.ranks_here / max(1, s.cores), s.ranks_here))
    # The slowest reader decides: one fast rank's probe must not price every node's reads.
    return Agreed(crowded.ranks_here, crowded.cores, min(s.cache for s in gathered),
                  all(s.compiled for s in gathered), all(reads_fast(s.read_cost) for s in gathered))


def _grouped(values: dict) -> dict:
    """{value: "rank 0" / "ranks 1, 3"} in order of first appearance."""
    ranks_of: dict = {}
    for rank, value in values.items():
        ranks_of.setdefault(value, []).append(rank)
    return {v: f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}" for v, rs in ranks_of.items()}


def exchange(allgather, mine: Settings) -> Agreed:
    """Gather every rank's settings with ``allgather`` (text -> list of texts), check them, and
    return what the job agrees on."""
    gathered = [Settings.decode(text) for text in allgather(mine.encode())]
    check(gathered)
    return agreed(gathered)
