"""The one-shot GPU acceptance of ringcomm: one command, one line per check, a final verdict.

    python benchmarks/gpu_check.py [--ranks 2] [--mib 64] [--iters 10]
    python benchmarks/gpu_check.py --stand-in [--ranks 3]     # the same checks on tests/stand_ins' cupy

It launches ``mpirun -n RANKS`` (default 2: two ranks share one GPU, as CUDA IPC allows) for the
checks that need ranks, then ``mpirun -n 1`` for the NCCL and gloo checks (NCCL needs a GPU per
rank). What each check does: gpu_check_lib.RANK_CHECKS and SINGLE_CHECKS; how to run it on a
fresh GPU machine and what every line means: docs/gpu.md. It finishes in under 5 minutes.

Exit status: 0 when every check passed or was skipped, 1 when one failed, 2 when the machine
cannot do CUDA IPC between processes at all (an environment failure: the ENV line says what
failed, before ringcomm was involved). Without a GPU (or cupy, or a CUDA build of torch) every
check is printed as SKIP with the reason and the exit status is 0.

``--stand-in`` runs the checks on the CPU stand-in for cupy (tests/stand_ins/cupy), ranks on
pretend devices 0, 1, 2, ...: that is how CI exercises this script and every CUDA code path of
ringcomm. It proves code paths, not a GPU; checks that need torch CUDA tensors or a clock are
skipped there.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STAND_INS = ROOT / "tests" / "stand_ins"
LIMITS = {"ranks": 230, "single": 50}   # seconds per mpirun job: under 5 minutes in all
STATUSES = ("PASS", "FAIL", "SKIP", "ENV")


def gpu_missing() -> str | None:
    """Why this machine cannot run the check on a GPU, or None."""
    try:
        import cupy
    except ImportError as err:
        return f"cupy is not installed ({err}); pip install 'ringcomm[cuda12]' or 'ringcomm[cuda13]'"
    if getattr(cupy, "IS_STAND_IN", False):
        return "the cupy on the path is tests/stand_ins' CPU stand-in (use --stand-in for that)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:
        return f"no usable CUDA driver/device ({type(err).__name__}: {err})"
    return None if n >= 1 else "no CUDA device found"


def _names() -> dict:
    sys.path.insert(0, str(HERE))
    import gpu_check_lib
    return {**gpu_check_lib.RANK_CHECKS, **gpu_check_lib.SINGLE_CHECKS}


def _mpirun() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def _env(args) -> dict:
    env = dict(os.environ)
    path = [str(ROOT)]
    if args.stand_in:
        path.insert(0, str(STAND_INS))
        env["STAND_IN_CUPY_DEVICES"] = str(args.ranks)   # rank k on pretend device k
        env["STAND_IN_CUPY_PEER_ACCESS"] = "1"           # as NVLink or P2P over PCIe allow
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("RINGCOMM_TIMEOUT", "60")
    return env


def _job(mode: str, ranks: int, args, expected: list) -> tuple:
    """Run one mpirun job of the worker; (lines by check name, INFO lines)."""
    cmd = [_mpirun(), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()), "--worker", mode,
           "--mib", str(args.mib), "--iters", str(args.iters), "--only", ",".join(expected)]
    got, info = {}, []
    try:
        proc = subprocess.run(cmd, env=_env(args), capture_output=True, text=True, timeout=LIMITS[mode])
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, err, code = exc.stdout or "", exc.stderr or "", f"killed after {LIMITS[mode]} s"
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    for line in out.splitlines():
        status, _, rest = line.partition(" ")
        if status in STATUSES:
            name, _, detail = rest.partition(": ")
            got[name] = (status, detail)
        elif status == "INFO":
            info.append(rest)
    for name in expected:
        if name not in got:
            tail = " | ".join((err.strip().splitlines() or ["no output"])[-3:])
            got[name] = ("FAIL", f"the {ranks}-rank job ended (exit {code}) before this check: {tail}")
    return got, info


def launch(args) -> int:
    names = _names()
    start = time.monotonic()
    if args.stand_in:
        if not (STAND_INS / "cupy").is_dir():
            print(f"FAIL gpu_check: --stand-in needs {STAND_INS / 'cupy'} (a checkout with tests/)")
            return 1
    else:
        reason = gpu_missing()
        if reason:
            for name in (n for n in names if n in args.only):
                print(f"SKIP {name}: no GPU: {reason}")
            print(f"gpu_check: SKIP (no GPU: {reason})")
            return 0
    import gpu_check_lib
    results, info = {}, []
    for mode, ranks, expected in (("ranks", args.ranks, list(gpu_check_lib.RANK_CHECKS)),
                                  ("single", 1, list(gpu_check_lib.SINGLE_CHECKS))):
        expected = [name for name in expected if name in args.only]
        if not expected:
            continue
        got, lines = _job(mode, ranks, args, expected)
        info += lines
        for name in expected:
            results[name] = got[name]
            status, detail = got[name]
            print(f"{status} {name}: {detail}", flush=True)
    counts = {s: sum(1 for st, _ in results.values() if st == s) for s in STATUSES}
    where = f" on {info[0]}" if info else ""
    summary = (f"{counts['PASS']} passed, {counts['SKIP']} skipped, {counts['FAIL']} failed, {counts['ENV']} "
               f"environment failures, in {time.monotonic() - start:.0f} s{where}"
               f"{' (cupy stand-in: code paths only, no GPU)' if args.stand_in else ''}")
    if counts["FAIL"]:
        print(f"gpu_check: FAIL ({summary})")
        return 1
    if counts["ENV"]:
        print(f"gpu_check: ENVIRONMENT ({summary}): CUDA IPC between processes does not work on this machine")
        return 2
    print(f"gpu_check: PASS ({summary})")
    return 0


def worker(args) -> int:
    """One rank of a job launched by ``launch``."""
    from mpi4py import MPI

    def abort_job(kind, value, tb):   # an uncaught error on one rank must not leave the others waiting
        import traceback
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.excepthook = abort_job
    sys.path.insert(0, str(HERE))
    import gpu_check_lib
    import gpu_check_ranks
    ctx = gpu_check_lib.Ctx(args)
    devices = ctx.world.allgather(ctx.device)
    if ctx.rank == 0:
        print(f"INFO {ctx.size} rank(s) on device(s) {devices} of {ctx.devices}: {ctx.device_name()}", flush=True)
    checks = gpu_check_ranks.CHECKS if args.worker == "ranks" else gpu_check_lib.SINGLE
    wanted = gpu_check_lib.RANK_CHECKS if args.worker == "ranks" else gpu_check_lib.SINGLE_CHECKS
    assert list(checks) == list(wanted), "the check list and its descriptions disagree"
    failed = gpu_check_lib.run(ctx, {name: fn for name, fn in checks.items() if name in args.only})
    ctx.close()
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the multi-rank job (default 2)")
    parser.add_argument("--mib", type=float, default=64.0, help="all_reduce size of the timing check (float32)")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions (median reported)")
    parser.add_argument("--stand-in", action="store_true", help="run on tests/stand_ins' CPU stand-in for cupy")
    parser.add_argument("--only", help="comma-separated check names (default: all)")
    parser.add_argument("--worker", choices=("ranks", "single"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = _names()
    args.only = names if args.only is None else args.only.split(",")
    unknown = [name for name in args.only if name not in names]
    if unknown:
        parser.error(f"--only: unknown checks {unknown} (expected some of {', '.join(names)})")
    if args.worker:
        return worker(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
