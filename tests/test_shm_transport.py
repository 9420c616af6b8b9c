"""The shared-memory transport under real mpirun jobs: collectives, routing, p2p, failures.

Afterwards /dev/shm must hold no file of the job, even when a rank was SIGKILLed (segments are
unlinked as soon as every peer has mapped them).

Private arrays of large collectives are read with CMA (process_vm_readv) where the machine
allows it, as this one does; the jobs run both that and the staging pool (RINGCOMM_SHM_CMA=0).
"""
import ctypes
import errno
import functools
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mpi_util import run_mpi
from ringcomm.errors import CommError
from ringcomm.transport import shm
from ringcomm.transport.shm import cma, pipe, segments

pytestmark = pytest.mark.mpi


def leftovers(prefix: str = shm.PREFIX) -> list:
    return sorted(f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix))


def ok_lines(out: str, n: int) -> list:
    """The "rank R ok ..." reports (ranks' lines may share a line of output), one per rank."""
    lines = re.findall(r"rank \d+ ok(?: \d+ \[[^\]]*\])?", out)
    assert sorted(int(line.split()[1]) for line in lines) == list(range(n)), out
    return lines


def direct_reads(out: str, n: int) -> set:
    """The "rank R direct_reads='...'" reports, one per rank: the set of values."""
    found = {int(r): v for r, _, v in re.findall(r"""rank (\d+) direct_reads=(['"])(.*?)\2""", out)}
    assert sorted(found) == list(range(n)), out
    return set(found.values())


# "cma": every collective read by CMA, however small (the default floor would send the small
# ones these jobs run through the staging pool); "staged": CMA off.
CMA_ON_OFF = {"cma": {"RINGCOMM_SHM_CMA_MIN": "0"}, "staged": {"RINGCOMM_SHM_CMA": "0"}}
EXPECT_READS = {"cma": "cma", "staged": "off: RINGCOMM_SHM_CMA=0"}


@functools.lru_cache(maxsize=None)
def cma_denied():
    """Why this machine refuses process_vm_readv or process_vm_writev between two of our
    processes, or None. (Containers may deny them by seccomp or ptrace rules: there the
    transport must fall back.)"""
    holder = "import numpy as np, sys; a = np.arange(4); print(a.ctypes.data, flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr, got = int(child.stdout.readline()), np.zeros(4, np.int64)
        shm.read_process(child.pid, addr, got.ctypes.data, got.nbytes)
        shm.write_process(child.pid, addr, got.ctypes.data, got.nbytes)
        return None
    except OSError as err:
        return f"process_vm_readv/writev denied here: {err}"
    finally:
        child.communicate("")


def expected_reads(reads: str) -> str:
    """What the jobs must report: "cma" where the machine allows it, else the staged fallback."""
    return "off:" if reads == "cma" and cma_denied() else EXPECT_READS[reads]


def reported(out: str, n: int, reads: str) -> set:
    """The jobs' direct_reads, with any reason for "off" dropped where only "off" is expected."""
    values = direct_reads(out, n)
    return {v.split(":")[0] + ":" for v in values} if expected_reads(reads) == "off:" else values


