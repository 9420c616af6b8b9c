"""Run torch's own distributed tests (spawn_suite.py) on gloo and on ringcomm, and compare.

    python tests/torch_suite/run.py [--sizes 2,3] [--backends gloo,ringcomm] [-k EXPR] [--out DIR]

For each world size and backend, pytest runs spawn_suite.py (ranks forked, from 3 ranks on with
torch's sub-group tests) and writes junit XML under --out. Then, per world size: how many tests
passed, failed and were skipped on each backend, and every test gloo passes that ringcomm does
not, with ringcomm's message. Exit status 1 when there is such a test. ``make torch-tests``.
"""
import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run(backend: str, size: int, out: Path, keyword) -> Path:
    xml = out / f"{backend}-{size}.xml"
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(size), SUITE_START="fork", TEMP_DIR=str(out),
               SUITE_SUBGROUPS="1" if size >= 3 else "0", RINGCOMM_TIMEOUT=os.environ.get("RINGCOMM_TIMEOUT", "60"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "spawn_suite.py"),
           f"--junitxml={xml}"] + (["-k", keyword] if keyword else [])
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"  {backend} at {size} ranks: {time.monotonic() - t0:.0f} s", flush=True)
    return xml


def outcomes(xml: Path) -> dict:
    """{test name: ("passed"|"failed"|"skipped", message)}."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        state, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                state = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip().splitlines()[0][:200] if (
                    node.get("message") or node.text) else ""
        found[case.get("name")] = (state, message)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,3")
    p.add_argument("--backends", default="gloo,ringcomm")
    p.add_argument("-k", dest="keyword", default=None)
    p.add_argument("--out", default="/tmp/ringcomm-torch-suite")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worse = 0
    for size in [int(s) for s in args.sizes.split(",")]:
        results = {b: outcomes(run(b, size, out, args.keyword)) for b in args.backends.split(",")}
        print(f"{size} ranks:")
        for backend, found in results.items():
            counts = {s: sum(1 for v in found.values() if v[0] == s) for s in ("passed", "failed", "skipped")}
            ran = counts["passed"] + counts["failed"]
            print(f"  {backend:9} passed {counts['passed']} of {ran} run ({counts['skipped']} skipped)")
        if "gloo" in results and "ringcomm" in results:
            for name, (state, _) in sorted(results["gloo"].items()):
                ours = results["ringcomm"].get(name, ("absent", ""))
                if state == "passed" and ours[0] != "passed":
                    worse += 1
                    print(f"  gloo passes, ringcomm {ours[0]}: {name}: {ours[1]}")
            better = [n for n, (s, _) in results["ringcomm"].items()
                      if s == "passed" and results["gloo"].get(n, ("",))[0] != "passed"]
            print(f"  ringcomm passes {len(better)} that gloo does not: {', '.join(sorted(better)) or '-'}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
