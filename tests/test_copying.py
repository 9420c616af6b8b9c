"""Copies that avoid rep movsb's slow distances (core/copying.py, core/_copy.h, the CMA reads
and writes of transport/shm/cma.py): the same bytes as numpy's copy at every distance and size,
and the CMA side this rank owns placed at the other side's page offset."""
import os
import re

import numpy as np
import pytest

from ringcomm.core import copying
from ringcomm.transport.shm import cma

from mpi_util import run_mpi
from test_shm_transport import cma_denied

compiled = pytest.mark.skipif(copying.copy_bytes is None, reason="the compiled piece was not built (no C compiler)")


def pair(nbytes: int, distance: int):
    """A source at a page and a destination ``distance`` bytes past a page, apart in memory."""
    raw = np.random.default_rng(nbytes + distance).integers(0, 256, 2 * nbytes + 4 * 4096, dtype=np.uint8)
    base = (-raw.ctypes.data) % 4096
    src = raw[base:base + nbytes]
    start = base + (nbytes + 4095) // 4096 * 4096 + 4096 + distance
    return raw[start:start + nbytes], src


@pytest.mark.parametrize("distance", [1, 8, 16, 31, 63, 64, 4080])
def test_slow_distances_are_a_cache_line_past_the_source(distance):
    # 1-31 measured slow on the EPYC we run on; up to a line is taken, as margin
    assert copying.slow_distance(4096 + distance, 4096) == (distance < 64)
    assert not copying.slow_distance(4096, 4096)


@compiled
# from 1 MiB the copy goes in 256 KiB pieces (core/_copy.h): lengths on and off their edges
@pytest.mark.parametrize("nbytes", [0, 1, 2047, 2048, 2049, 4096, 5003, 70001, (1 << 20) - 1, 1 << 20,
                                    (1 << 20) + 70001, (5 << 18) + 1])
@pytest.mark.parametrize("distance", [0, 1, 16, 31, 48, 100, 4080])
def test_the_compiled_copy_gives_numpys_bytes_at_every_distance(nbytes, distance):
    dst, src = pair(nbytes, distance)
    want = src.copy()
    copying.copy_bytes(dst, src)
    assert np.array_equal(dst, want)
    assert copying.slow_distance(dst.ctypes.data, src.ctypes.data) == (0 < distance < 64) or nbytes == 0

@compiled
# every head (0-15 bytes to the first 16-byte store) and tail (0-63 bytes after the last 64)
@pytest.mark.parametrize("nbytes", [(1 << 20), (1 << 20) + 1, (1 << 20) + 63, (1 << 20) + 64, (3 << 20) + 4097])
@pytest.mark.parametrize("distance", [0, 1, 15, 16, 31, 100, 4095])
def test_copies_from_the_streaming_length_on_give_numpys_bytes(nbytes, distance):
    try:
        assert copying.stream_from(0) == 1 << 20   # clamped to its least
        dst, src = pair(nbytes, distance)
        want = src.copy()
        guard = dst.base[dst.ctypes.data - dst.base.ctypes.data + nbytes:][:64].copy()
        copying.copy(dst, src)
        assert np.array_equal(dst, want)
        assert np.array_equal(dst.base[dst.ctypes.data - dst.base.ctypes.data + nbytes:][:64], guard)
    finally:
        copying.stream_from(copying.STREAM_FROM)


@compiled
@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_whose_copies_are_streamed_are_exact_in_every_process_every_time(ranks):
    """Streamed stores are weakly ordered; the sfence after them is what keeps a peer from
    seeing the flag before the bytes. mpi_jobs/streamed_copies.py streams every copy of 1 MiB
    and more and checks four iterations of the direct all_gather (also of ringcomm.empty blocks),
    all_to_all, gather and scatter, each iteration's data different from the last."""
    proc = run_mpi(ranks, "streamed_copies.py", timeout=180)
    # the ranks' lines may interleave in mpirun's output: found, not split
    found = sorted(re.findall(r"rank (\d+) ok (\d+) streamed from (\d+)", proc.stdout))
    assert found == [(str(r), "20", str(1 << 20)) for r in range(ranks)], proc.stdout


