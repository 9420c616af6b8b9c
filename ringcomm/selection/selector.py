"""Choosing an algorithm: the candidate with the lowest predicted time under the cost model.

Selection is data plus a model, not a chain of size thresholds: the registry lists the algorithms
of each collective, each states its own cost, and a ``Tuning`` (built-in defaults, or what
``python -m ringcomm.tune`` measured on this machine) says what one message, one byte moved and
one byte reduced cost on each transport. For a call the selector builds the ``Network`` the call
runs over (intra-node link, inter-node link, ranks on each node), asks every candidate for its
predicted time and takes the smallest. Where the tuning file also holds a measured sweep for
exactly this job shape, the measurement overrules the model, but only where it disagrees by more
than MEASURED_MARGIN: a shared machine's noise then cannot make the choice flip between sizes.

``RINGCOMM_ALGO`` forces a choice ("ring", or "all_reduce=ring,broadcast=pipeline");
``explain`` returns the whole table so a user can see why; ``RINGCOMM_DEBUG=info`` logs the
algorithm of every call to stderr.
"""
from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

from .. import algorithms, env
from ..core.ops import DTYPES, ReduceOp, round_code
from ..errors import UsageError
from ..topology import last_level_cache
from .cost import Link, Network, crowded, crowded_reads, crowded_round, crowded_window
from .tuning import DEFAULT_TUNING, Tuning, load_tuning

MEMO_LIMIT = 4096   # distinct (collective, bytes, shape) choices remembered per selector
MEASURED_MARGIN = 1.10   # the model's pick stands unless measured more than 10% slower than the best


def decide(predicted: dict, measured: dict) -> tuple:
    """(algorithm, reason) from the model's table and, where there is one, the measured one."""
    pick = min(predicted, key=predicted.get)
    if measured and pick in measured:
        best = min(measured, key=measured.get)
        if measured[pick] > MEASURED_MARGIN * measured[best]:
            return best, (f"measured on this machine: {pick} (model's pick) was "
                          f"{measured[pick] / measured[best]:.2f}x slower than {best}")
        return pick, "lowest predicted time, confirmed by this machine's tuning sweep"
    return pick, "lowest predicted time"


@dataclass
class Choice:
    collective: str
    nbytes: int
    size: int
    algorithm: str
    predicted: dict = field(default_factory=dict)   # name -> seconds (model)
    reason: str = ""
    measured: dict = field(default_factory=dict)    # name -> seconds (tuning sweep), if any
    network: Optional[Network] = None


def local_sizes(nodes, size: int) -> tuple:
    """Ranks on each node, nodes in order of first appearance; one node when unknown."""
    if nodes is None:
        return (size,)
    counts: dict = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts.values())


def routes_of(transport, nodes=None) -> tuple:
    """(intra-node, inter-node) transport names, the keys of the tuning's links.

    A transport may say so outright with ``link_names = {"intra": ..., "inter": ...}``. A routed
    transport (``routes``: peer -> the transport serving it, shared memory for peers of this
    node, MPI for the others) is read peer by peer against the node map. Otherwise the
    transport's own name serves both. A job on one node has no inter-node traffic: its inter
    name is its intra name."""
    names = getattr(transport, "link_names", None)
    if names:
        return names["intra"], names["inter"]
    own = getattr(transport, "name", "mpi")
    peers = getattr(transport, "routes", None)
    if not isinstance(peers, dict) or not peers:
        return own, own
    rank = getattr(transport, "rank", None)

    def served(same_node):
        found = {getattr(t, "name", own) for p, t in peers.items()
                 if nodes is None or rank is None or (nodes[p] == nodes[rank]) == same_node}
        return found.pop() if len(found) == 1 else (own if found else None)
    if nodes is None or rank is None:
        both = served(True)
        return both, both
    intra, inter = served(True), served(False)
    intra = intra or inter or own
    return intra, inter or intra


@lru_cache(maxsize=8192)
def predict(collective: str, nbytes: int, net: Network, uneven: bool = False) -> tuple:
    """((name, predicted seconds), ...) for every algorithm of ``collective``, registry order.
    Algorithms that need equal counts cannot run an ``uneven`` call: infinitely expensive."""
    out = []
    # What a schedule pays once per call whatever its steps (the executor compiling the call's
    # steps, the transport staging its arrays): measured by `tune` ("plus N us per call").
    fixed = net.call if net.size > 1 and nbytes > 0 else 0.0
    for name in algorithms.names(collective):
        algorithm = algorithms.get(collective, name)
        if uneven and algorithm.kind == "schedule" and algorithm.even_only:
            out.append((name, math.inf))
        else:
            out.append((name, algorithm.cost(nbytes, net) + (fixed if algorithm.kind == "schedule" else 0.0)))
    return tuple(out)


