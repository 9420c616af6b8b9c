"""core/hugepages.py: ``import ringcomm`` asks torch for huge pages for large tensors, unless the
user chose, and says what the process got."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ringcomm.core import hugepages

SEEN = "import os, ringcomm; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"


def _run(code: str, **env) -> str:
    environment = {k: v for k, v in os.environ.items() if k != hugepages.VARIABLE}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_import_sets_the_variable_where_the_kernel_has_huge_pages():
    expected = "1" if sys.platform.startswith("linux") and hugepages.kernel_mode() not in (None, "never") else "None"
    assert _run(SEEN) == expected


@pytest.mark.parametrize("chosen", ["0", "1"])
def test_a_users_choice_stands(chosen):
    assert _run(SEEN, THP_MEM_ALLOC_ENABLE=chosen) == chosen


def test_torch_reads_it_after_the_import():
    """What the variable is for: torch's allocator, reading it at its first allocation after
    ``import ringcomm`` even when torch was imported first, backs a large tensor with huge pages,
    as numpy does its arrays. The kernel may refuse them (memory pressure, a container that
    disables them): a numpy array of the same size is the control."""
    pytest.importorskip("torch")
    if hugepages.kernel_mode() not in ("always", "madvise") or not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("no transparent huge pages on this kernel")
    code = ("import numpy, torch, ringcomm\n"
            "def huge():\n"
            "    return int([l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0])\n"
            "a = numpy.ones(32 << 18, numpy.float32); numpy_kb = huge()\n"
            "t = torch.ones(32 << 18); print(numpy_kb, huge() - numpy_kb)")
    numpy_kb, torch_kb = map(int, _run(code).split())
    if numpy_kb < 16 << 10:
        pytest.skip(f"the kernel gave a 32 MiB numpy array {numpy_kb} kB of huge pages: none to compare with")
    # kB: at least one huge page (a fragmented machine may give torch fewer than numpy got)
    assert torch_kb >= 2 << 10, (numpy_kb, torch_kb)
    if hugepages.kernel_mode() == "madvise":   # and only because ringcomm asked
        _, torch_kb = map(int, _run(code, THP_MEM_ALLOC_ENABLE="0").split())
        assert torch_kb == 0, torch_kb


def test_report_names_the_policy_and_the_variable(monkeypatch):
    monkeypatch.setattr(hugepages, "kernel_mode", lambda: "madvise")
    monkeypatch.setenv(hugepages.VARIABLE, "1")
    assert "kernel madvise" in hugepages.report() and "THP_MEM_ALLOC_ENABLE=1" in hugepages.report()
    monkeypatch.setenv(hugepages.VARIABLE, "0")
    assert "do not ask" in hugepages.report() and "THP_MEM_ALLOC_ENABLE=0" in hugepages.report()
    monkeypatch.setattr(hugepages, "kernel_mode", lambda: None)
    assert "none on this kernel" in hugepages.report()
