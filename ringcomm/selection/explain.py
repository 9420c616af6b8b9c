"""Show what the selector would pick, and why, without running anything.

    python -m ringcomm.explain --collective all_reduce --size 1M --ranks 16 --ranks-per-node 8

prints every candidate algorithm's predicted time (and measured time, where the tuning file holds
a sweep for this job shape) and the choice. It reads the same tuning file and RINGCOMM_ALGO as a
real job, so what it prints is what the job will do.
"""
from __future__ import annotations

import argparse
import sys

from .. import algorithms
from ..core import compiled, hugepages
from ..errors import UsageError
from ..transport.window import JOB_CAPACITY
from .selector import Selector, describe
from ..core.ops import DTYPES
from .tuning import DEFAULT_LINKS, parse_size

ROUTES = tuple(name for name in DEFAULT_LINKS if "-" not in name)   # the transports the tuning prices


def node_map(ranks: int, ranks_per_node: int) -> tuple:
    """Ranks packed onto nodes in order, as mpirun places them by default."""
    return tuple(r // ranks_per_node for r in range(ranks))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringcomm.explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--collective", default="all_reduce", choices=algorithms.COLLECTIVES)
    parser.add_argument("--size", default="1M", help="message bytes: 4096, 64K, 1M, 32MiB (default 1M)")
    parser.add_argument("--ranks", type=int, default=2, help="world size (default 2)")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="ranks on each node (default: all on one node)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--intra", default="mpi", choices=ROUTES, help="transport inside a node (default mpi)")
    parser.add_argument("--inter", default="mpi", choices=ROUTES, help="transport between nodes (default mpi)")
    parser.add_argument("--no-direct", action="store_true",
                        help="ranks cannot read each other's memory in place (CMA off): no direct algorithms")
    parser.add_argument("--no-compiled", action="store_true",
                        help="price the window's all-reduce round as Python (as a job with RINGCOMM_COMPILED=0, "
                             "or an install without a C compiler, runs it)")
    parser.add_argument("--window", default=None,
                        help="shared-window bytes per rank (default: ringcomm's window when --intra is "
                             "shm or threads and all ranks share a node, else 0: none)")
    parser.add_argument("--fast-reads", action="store_true",
                        help="price direct reads as on a host whose start-up probe finds them fast (what "
                             "ringcomm.init measures and every rank agrees on; docs/selection.md)")
    parser.add_argument("--cores", type=int, default=None,
                        help="cores each node's ranks share (default: enough for all; fewer prices oversubscription)")
    args = parser.parse_args(argv)
    try:
        try:
            nbytes = parse_size(args.size)
        except UsageError as err:
            raise UsageError(f"--size: {err}") from None
        if args.ranks < 1:
            raise UsageError(f"--ranks must be >= 1, got {args.ranks}")
        per_node = args.ranks_per_node or args.ranks
        if per_node < 1:
            raise UsageError(f"--ranks-per-node must be >= 1, got {per_node}")
        if args.window is not None:
            try:
                window = parse_size(args.window)
            except UsageError as err:
                raise UsageError(f"--window: {err}") from None
        else:
            window = JOB_CAPACITY if args.intra in ("shm", "threads") and per_node >= args.ranks else 0
        if args.cores is not None and args.cores < 1:
            raise UsageError(f"--cores must be >= 1, got {args.cores}")
        selector = Selector.from_env()
        if args.intra != "threads":   # no --cores: a core per rank; the cache is this machine's
            selector.set_host(per_node, args.cores or per_node, fast_reads=args.fast_reads)
        choice = selector.explain(args.collective, nbytes, args.ranks, dtype=args.dtype,
                                  nodes=node_map(args.ranks, per_node), routes=(args.intra, args.inter),
                                  window_bytes=window, direct=window > 0 and not args.no_direct,
                                  compiled=window > 0 and compiled.enabled() and not args.no_compiled)
    except UsageError as err:
        print(f"ringcomm.explain: {err}", file=sys.stderr)
        return 2
    print(describe(choice))
    print(f"tuning: {selector.tuning.source}")
    if window > 0 and not args.no_direct:   # direct algorithms' reads pin pages: their size matters
        print(hugepages.report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