@pytest.mark.parametrize("reads", ["cma", "staged"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_collective_over_shm(n, reads):
    before = leftovers()
    out = run_mpi(n, "shm_collectives.py", "shm", env={"RINGCOMM_TRANSPORT": "auto", **CMA_ON_OFF[reads]},
                  timeout=240).stdout
    for line in ok_lines(out, n):
        assert line.endswith(str(["shm"] * (n - 1))), line   # every peer over shared memory
    assert reported(out, n, reads) == {expected_reads(reads)}
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


@pytest.mark.parametrize("reads", ["cma", "staged"])
@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point(n, reads):
    out = run_mpi(n, "shm_p2p.py", env={"RINGCOMM_TRANSPORT": "shm", **CMA_ON_OFF[reads]}).stdout
    ok_lines(out, n)
    assert reported(out, n, reads) == {expected_reads(reads)}


@pytest.mark.parametrize("denied", ["read", "write"])
def test_cma_denied_on_one_rank_falls_back_on_all(denied):
    out = run_mpi(3, "shm_cma_denied.py", 1, denied).stdout
    ok_lines(out, 3)
    reads = direct_reads(out, 3)
    assert "off: direct reads failed on ranks [1]" in reads, reads
    assert any(f"rank 1: cannot {denied} 8 bytes" in r and "EPERM" in r for r in reads), reads


def test_read_process_reads_another_process_and_says_when_it_is_gone():
    if cma_denied():
        pytest.skip(cma_denied())
    holder = "import numpy as np, sys; a = np.arange(1000); print(a.ctypes.data, flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr = int(child.stdout.readline())
        got = np.zeros(1000, np.int64)
        shm.read_process(child.pid, addr, got.ctypes.data, got.nbytes)
        assert np.array_equal(got, np.arange(1000))
    finally:
        child.communicate("")
    with pytest.raises(OSError) as gone:
        shm.read_process(child.pid, addr, got.ctypes.data, got.nbytes)
    assert gone.value.errno == errno.ESRCH


def test_write_process_writes_into_another_process_and_says_when_it_is_gone():
    if cma_denied():
        pytest.skip(cma_denied())
    holder = ("import numpy as np, sys; a = np.zeros(1000, np.int64); print(a.ctypes.data, flush=True); "
              "sys.stdin.readline(); print(a.tolist() == list(range(1000)), flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    src = np.arange(1000, dtype=np.int64)
    try:
        addr = int(child.stdout.readline())
        shm.write_process(child.pid, addr, src.ctypes.data, src.nbytes)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "True"
    finally:
        child.communicate("")
    with pytest.raises(OSError) as gone:
        shm.write_process(child.pid, addr, src.ctypes.data, src.nbytes)
    assert gone.value.errno == errno.ESRCH


def test_read_process_continues_after_a_short_read(monkeypatch):
    """The ctypes road (no compiled extension); the compiled one loops the same way (_round.c)."""
    monkeypatch.setattr(cma, "compiled_transfer", None)
    calls = []

    def three_bytes_at_a_time(pid, local, nl, remote, nr, flags):
        n = min(3, local._obj.len)
        ctypes.memmove(local._obj.base, remote._obj.base, n)
        calls.append(n)
        return n
    monkeypatch.setattr(cma, "_process_vm_readv", three_bytes_at_a_time)
    src, dst = np.arange(20, dtype=np.uint8), np.zeros(20, np.uint8)
    shm.read_process(os.getpid(), src.ctypes.data, dst.ctypes.data, 20)
    assert np.array_equal(src, dst) and len(calls) == 7


def test_a_failed_read_or_write_names_the_peer_errno_address_and_size(monkeypatch):
    monkeypatch.setattr(cma, "compiled_transfer", None)   # the ctypes road, its errno faked

    def fault(*args):
        ctypes.set_errno(errno.EFAULT)
        return -1
    monkeypatch.setattr(cma, "_process_vm_readv", fault)
    memory = cma.PeerMemory(0, [0, 5], [os.getpid(), 4321])
    with pytest.raises(CommError, match=r"rank 0: cannot read 8 bytes at 0x1000 of rank 5 \(pid 4321\): EFAULT"):
        memory.pull(1, 0x1000, np.zeros(1, np.int64))
    monkeypatch.setattr(cma, "_process_vm_writev", fault)
    with pytest.raises(CommError, match=r"rank 0: cannot write 8 bytes at 0x1000 of rank 5 \(pid 4321\): EFAULT"):
        memory.push(1, 0x1000, np.zeros(1, np.int64))


@pytest.mark.skipif(cma.compiled_transfer is None, reason="the compiled extension is not built")
def test_the_compiled_and_the_ctypes_road_move_the_same_bytes_and_name_the_same_errno(monkeypatch):
    """cma.py reads and writes through core/_round.c's transfer where it is built, through ctypes
    otherwise: the same bytes (a large range, an unaligned one), the same OSError for a peer's
    address that is not mapped, worded by PeerMemory the same way."""
    if cma_denied():
        pytest.skip(cma_denied())
    src = np.random.default_rng(0).integers(0, 256, (3 << 20) + 5, dtype=np.uint8)
    results = []
    for road in (cma.compiled_transfer, None):
        monkeypatch.setattr(cma, "compiled_transfer", road)
        dst = np.zeros_like(src)
        shm.read_process(os.getpid(), src.ctypes.data + 3, dst.ctypes.data, src.nbytes - 3)
        back = np.zeros_like(src)
        shm.write_process(os.getpid(), back.ctypes.data + 1, dst.ctypes.data, src.nbytes - 3)
        memory = cma.PeerMemory(0, [0, 5], [os.getpid(), os.getpid()], bounce=False)
        with pytest.raises(CommError) as refused:
            memory.pull(1, 0x1000, np.zeros(1, np.int64))
        results.append((dst[:-3].copy(), back[1:-2].copy(), str(refused.value)))
        assert np.array_equal(dst[:-3], src[3:]) and np.array_equal(back[1:-2], src[3:])
    (d1, b1, e1), (d2, b2, e2) = results
    assert np.array_equal(d1, d2) and np.array_equal(b1, b2)
    assert e1 == e2 and "cannot read 8 bytes at 0x1000 of rank 5" in e1 and "EFAULT" in e1, (e1, e2)


def test_timeout_is_an_error_not_a_hang():
    ok_lines(run_mpi(2, "shm_timeout.py").stdout, 2)


@pytest.mark.skipif(not pipe.enabled(), reason="no pipes here: _pipe.c not built, or RINGCOMM_COMPILED=0")
def test_a_pipe_whose_sender_stops_raises_on_both_ranks_within_the_timeout():
    ok_lines(run_mpi(2, "shm_pipe_stalled.py", env={"RINGCOMM_SHM_CMA": "0"}).stdout, 2)


def test_sigkill_leaves_nothing_in_dev_shm():
    proc = run_mpi(2, "shm_sigkill.py", check=False, timeout=120)
    assert proc.returncode != 0
    owners = re.findall(r"owner (ringcomm-\d+-)", proc.stdout)
    assert len(owners) == 2, proc.stdout + proc.stderr
    assert [f for owner in owners for f in leftovers(owner)] == []


def test_segments_are_owner_only_and_reserve_their_space():
    path = segments.segment_path(os.getpid(), segments.pid_namespace(), 0xabc, 7)
    try:
        data = segments.create(path, 4096)
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(path).st_blocks * 512 >= 4096   # allocated now (fallocate), not on first write
        data[:3] = [1, 2, 3]
        assert list(segments.open_peer(path, 4096)[:3]) == [1, 2, 3]
        with pytest.raises(FileExistsError):   # names are never reused
            segments.create(path, 4096)
        with pytest.raises(OSError, match="holds 4096 bytes, its owner announced 8192"):
            segments.open_peer(path, 8192)   # never "mmap length is greater than file size"
    finally:
        os.unlink(path)


def test_a_segment_dev_shm_cannot_hold_is_enospc_and_leaves_no_file(monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    path = segments.segment_path(os.getpid(), segments.pid_namespace(), 0xabd, 1)
    with pytest.raises(OSError) as err:
        segments.create(path, 1 << 20)
    assert err.value.errno == errno.ENOSPC and not os.path.exists(path)


def test_sweep_removes_files_of_dead_owners_only():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    ns = segments.pid_namespace()
    paths = {"dead": segments.segment_path(int(dead), ns, 1, 0),
             "alive": segments.segment_path(os.getpid(), ns, 1, 0),
             "other namespace": segments.segment_path(int(dead), ns + 1, 1, 0),
             "not ours": f"{segments.SHM_DIR}/{segments.PREFIX}notaname"}
    try:
        for p in paths.values():
            open(p, "w").close()
        removed = segments.sweep()
        assert paths["dead"] in removed and not os.path.exists(paths["dead"])
        for kept in ("alive", "other namespace", "not ours"):
            assert os.path.exists(paths[kept]), kept
    finally:
        for p in paths.values():
            segments.unlink_quietly(p)


@pytest.mark.mpi
def test_selector_prices_shared_memory_inside_and_mpi_between_nodes():
    """The selector reads the routed transport's peers: shared memory inside, MPI between nodes."""
    out = run_mpi(4, "shm_routes.py", env={"RINGCOMM_TIMEOUT": "60"}).stdout
    assert re.findall(r"routes (\([^)]*\))", out) == ["('shm', 'mpi')"] * 4, out


@pytest.mark.parametrize("scenario,how", [("late", "arg"), ("late", "env"), ("allocate", "env")])
def test_the_communicator_timeout_bounds_the_shm_handshakes(scenario, how, tmp_path):
    """init(timeout=2) or RINGCOMM_TIMEOUT=2 bounds setup and allocate handshakes (issue 11,
    defect 4). Before, a rank waiting for a late node rank 0 sat in an unbounded broadcast."""
    run_mpi(3, "shm_setup_timeout.py", tmp_path, scenario, how,
            env={"RINGCOMM_TIMEOUT": "2" if how == "env" else "60"}, timeout=120)
    seen = {}
    for path in tmp_path.glob("rank*.txt"):
        rank, took, outcome = re.match(r"rank (\d+) after ([\d.]+) s: (.*)", path.read_text()).groups()
        seen[int(rank)] = (float(took), outcome)
    assert sorted(seen) == [0, 1, 2], seen
    for rank, (took, outcome) in seen.items():
        if scenario == "allocate" and rank == 1:
            assert outcome == "ok", outcome   # it never called allocate
            continue
        assert outcome.startswith("CommTimeoutError: shm transport on rank") and "timed out after 2 s" in outcome, outcome
        assert 2.0 <= took < 4.0, (rank, took, outcome)
        if scenario == "allocate":
            assert "handshake #4 (allocate)" in outcome and "ranks [1] have not reached it" in outcome, outcome


def test_segments_shared_by_name_where_descriptors_cannot_be_opened():
    proc = run_mpi(3, "shm_fd_denied.py", 1, env={"RINGCOMM_DEBUG": "info"})
    assert sorted(re.findall(r"rank (\d) by_fd=False ok", proc.stdout)) == ["0", "1", "2"], proc.stdout
    said = re.findall(r"rank \d: the ranks of this node cannot open each other's segments through "
                      r"/proc/<pid>/fd; they share them by name", proc.stderr)
    assert len(said) == 3, proc.stderr


@pytest.mark.parametrize("road", ["cma", "pipe"])
def test_a_send_read_out_of_the_callers_array_times_out_saying_it_waits_for_its_recv(road):
    """Ranks that both send before they receive: fine while sends are copied into the pool, a
    timeout on both ranks once they are read in place, and the timeout says why (a host with
    fast CMA reads does that from 256 KiB without any variable: cma.py)."""
    if road == "pipe" and not pipe.enabled():
        pytest.skip("pipes need the compiled piece (ringcomm/transport/shm/_pipe.c)")
    env = {"RINGCOMM_SHM_CMA_P2P_MIN": "64K", "RINGCOMM_TIMEOUT": "2", **({"RINGCOMM_SHM_CMA": "0"} if road == "pipe" else {})}
    out = run_mpi(2, "send_before_recv.py", env=env, timeout=60).stdout
    # Found in the whole output, not line by line: two ranks' prints may share a line.
    assert sorted(re.findall(r"rank (\d): timed out in [\d.]+ s, saying why", out)) == ["0", "1"], out


def test_reads_take_the_detour_past_slow_distances_only_where_the_host_needs_it():
    """cma.distance_cost decides per process; without CMA nothing is read in place anyway."""
    from ringcomm.transport.shm import cma
    # The value alone, not a word: two ranks' prints may share a line ("bounce=Truerank 0 ...").
    proc = run_mpi(2, "show_cma_floor.py", timeout=60)
    expected = str(cma.slow_distances()) if cma.blocked() is None else "True"
    assert re.findall(r"\bbounce=(True|False)", proc.stdout) == [expected] * 2, proc.stdout
    proc = run_mpi(2, "show_cma_floor.py", env={"RINGCOMM_SHM_CMA": "0"}, timeout=60)
    assert re.findall(r"\bbounce=(True|False)", proc.stdout) == ["True"] * 2, proc.stdout
