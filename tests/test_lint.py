"""Pyflakes-level checks over the whole tree: undefined names and unused imports; and the
files the docs name, which must exist.

The GPU paths never run on a CPU-only CI machine; this is what catches a NameError in them."""
import re
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


def test_every_file_the_docs_name_exists():
    # A file moved in a regrouping leaves its old path in prose that nothing else checks.
    named = re.compile(r"(?<![\w/.~])((?:ringcomm|ddp|tests|benchmarks|examples|docs)/[\w/.-]+\.(?:py|md|c|h|sh))")
    missing = []
    for doc in sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]:
        for path in set(named.findall(doc.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)} names {path}")
    assert not missing, "\n".join(missing)
