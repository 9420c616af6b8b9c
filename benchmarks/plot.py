"""busbw against size, one line per backend/algorithm, from allreduce_perf rows.

    python benchmarks/plot.py results.json -o busbw.png

matplotlib is optional (the ``plot`` extra); it is imported only when a plot is drawn.
"""
from __future__ import annotations

import argparse
import json
import math


def plot_rows(rows: list[dict], path: str, title: str = "") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib (pip install 'ringcomm[plot]'): {exc}") from None
    collectives = sorted({r["collective"] for r in rows})
    fig, axes = plt.subplots(1, len(collectives), figsize=(7 * len(collectives), 4.5), squeeze=False)
    colors = plt.get_cmap("tab20").colors
    for ax, collective in zip(axes[0], collectives):
        lines: dict[str, list] = {}
        for r in rows:
            if r["collective"] != collective:
                continue
            if r["backend"] == "floor":   # the floor has no busbw: draw what busbw it would equal
                label, y = f"floor ({r['algorithm']}), size/time", r["size"] / (r["time_us"] * 1e-6) / 1e9
            else:
                label, y = f"{r['backend']}/{r['algorithm']}", r["busbw_gbs"]
            if y is not None and not math.isnan(y):
                lines.setdefault(label, []).append((r["size"], y))
        for label, points in sorted(lines.items()):
            points.sort()
            style = {"color": colors[sorted(lines).index(label) % len(colors)]}
            if label.startswith("floor"):
                style = dict(linestyle="--" if "x+=y" in label else ":", color="black", alpha=0.6)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")   # small sizes sit orders of magnitude below the floor
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{collective}" + (f", {title}" if title else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="a file written by allreduce_perf.py --json")
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    meta = data.get("meta", {})
    plot_rows(data["rows"], args.output, title=f"{meta.get('ranks', '?')} ranks")


if __name__ == "__main__":
    main()