def parse_forced(spec: Optional[str], source: str = "RINGCOMM_ALGO") -> dict:
    """"ring" -> ring wherever a collective has one; "all_reduce=ring,broadcast=pipeline" per
    collective. Unknown collectives or algorithms raise UsageError listing the valid names."""
    forced: dict = {}
    if not spec or not spec.strip():
        return forced
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if "=" in item:
            collective, name = (s.strip() for s in item.split("=", 1))
            if collective not in algorithms.COLLECTIVES:
                raise UsageError(f"{source}={spec!r}: unknown collective {collective!r} "
                                 f"(expected one of {', '.join(algorithms.COLLECTIVES)})")
            valid = algorithms.names(collective)
            if name not in valid:
                raise UsageError(f"{source}={spec!r}: unknown {collective} algorithm {name!r} "
                                 f"(expected one of {', '.join(valid)})")
            forced[collective] = name
        else:
            having = [c for c in algorithms.COLLECTIVES if item in algorithms.names(c)]
            if not having:
                every = sorted({n for c in algorithms.COLLECTIVES for n in algorithms.names(c)})
                raise UsageError(f"{source}={spec!r}: unknown algorithm {item!r} "
                                 f"(expected one of {', '.join(every)}, or collective=algorithm)")
            for collective in having:
                forced.setdefault(collective, item)
    return forced


def configure_debug_logging() -> None:
    """RINGCOMM_DEBUG=info (or debug) sends ringcomm's log records to stderr, once."""
    level = env.get("RINGCOMM_DEBUG").upper()
    root = logging.getLogger("ringcomm")
    if level not in ("INFO", "DEBUG") or getattr(root, "_ringcomm_handler", False):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ringcomm %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root._ringcomm_handler = True



def compiles(dtype: str) -> bool:
    """True when the compiled window round sums ``dtype`` (its pricing assumes a sum: the ops it
    leaves to Python, min and max of floats, are rare in all-reduce)."""
    found = DTYPES.get(dtype)
    return found is not None and round_code(ReduceOp.SUM, found) >= 0

