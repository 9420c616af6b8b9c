"""Pyflakes-level checks over the whole tree: undefined names and unused imports.

The GPU paths never run on a CPU-only CI machine; this is what catches a NameError in them."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_undefined_names_or_unused_imports():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists() and not shutil.which("ruff"):
        pytest.skip("ruff is not installed (it comes with the test extra)")
    proc = subprocess.run([ruff, "check", "--select", "F", "--output-format", "concise",
                           "ringcomm", "ddp", "benchmarks", "examples", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