def test_the_streaming_length_is_the_last_level_cache_or_a_guess():
    assert copying.STREAM_FROM == (copying.last_level_cache() or copying.STREAM_GUESS)
    if copying.copy_bytes is None:
        assert copying.stream_from(1 << 30) == 0 and copying.streamed_from() == 0
        return
    assert copying.streamed_from() == max(copying.STREAM_FROM, 1 << 20)   # as import set it
    try:
        assert copying.stream_from(5) == copying.streamed_from() == 1 << 20
    finally:
        copying.stream_from(copying.STREAM_FROM)



@compiled
@pytest.mark.parametrize("shift", [-4096, -16, -1, 1, 16, 4096])
@pytest.mark.parametrize("nbytes", [100000, (1 << 20) + 100000])
def test_overlapping_ranges_copy_as_memmove(shift, nbytes):
    raw = np.arange(nbytes // 4 + 10000, dtype=np.uint32).view(np.uint8)
    want = raw.copy()
    lo = 10000
    want[lo + shift:lo + shift + nbytes] = want[lo:lo + nbytes].copy()
    copying.copy_bytes(raw[lo + shift:lo + shift + nbytes], raw[lo:lo + nbytes])
    assert np.array_equal(raw, want)


@compiled
def test_the_compiled_copy_refuses_unequal_lengths_and_read_only_destinations():
    with pytest.raises(ValueError, match="dst has 8 bytes, src 9"):
        copying.copy_bytes(np.zeros(8, np.uint8), np.zeros(9, np.uint8))
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        copying.copy_bytes(ro, np.zeros(8, np.uint8))


@compiled
def test_copy_takes_arrays_of_any_layout_and_dtype():
    a = np.arange(30000, dtype=np.float64).reshape(100, 300)
    out = np.zeros((300, 100))
    copying.copy(out, a.T)   # not contiguous: numpy's copy
    assert np.array_equal(out, a.T)
    dst, src = pair(80000, 16)
    copying.copy(dst.view(np.float32), src.view(np.float32))
    assert np.array_equal(dst, src)


def test_the_compiled_copy_is_used_only_where_it_is_built_and_allowed(monkeypatch):
    monkeypatch.setenv("RINGCOMM_COMPILED", "0")
    assert copying.copier() is copying.numpy_copy
    monkeypatch.setenv("RINGCOMM_COMPILED", "1")
    assert copying.copier() is (copying.copy if copying.copy_bytes is not None else copying.numpy_copy)


def test_like_places_a_view_at_the_page_offset_of_an_address():
    scratch = np.empty(10000, np.uint8)
    for addr in (0x10000, 0x10010, 0x10ff8, 0x7f0000001234):
        view = copying.like(scratch, addr, 5000)
        assert view.nbytes == 5000 and (view.ctypes.data - addr) % 4096 == 0
    assert copying.like(scratch, scratch.ctypes.data + 4000, 6001) is None   # 4000 + 6001 > 10000


def own_memory(copy):
    """PeerMemory whose only peer is this very process (CMA on oneself), recording each transfer's
    (local address, remote address, bytes)."""
    memory = cma.PeerMemory(0, [0, 1], [os.getpid(), os.getpid()], copy)
    seen = []
    reach = memory._reach

    def recording(transfer, verb, p, addr, local):
        seen.append((local.ctypes.data, addr, local.nbytes))
        reach(transfer, verb, p, addr, local)
    memory._reach = recording
    return memory, seen


@pytest.mark.parametrize("distance", [0, 16, 100])
@pytest.mark.parametrize("nbytes", [1000, 3 * cma.CHUNK + 12345])
def test_cma_reads_and_writes_at_a_slow_distance_go_through_a_buffer_at_the_page_offset(distance, nbytes):
    if cma_denied():
        pytest.skip(cma_denied())
    memory, seen = own_memory(copying.copier())
    dst, src = pair(nbytes, distance)
    memory.pull(1, src.ctypes.data, dst)
    assert np.array_equal(dst, src)
    bounced = 0 < distance < 64 and nbytes > copying.PIECE
    assert all((local - remote) % 4096 == 0 for local, remote, _ in seen) == (bounced or distance == 0)
    assert len(seen) == (-(-nbytes // cma.CHUNK) if bounced else 1)

    seen.clear()
    remote, local = pair(nbytes, distance + 1)   # a write: the remote side is the one past the other
    memory.push(1, remote.ctypes.data, local)
    assert np.array_equal(remote, local)
    bounced = 0 < distance + 1 < 64 and nbytes > copying.PIECE
    assert all((a - b) % 4096 == 0 for a, b, _ in seen) == (bounced or distance + 1 == 0)
    assert len(seen) == (-(-nbytes // cma.CHUNK) if bounced else 1)


def test_cma_reductions_read_each_chunk_at_its_page_offset():
    if cma_denied():
        pytest.skip(cma_denied())
    memory, seen = own_memory(copying.copier())
    x = np.arange(cma.CHUNK // 4 + 777, dtype=np.float32)   # a chunk and a bit
    acc = np.ones_like(x)

    def add(start, part):
        acc[start:start + part.size] += part
    memory.reduce(1, x.ctypes.data + 4, acc[:-1], add)
    assert np.array_equal(acc[:-1], 1 + x[1:]) and acc[-1] == 1
    assert len(seen) == 2 and all((local - remote) % 4096 == 0 for local, remote, _ in seen)


def test_where_the_host_copies_slow_distances_at_full_speed_reads_and_writes_go_straight():
    # The detour through a buffer at the remote page offset costs a second copy: only where the
    # kernel's copy is slow at such distances is it worth it (cma.distance_cost, per process).
    if cma_denied():
        pytest.skip(cma_denied())
    memory, seen = own_memory(copying.copier())
    memory.bounce = False
    dst, src = pair(3 * cma.CHUNK + 12345, 16)
    memory.pull(1, src.ctypes.data, dst)
    assert np.array_equal(dst, src) and len(seen) == 1 and (seen[0][0] - seen[0][1]) % 4096 == 16
    seen.clear()
    remote, local = pair(3 * cma.CHUNK + 12345, 17)
    memory.push(1, remote.ctypes.data, local)
    assert np.array_equal(remote, local) and len(seen) == 1


def test_the_distance_probe_is_a_finite_ratio_and_decides_the_detour(monkeypatch):
    if cma_denied():
        pytest.skip(cma_denied())
    cost = cma.distance_cost.__wrapped__(64 << 10)
    assert 0 < cost < 100, cost
    monkeypatch.setattr(cma, "distance_cost", lambda: cma.DISTANCE_SLOW * 2)
    assert cma.slow_distances()
    monkeypatch.setattr(cma, "distance_cost", lambda: 1.0)
    assert not cma.slow_distances()


PLACED_AFTER_PROBES = """
import numpy as np
from ringcomm.transport.shm import cma
first = np.empty(1 << 20, np.uint8)   # where the process puts a 1 MiB array untouched
cma.read_cost(), cma.distance_cost()
later = np.empty(1 << 20, np.uint8)

def on_heap(a):
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            return lo <= a.ctypes.data < hi
    return False
print(on_heap(first), on_heap(later))
"""


def test_the_start_up_probes_leave_where_the_callers_arrays_go_unchanged():
    # glibc raises its mmap threshold to the size of each mapped block freed: probes that freed
    # 1 MiB numpy arrays made the caller's later arrays of that size come from the heap, 16
    # bytes apart modulo a page (reads between them 1.2x slower on a Xeon, a detour on an EPYC).
    if cma_denied():
        pytest.skip(cma_denied())
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", PLACED_AFTER_PROBES], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[0] == out[1] == "False", f"1 MiB arrays on the heap (before the probes, after): {out}"