class Selector:
    """Picks an algorithm per call. ``link`` (one Link for every transport) is kept for callers
    that model a single link; ``tuning`` carries per-transport links and per-dtype gammas."""

    def __init__(self, link: Optional[Link] = None, forced: Optional[dict] = None,
                 tuning: Optional[Tuning] = None):
        self.tuning = tuning or DEFAULT_TUNING
        self.link = link
        self.forced = dict(forced or {})   # collective -> algorithm name
        for collective, name in self.forced.items():
            algorithms.get(collective, name)
        self._networks: dict = {}
        self._memo: dict = {}
        self._routes: dict = {}
        self.ranks_per_core = 1.0   # > 1 when the ranks of this host outnumber its cores (set_host)
        self.cache_bytes = 0        # the host's last-level cache, 0 unknown (set_host)
        self.fast_reads = False     # every host of the job reads peers' memory fast (set_host)
        self.compiled_everywhere = True   # False when some rank runs the Python window rounds (set_job)

    def set_host(self, ranks_here: int, cores: int, cache_bytes: Optional[int] = None,
                 fast_reads: bool = False) -> None:
        """The ranks of this job on this machine, the cores they share and their last-level
        cache (default: this machine's; 0 unknown): the model prices oversubscription
        (cost.crowded) and copies from cache (Network.window_beta) from them. ``fast_reads``:
        every host's start-up probe found CMA reads cheap (agreement.py), which prices the
        direct algorithms with the "-direct-fast" link (Tuning.direct_name). ``ringcomm.init``
        calls it; in-process thread ranks (ringcomm.testing) share one interpreter, not cores,
        and never do."""
        self.ranks_per_core = max(1.0, ranks_here / max(1, cores))
        self.cache_bytes = last_level_cache() if cache_bytes is None else max(0, int(cache_bytes))
        self.fast_reads = bool(fast_reads)
        self._networks.clear()
        self._memo.clear()

    def set_job(self, compiled_everywhere: bool) -> None:
        """Whether every rank of the job runs the compiled window rounds (``ringcomm.init`` learns
        it: agreement.py). The two kinds of round work together (tests/mpi_jobs/compiled_round.py)
        but cost differently, so where some rank runs the Python rounds every rank prices those,
        and all choose alike."""
        self.compiled_everywhere = bool(compiled_everywhere)
        self._routes.clear()
        self._networks.clear()
        self._memo.clear()

    @classmethod
    def from_env(cls) -> "Selector":
        """RINGCOMM_ALGO and the tuning file (RINGCOMM_TUNING_FILE or the default location)."""
        configure_debug_logging()
        return cls(forced=parse_forced(env.raw("RINGCOMM_ALGO")), tuning=load_tuning())

    def network(self, size: int, nodes=None, dtype: str = "float32", routes=("mpi", "mpi"),
                window_bytes: int = 0, direct: bool = False, compiled: bool = False) -> Network:
        """The links of a job; ``window_bytes`` > 0 when its transport offers a shared window
        (priced by the tuning's "<intra>-window" link), ``direct`` when that window can also read
        peers' memory in place (the "<intra>-direct" link), ``compiled`` when its all-reduce round
        is compiled (the "<intra>-round" link, where the tuning has one and the dtype compiles)."""
        key = (size, nodes, dtype, routes, window_bytes, direct, compiled)
        net = self._networks.get(key)
        if net is None:
            if self.link is not None:
                intra = inter = self.link
            else:
                intra, inter = (self.tuning.link(r, dtype) for r in routes)
            window = self.tuning.link(f"{routes[0]}-window", dtype) if window_bytes else None
            reads_name = self.tuning.direct_name(routes[0], self.fast_reads) if window_bytes and direct else None
            reads = None if reads_name is None else self.tuning.link(reads_name, dtype)
            round_ = None
            if window_bytes and compiled and f"{routes[0]}-round" in self.tuning.links and compiles(dtype):
                round_ = self.tuning.link(f"{routes[0]}-round", dtype).with_gamma(0.0)
            fast_reads = reads_name is not None and reads_name.endswith("-fast")
            # The compiled direct rounds read by CMA themselves only where reads go straight, with
            # no detour past slow distances (cma.PeerMemory); every host measured whose reads are
            # fast is one of those. fast_reads and compiled are agreed by the job, so every rank
            # prices alike whichever road it runs.
            direct_round = None
            if fast_reads and compiled and f"{routes[0]}-direct-round" in self.tuning.links:
                direct_round = self.tuning.link(f"{routes[0]}-direct-round", dtype).with_gamma(0.0)
            c = self.ranks_per_core
            # Ranks sharing cores share their caches too: 4 ranks on 2 cores measured direct
            # 1.3-1.7x faster than one_shot at 2-4 MiB (broadcast, reduce-scatter) with it.
            cached = f"{routes[0]}-window-cached"
            cached = self.tuning.link(cached, dtype) if window and c <= 1 and cached in self.tuning.links else None
            # A fast-read host's direct reads beat the round even in cache (Tuning.direct_name);
            # a tuning file that measured the round answers for this host whatever the cache.
            round_cached = f"{routes[0]}-round-cached"
            round_cached = (self.tuning.link(round_cached, dtype).with_gamma(0.0)
                            if round_ and c <= 1 and not fast_reads and round_cached in self.tuning.links
                            and self.tuning.guessed(f"{routes[0]}-round") else None)
            net = self._networks[key] = Network(crowded(intra, c), crowded(inter, c), local_sizes(nodes, size),
                                                window=crowded_window(window, c), window_bytes=window_bytes,
                                                direct=crowded_reads(reads, c), round=crowded_round(round_, c),
                                                crowding=c, window_cached=cached, cache_bytes=self.cache_bytes,
                                                fast_reads=fast_reads, direct_round=crowded_round(direct_round, c),
                                                round_cached=round_cached)
        return net

    def explain(self, collective: str, nbytes: int, size: int, *, dtype: str = "float32", nodes=None,
                routes=("mpi", "mpi"), window_bytes: int = 0, direct: bool = False,
                compiled: bool = False) -> Choice:
        net = self.network(size, nodes, dtype, routes, window_bytes, direct, compiled)
        predicted = dict(predict(collective, nbytes, net))
        measured = self.tuning.measured_times(collective, nbytes, net.local_sizes, routes, dtype)
        choice = Choice(collective, nbytes, size, "", predicted, "", measured, net)
        if collective in self.forced:
            choice.algorithm, choice.reason = self.forced[collective], "forced by RINGCOMM_ALGO"
        else:
            choice.algorithm, choice.reason = decide(predicted, measured)
        return choice

    def _shape_of(self, transport, nodes) -> tuple:
        """(routes, window bytes, direct reads, compiled round) of a transport: routes_of and its
        window, remembered per (transport, node map) since routes_of walks every peer."""
        if transport is None:
            return ("mpi", "mpi"), 0, False, False
        cached = self._routes.get(id(transport))
        if cached is None or cached[0] is not transport or cached[1] != nodes \
                or cached[3] != getattr(transport, "link_names", None):
            window = getattr(transport, "window", None)
            cached = self._routes[id(transport)] = (transport, nodes, routes_of(transport, nodes),
                                                    getattr(transport, "link_names", None),
                                                    0 if window is None else window.capacity,
                                                    window is not None and window.reader is not None,
                                                    window is not None and window.core is not None
                                                    and self.compiled_everywhere)
        return cached[2], cached[4], cached[5], cached[6]

    def choose(self, collective: str, nbytes: int, size: int, *, dtype: str = "float32", nodes=None,
               transport=None, window: bool = True, uneven: bool = False) -> str:
        """The algorithm for one call; memoised per distinct call shape (a training loop repeats
        a handful of them), so this costs a dict lookup after the first call. ``window=False``:
        the buffer cannot use the transport's window (device memory)."""
        forced = self.forced.get(collective)
        if forced is not None and not (uneven and algorithms.get(collective, forced).even_only):
            return forced
        # An algorithm for equal counts, forced for every call, passes an uneven one to the cost
        # model (as MPICH does with a forced algorithm that does not apply). Run anyway, bruck
        # took an uneven all_to_all's splits for equal blocks: a false MismatchError, or where
        # the sizes happened to pair up, an output with elements never written.
        routes, window_bytes, direct, compiled = self._shape_of(transport, nodes)
        window_bytes = window_bytes if window else 0
        key = (collective, nbytes, size, dtype, nodes, routes, window_bytes, direct, compiled, uneven)
        name = self._memo.get(key)
        if name is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            net = self.network(size, nodes, dtype, routes, window_bytes, direct, compiled)
            measured = self.tuning.measured_times(collective, nbytes, net.local_sizes, routes, dtype)
            name = self._memo[key] = decide(dict(predict(collective, nbytes, net, uneven)), measured)[0]
        return name


