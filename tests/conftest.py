import sys
from pathlib import Path

# Test helpers (mpi_util) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import os
import re
import time
from glob import glob

import pytest

MPICH_SHM = "/dev/shm/mpich_shm_*"


def _mapped_mpich_files() -> set:
    """MPICH shared-memory files some live process maps (another job's, still running)."""
    mapped = set()
    for maps in glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(re.findall(r"(/dev/shm/mpich_shm_\S+)", f.read()))
        except OSError:   # the process ended, or is not ours to read
            pass
    return mapped


@pytest.fixture(scope="session", autouse=True)
def mpich_leftovers_removed():
    """Tests that kill a rank leave MPICH's own shared-memory files behind (its launcher does not
    unlink them): some twenty files, about 2.8 MB each, a run of the suite, which on a machine
    that runs it daily filled /dev/shm with 2.6 GB. At the end, remove the ones this session
    made that no process maps. ringcomm's own files are checked, never cleaned, by the tests."""
    before = set(glob(MPICH_SHM))
    yield
    deadline = time.monotonic() + 5   # a killed job's last ranks may still be on their way out
    while True:
        left = set(glob(MPICH_SHM)) - before
        mapped = _mapped_mpich_files() & left
        for path in left - mapped:
            try:
                os.unlink(path)
            except OSError:
                pass
        if not mapped or time.monotonic() > deadline:
            break
        time.sleep(0.2)
