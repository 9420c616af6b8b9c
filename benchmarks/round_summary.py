"""The ratios docs/performance.md reports, per launch, from the JSON rows benchmarks/round.sh
wrote: one line per figure, one column per launch, as a Markdown table.

    python benchmarks/round_summary.py OUT

Ratios are ringcomm's time over MPI's own call (mpi4py) measured in the same launch, so below 1
is faster; DDP's is ringcomm's samples/s over torch's DDP on gloo, so above 1 is faster. numpy
/ torch / empty: ringcomm on numpy arrays, on tensors torch allocated, on ringcomm.empty's blocks.
The torch column's MPI runs on the torch rows' memory (``mpi4py[torch]``) where the launch
measured it (from round forty-six), else on numpy's.
"""
import json
import sys
from pathlib import Path

KIB, MIB = 1 << 10, 1 << 20
SUBJECTS = (("numpy", "ringcomm"), ("torch", "ringcomm[torch]"), ("empty", "ringcomm+empty"))


def size_name(size: int) -> str:
    return f"{size // MIB}M" if size >= MIB else f"{size // KIB}K"


class Launch:
    def __init__(self, folder: Path):
        self.folder = folder
        files = {name: self._load(name) for name in ("allreduce", "coll_small", "coll_64m", "a2a_sr", "reference")}
        # per command: (collective, size, backend, algorithm) -> time in us
        self.commands = {name: {(r["collective"], r["size"], r["backend"], r["algorithm"]): r["time_us"]
                                for r in got.get("rows", [])} for name, got in files.items()}
        self.rows = {**self.commands["coll_64m"], **self.commands["coll_small"], **self.commands["allreduce"]}
        self.n4 = self._load("n4").get("rows", [])
        self.meta = files["allreduce"].get("meta", {})

    def _load(self, name: str) -> dict:
        """One command's JSON, or {} where that command did not run."""
        path = self.folder / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def time(self, collective, size, backend, algorithm="auto", command=None):
        rows = self.rows if command is None else self.commands[command]
        return rows.get((collective, size, backend, algorithm))

    def vs_mpi(self, collective, size, backend, algorithm="auto", command=None):
        mine = self.time(collective, size, backend, algorithm, command)
        mpi = self.mpi(collective, size, "mpi4py[torch]" if backend.endswith("[torch]") else "mpi4py", command)
        return None if mine is None or mpi is None else mine / mpi

    def mpi(self, collective, size, reference="mpi4py", command=None):
        """MPI's time on the given memory (``mpi4py[torch]``: torch's), else on numpy's."""
        found = self.time(collective, size, reference, "native", command)
        return found if found is not None else self.time(collective, size, "mpi4py", "native", command)

    def ddp(self, name: str) -> dict:
        return {r["impl"]: r for r in self._load(name).get("results", []) if r["ranks"] == 2}


def ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def joined(values) -> str:
    return " / ".join(ratio(v) for v in values)