def describe(choice: Choice) -> str:
    """A table of every candidate, as ``python -m ringcomm.explain`` prints it."""
    net = choice.network
    lines = [f"{choice.collective}, {choice.nbytes} bytes, {choice.size} ranks"
             + (f" on {net.nodes} node(s) of {'/'.join(map(str, sorted(set(net.local_sizes))))}" if net else "")]
    if net is not None:
        for label, link in (("intra-node", net.intra), ("inter-node", net.inter)):
            lines.append(f"  {label} link: alpha {link.alpha * 1e6:.2f} us, "
                         f"{1 / link.beta / 1e9:.2f} GB/s, reduce {1 / link.gamma / 1e9:.2f} GB/s")
        if net.crowding > 1:
            lines.append(f"  oversubscribed: {net.crowding:g} ranks per core (links above include it: copies and "
                         f"reductions get a share of a core, each step a hand-off)")
        if net.window is not None:
            lines.append(f"  shared window: alpha {net.window.alpha * 1e6:.2f} us per round, "
                         f"{1 / net.window.beta / 1e9:.2f} GB/s, {net.window_bytes >> 10} KiB per rank and round")
            if net.window_cached is not None:
                lines.append(f"  shared window from cache (broadcast, reduce_scatter; every rank's vector in half of "
                             f"{net.cache_bytes >> 20} MiB): {1 / net.window_cached.beta / 1e9:.2f} GB/s")
        else:
            lines.append("  shared window: none (one_shot cannot run)")
        if net.round is not None:
            lines.append(f"  compiled all-reduce round: alpha {net.round.alpha * 1e6:.2f} us per round, "
                         f"{1 / net.round.beta / 1e9:.2f} GB/s per byte written or read, reduction included")
            if net.round_cached is not None:
                lines.append(f"  compiled all-reduce round from cache (every rank's vector in half of "
                             f"{net.cache_bytes >> 20} MiB): {1 / net.round_cached.beta / 1e9:.2f} GB/s")
        if net.direct is not None:
            host = " (a host whose reads are fast)" if net.fast_reads else ""
            lines.append(f"  direct reads of peers' memory{host}: alpha {net.direct.alpha * 1e6:.2f} us per read, "
                         f"{1 / net.direct.beta / 1e9:.2f} GB/s")
            if net.direct_round is not None:
                lines.append(f"  compiled direct all-to-all: alpha {net.direct_round.alpha * 1e6:.2f} us per peer "
                             f"read, rounds included, {1 / net.direct_round.beta / 1e9:.2f} GB/s")
        elif net.window is not None:
            lines.append("  direct reads of peers' memory: none (direct cannot run)")
    head = f"  {'algorithm':<20}{'predicted':>14}" + (f"{'measured':>14}" if choice.measured else "")
    lines.append(head)
    for name, seconds in sorted(choice.predicted.items(), key=lambda kv: kv[1]):
        mark = "  <- chosen" if name == choice.algorithm else ""
        row = f"  {name:<20}{fmt_seconds(seconds):>14}"
        if choice.measured:
            row += f"{fmt_seconds(choice.measured[name]) if name in choice.measured else '-':>14}"
        lines.append(row + mark)
    lines.append(f"choice: {choice.algorithm} ({choice.reason})")
    return "\n".join(lines)


def fmt_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"
