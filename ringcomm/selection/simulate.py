"""Predict collectives at scale with the selector's own cost model: nothing runs.

    python -m ringcomm.simulate                        # every built-in cluster
    python -m ringcomm.simulate --cluster gpu-nvlink-400g --sizes 1K,1M,256M
    python -m ringcomm.simulate --config my_cluster.json

For 2..4096 ranks on a described cluster it prints the crossover table (which algorithm the
model picks over which message sizes) and, at a few sizes, the chosen algorithm's predicted time
and bus bandwidth beside the flat ring's. A cluster is a small JSON object:

    {"name": {"ranks_per_node": 8, "nics_per_node": 8,
              "intra": {"alpha_us": 1.0, "GBps": 300},       # one rank's link inside a node
              "inter": {"alpha_us": 5.0, "GBps": 50},        # one network card
              "reduce_GBps": 1000}}                          # local reduction speed

``nics_per_node`` 0 means every rank has its own path between nodes.
"""
from __future__ import annotations

import argparse
import json
import sys

from .. import algorithms, collectives
from ..errors import UsageError
from .cost import Link, Network, uniform
from .selector import fmt_seconds, predict
from .tuning import parse_size

# Figures are public orders of magnitude, not measurements: H100-class nodes (NVLink 4 at about
# 300 GB/s of achievable bus bandwidth per GPU, one 400 Gb/s NIC per GPU) and CPU nodes running
# 32 MPI ranks over shared memory with one 100 Gb/s Ethernet card per node.
CLUSTERS = {
    "gpu-nvlink-400g": {"ranks_per_node": 8, "nics_per_node": 8,
                        "intra": {"alpha_us": 1.0, "GBps": 300.0},
                        "inter": {"alpha_us": 5.0, "GBps": 45.0},
                        "reduce_GBps": 1000.0},
    "cpu-100gbe": {"ranks_per_node": 32, "nics_per_node": 1,
                   "intra": {"alpha_us": 1.0, "GBps": 4.0},
                   "inter": {"alpha_us": 15.0, "GBps": 11.0},
                   "reduce_GBps": 5.0},
}

def cluster_links(spec: dict, name: str) -> tuple:
    """(intra Link, inter Link, ranks per node, nics) from a cluster description."""
    try:
        gamma = 1 / (spec["reduce_GBps"] * 1e9)
        links = [Link(spec[k]["alpha_us"] * 1e-6, 1 / (spec[k]["GBps"] * 1e9), gamma) for k in ("intra", "inter")]
        per_node, nics = int(spec["ranks_per_node"]), int(spec.get("nics_per_node", 0))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        raise UsageError(f"cluster {name!r}: malformed description ({type(err).__name__}: {err}); "
                         f"see python -m ringcomm.simulate --help") from None
    if per_node < 1 or nics < 0 or any(v <= 0 for link in links for v in (link.alpha, link.beta)):
        raise UsageError(f"cluster {name!r}: ranks_per_node >= 1, nics_per_node >= 0 and positive "
                         f"latencies and bandwidths expected")
    return links[0], links[1], per_node, nics


def world_sizes(limit: int = 4096) -> list:
    return [1 << k for k in range(1, limit.bit_length()) if 1 << k <= limit]


def best(collective: str, nbytes: int, net: Network) -> tuple:
    table = dict(predict(collective, nbytes, net))
    name = min(table, key=table.get)
    return name, table[name], table


def crossover_row(collective: str, net: Network, sizes) -> list:
    """[(first size, algorithm), ...]: where along ``sizes`` the model's choice changes."""
    row = []
    for nbytes in sizes:
        name = best(collective, nbytes, net)[0]
        if not row or row[-1][1] != name:
            row.append((nbytes, name))
    return row


def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


def report(name: str, spec: dict, collective: str, sizes, max_ranks: int, out=sys.stdout) -> None:
    intra, inter, per_node, nics = cluster_links(spec, name)
    print(f"== {name}: {per_node} ranks/node, intra {1 / intra.beta / 1e9:g} GB/s {intra.alpha * 1e6:g} us, "
          f"inter {1 / inter.beta / 1e9:g} GB/s {inter.alpha * 1e6:g} us, "
          f"{nics or 'per-rank'} NIC(s)/node, reduce {1 / intra.gamma / 1e9:g} GB/s", file=out)
    sweep = [8 << k for k in range(0, 28)]   # 8 B .. 1 GiB
    print(f"-- {collective} crossovers (algorithm from the size shown up to the next)", file=out)
    for n in world_sizes(max_ranks):
        net = uniform(intra, inter, per_node, n, nics)
        cells = "  ".join(f"{human(s)}: {a}" for s, a in crossover_row(collective, net, sweep))
        print(f"{n:>5} ranks {net.nodes:>4} node(s)  {cells}", file=out)
    factor = collectives.get(collective).bus_factor
    print("-- predicted time and busbw (GB/s) of the choice, and of the flat ring", file=out)
    print(f"{'ranks':>5}" + "".join(f"{human(s):>45}" for s in sizes), file=out)
    for n in world_sizes(max_ranks):
        net = uniform(intra, inter, per_node, n, nics)
        cells = []
        for s in sizes:
            algo, t, table = best(collective, s, net)
            ring = table.get("ring")
            bw = s / t * factor(n) / 1e9 if t > 0 else float("inf")
            ring_text = f" ring {s / ring * factor(n) / 1e9:6.1f}" if ring else ""
            cells.append(f"{algo:>18} {fmt_seconds(t):>9} {bw:6.1f}{ring_text}")
        print(f"{n:>5}" + "".join(f"{c:>45}" for c in cells), file=out)
    print(file=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringcomm.simulate",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--cluster", action="append", help=f"built-in cluster(s): {', '.join(CLUSTERS)}")
    parser.add_argument("--config", help="JSON file of cluster descriptions (replaces the built-ins)")
    parser.add_argument("--collective", default="all_reduce", choices=algorithms.COLLECTIVES)
    parser.add_argument("--sizes", default="1K,1M,256M", help="sizes for the busbw table (default 1K,1M,256M)")
    parser.add_argument("--max-ranks", type=int, default=4096)
    args = parser.parse_args(argv)
    if args.max_ranks < 2:   # the tables start at 2 ranks: fewer would print them empty
        parser.error(f"--max-ranks: expected at least 2, got {args.max_ranks}")
    try:
        clusters = CLUSTERS
        if args.config:
            try:
                with open(args.config) as f:
                    clusters = json.load(f)
            except (OSError, json.JSONDecodeError) as err:
                raise UsageError(f"cluster config {args.config}: {err}") from None
            if not isinstance(clusters, dict) or not clusters:
                raise UsageError(f"cluster config {args.config}: expected an object of name -> cluster")
        chosen = args.cluster or list(clusters)
        unknown = [c for c in chosen if c not in clusters]
        if unknown:
            raise UsageError(f"unknown cluster(s) {', '.join(unknown)} (expected one of {', '.join(clusters)})")
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        for name in chosen:
            report(name, clusters[name], args.collective, sizes, args.max_ranks)
    except UsageError as err:
        print(f"ringcomm.simulate: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
