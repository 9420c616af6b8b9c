"""The shared-memory transport under real mpirun jobs: collectives, routing, p2p, failures.

Each job prints its segment-name prefix; afterwards /dev/shm must hold no file with it, even
when a rank was SIGKILLed (segments are unlinked as soon as every peer has mapped them).
"""
import os
import re

import pytest

from mpi_util import run_mpi
from ringcomm.transport import shm

pytestmark = pytest.mark.mpi


def leftovers(prefix: str = shm.PREFIX) -> list:
    return sorted(f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix))


def ok_lines(out: str, n: int) -> list:
    """The "rank R ok ..." reports (ranks' lines may share a line of output), one per rank."""
    lines = re.findall(r"rank \d+ ok(?: \d+ \[[^\]]*\])?", out)
    assert sorted(int(line.split()[1]) for line in lines) == list(range(n)), out
    return lines


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_collective_over_shm(n):
    before = leftovers()
    out = run_mpi(n, "shm_collectives.py", "shm", env={"RINGCOMM_TRANSPORT": "auto"}, timeout=240).stdout
    for line in ok_lines(out, n):
        assert line.endswith(str(["shm"] * (n - 1))), line   # every peer over shared memory
    assert leftovers() == before


def test_pretend_nodes_route_shm_inside_and_mpi_between():
    out = run_mpi(4, "shm_collectives.py", "nodes", 2, timeout=240).stdout
    for line in ok_lines(out, 4):
        assert line.endswith("['mpi', 'mpi', 'shm']"), line


def test_forced_mpi_transport():
    out = run_mpi(2, "shm_collectives.py", "mpi", env={"RINGCOMM_TRANSPORT": "mpi"}).stdout
    for line in ok_lines(out, 2):
        assert line.endswith("['mpi']"), line


def test_forced_shm_refuses_remote_peers(tmp_path):
    run_mpi(2, "shm_forced_remote.py", tmp_path, env={"RINGCOMM_TRANSPORT": "shm"})
    for rank in (0, 1):
        said = (tmp_path / f"rank{rank}.txt").read_text()
        assert f"RINGCOMM_TRANSPORT=shm but ranks [{1 - rank}] are not on the node of rank {rank}" in said, said


@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point(n):
    ok_lines(run_mpi(n, "shm_p2p.py", env={"RINGCOMM_TRANSPORT": "shm"}).stdout, n)


def test_timeout_is_an_error_not_a_hang():
    ok_lines(run_mpi(2, "shm_timeout.py").stdout, 2)


def test_sigkill_leaves_nothing_in_dev_shm():
    proc = run_mpi(2, "shm_sigkill.py", check=False, timeout=120)
    assert proc.returncode != 0
    jobs = re.findall(r"job (ringcomm-\d+-[0-9a-f]+)", proc.stdout)
    assert len(jobs) == 1, proc.stdout + proc.stderr
    assert leftovers(jobs[0]) == []


def test_segments_are_owner_only():
    path = f"{shm.SHM_DIR}/{shm.PREFIX}test-{os.getpid()}"
    try:
        data = shm._map(path, 4096, create=True)
        assert os.stat(path).st_mode & 0o777 == 0o600
        data[:3] = [1, 2, 3]
        assert list(shm._map(path, 4096, create=False)[:3]) == [1, 2, 3]
        with pytest.raises(FileExistsError):   # names are never reused
            shm._map(path, 4096, create=True)
    finally:
        os.unlink(path)


@pytest.mark.mpi
def test_selector_prices_shared_memory_inside_and_mpi_between_nodes():
    """The selector reads the routed transport's peers: shared memory inside, MPI between nodes."""
    out = run_mpi(4, "shm_routes.py", env={"RINGCOMM_TIMEOUT": "60"}).stdout
    assert re.findall(r"routes (\([^)]*\))", out) == ["('shm', 'mpi')"] * 4, out