def figures(launch: Launch) -> dict:
    out = {}
    head = launch.meta
    out["UTC, load"] = f"{head.get('utc', '?')[11:16]}, {head.get('loadavg', ['?'])[0]:.1f}" if head else "-"
    for algorithm in ("auto", "persistent"):
        out[f"1 KiB all_reduce / MPI ({algorithm}), numpy / torch"] = joined(
            launch.vs_mpi("all_reduce", KIB, b, algorithm) for _, b in SUBJECTS[:2])
    sizes = sorted({s for (c, s, b, a) in launch.rows if c == "all_reduce" and b == "mpi4py"})
    for label, backend in SUBJECTS[:2]:
        ratios = [(launch.vs_mpi("all_reduce", s, backend), s) for s in sizes]
        worst = max(((x, s) for x, s in ratios if x is not None), default=None)
        out[f"worst auto all_reduce / MPI, {label}"] = "-" if worst is None else f"{ratio(worst[0])} at {size_name(worst[1])}"
    floor = launch.time("all_reduce", 64 * MIB, "floor", "x+=y")
    at_64m = [launch.time("all_reduce", 64 * MIB, b) for _, b in SUBJECTS]
    out["64 MiB all_reduce / x+=y floor, numpy / torch / empty"] = joined(
        None if floor is None or t is None else t / floor for t in at_64m)
    mpi64 = launch.time("all_reduce", 64 * MIB, "mpi4py", "native")
    out["64 MiB floor, MPI_Allreduce (ms)"] = "-" if floor is None or mpi64 is None else f"{floor / 1e3:.1f}, {mpi64 / 1e3:.1f}"
    out["1 MiB all_reduce us: numpy, torch, empty, MPI"] = ", ".join(
        "-" if t is None else f"{t:.0f}" for t in [launch.time("all_reduce", MIB, b) for _, b in SUBJECTS]
        + [launch.time("all_reduce", MIB, "mpi4py", "native")])
    collectives = sorted({c for (c, s, b, a) in launch.rows if c != "all_reduce" and b == "mpi4py"})
    for size in (MIB, 64 * MIB):
        for collective in collectives:
            out[f"{size_name(size)} {collective} / MPI, numpy / torch / empty"] = joined(
                launch.vs_mpi(collective, size, b) for _, b in SUBJECTS)
    a2a = launch.commands["a2a_sr"]
    for size in sorted({s for (c, s, b, a) in a2a}):
        for collective in ("all_to_all", "sendrecv"):
            out[f"{size_name(size)} {collective} / MPI (its own command), numpy / torch / empty"] = joined(
                launch.vs_mpi(collective, size, b, command="a2a_sr") for _, b in SUBJECTS)
        pairs = [(launch.time(c, size, "mpi4py[torch]", "native", "a2a_sr"),
                  launch.time(c, size, "mpi4py", "native", "a2a_sr")) for c in ("all_to_all", "sendrecv")]
        if any(torch is not None for torch, _ in pairs):   # what the memory alone does to MPI's own call
            out[f"{size_name(size)} MPI on torch's memory / on numpy's, all_to_all / sendrecv"] = joined(
                None if torch is None or numpy is None else torch / numpy for torch, numpy in pairs)
    if launch.n4:
        rows = [r for r in launch.n4 if r["backend"] == "ringcomm" and r["collective"] == "all_reduce"]
        worst = None
        for size in sorted({r["size"] for r in rows}):
            auto = [r for r in rows if r["size"] == size and r["algorithm"] == "auto"]
            forced = [r for r in rows if r["size"] == size and r["algorithm"] not in ("auto", "persistent")]
            if auto and forced:
                best = min(forced, key=lambda r: r["time_us"])
                worst = max(worst or (0,), (auto[0]["time_us"] / best["time_us"], size,
                                            auto[0].get("chosen", "?"), best["algorithm"]))
        # Where auto ran the best forced algorithm itself, the ratio is the noise between two runs
        # of one algorithm (4 ranks on 2 cores), not a wrong choice: the row says which it is.
        out["4 ranks: worst auto / best forced (auto ran; best forced)"] = "-" if worst is None else \
            f"{ratio(worst[0])} at {size_name(worst[1])} ({worst[2]}; {worst[3]})"
    for name, label in (("ddp_mlp", "DDP MLP"), ("ddp_views", "DDP MLP, bucket views"), ("ddp_tf", "DDP transformer")):
        got = launch.ddp(name)
        if "ringcomm" in got and "torch" in got:
            steps = ", ".join(f"{got[i]['step_s'] * 1e3:.1f}" for i in ("ringcomm", "torch", "torch-ringcomm") if i in got)
            out[f"{label}: ringcomm / torch-on-gloo samples/s (step ms: ringcomm, torch, torch on 'ringcomm')"] = \
                f"{got['ringcomm']['samples_per_s'] / got['torch']['samples_per_s']:.2f}x ({steps})"
    for size in (KIB, MIB):
        parts = [launch.time("all_reduce", size, b, "native", "reference") for b in ("mpi", "gloo", "mpi4py")]
        out[f"{size_name(size)} all_reduce us on backends mpi, gloo; mpi4py"] = ", ".join(
            "-" if t is None else f"{t:.1f}" for t in parts)
    return out


def main(argv) -> int:
    out = Path(argv[1])
    launches = sorted(p for p in out.glob("L*") if p.is_dir())
    if not launches:
        print(f"no launch folders (L1, L2, ...) under {out}", file=sys.stderr)
        return 1
    columns = [figures(Launch(p)) for p in launches]
    names = list(dict.fromkeys(k for c in columns for k in c))
    print("| figure | " + " | ".join(p.name for p in launches) + " |")
    print("|---|" + "---|" * len(launches))
    for name in names:
        print(f"| {name} | " + " | ".join(c.get(name, "-") for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
