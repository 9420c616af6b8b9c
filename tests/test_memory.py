"""``ringcomm.empty``: shared blocks for the node's direct algorithms (ringcomm/memory.py), and
how peers map them (transport/shm/peer_buffers.py). Collectives on them run under mpirun in
mpi_jobs/empty_buffers.py."""
import gc
import os

import numpy as np
import pytest
import torch

import ringcomm
from mpi_util import run_mpi
from ringcomm import ArgumentTypeError, UsageError, memory
from ringcomm.transport.shm import peer_buffers
from ringcomm.transport.shm.peer_buffers import PeerBuffers


@pytest.mark.parametrize("shape,dtype", [((1024, 512), np.float32), (1 << 18, np.int64), ((3, 1 << 17), "f2"),
                                         ((1 << 19,), torch.bfloat16), ((2, 1 << 16), torch.complex64)])
def test_a_large_buffer_lies_in_a_block_and_is_an_ordinary_array(shape, dtype):
    a = ringcomm.empty(shape, dtype)
    assert tuple(a.shape) == tuple(shape if isinstance(shape, tuple) else (shape,))
    if isinstance(dtype, torch.dtype):
        assert isinstance(a, torch.Tensor) and a.dtype == dtype and a.is_contiguous()
        addr, nbytes = a.data_ptr(), a.numel() * a.element_size()
        a.fill_(3)
        assert torch.all(a == 3)
    else:
        assert isinstance(a, np.ndarray) and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
        addr, nbytes = a.ctypes.data, a.nbytes
        a[...] = 3
        assert np.all(a == 3)
    block = memory.locate(addr, nbytes)
    assert block is not None and block.addr <= addr and addr + nbytes <= block.addr + block.nbytes


def test_small_and_empty_buffers_are_private_memory():
    for a in (ringcomm.empty(10, np.float32), ringcomm.empty((0, 4), np.float64), ringcomm.empty(0, torch.float32)):
        addr = a.data_ptr() if isinstance(a, torch.Tensor) else a.ctypes.data
        assert memory.locate(addr, 1) is None
    assert ringcomm.empty(0, torch.float32).shape == (0,)


def test_a_freed_block_serves_the_next_buffer_it_holds_with_at_most_half_to_spare():
    a = ringcomm.empty(1 << 20, np.float32)
    block = memory.locate(a.ctypes.data, a.nbytes)
    view = a[10:20]
    del a
    gc.collect()
    assert memory.locate(view.ctypes.data, view.nbytes) is block   # a view keeps the block leased
    other = ringcomm.empty(1 << 20, np.float32)
    assert memory.locate(other.ctypes.data, other.nbytes) is not block
    del view
    gc.collect()
    again = ringcomm.empty(1 << 20, np.int32)   # same byte size: the same block again
    assert memory.locate(again.ctypes.data, again.nbytes) is block
    bigger = ringcomm.empty(1 << 21, np.float32)
    assert memory.locate(bigger.ctypes.data, bigger.nbytes) is not block
    del again
    gc.collect()
    smaller = ringcomm.empty(3 << 18, np.int32)   # 3 MiB from the 4 MiB block
    assert memory.locate(smaller.ctypes.data, smaller.nbytes) is block
    del smaller
    gc.collect()
    tiny = ringcomm.empty(1 << 18, np.int32)      # 1 MiB would waste three quarters of it: a block of its own
    assert memory.locate(tiny.ctypes.data, tiny.nbytes) not in (block, None)


def test_buffers_of_varying_sizes_reuse_blocks_instead_of_holding_one_per_size(monkeypatch):
    """A loop whose buffer sizes vary (the last short batch, rebuilt buckets) once made a block,
    and kept a descriptor open, for every size it asked for: here 200 sizes between 1 and 8 MiB
    made 90 blocks (690 MiB); a block now serves any later size it holds with half to spare, so
    only a size above every earlier one makes a new block."""
    monkeypatch.setattr(memory, "POOL", memory.Pool())
    fds = len(os.listdir("/proc/self/fd"))
    sizes = np.random.default_rng(7).integers(1 << 20, 8 << 20, 200)
    for nbytes in sizes:
        a = ringcomm.empty(int(nbytes), np.uint8)
        a[::4096] = 1
        del a
    assert len(memory.POOL.blocks) <= 12, len(memory.POOL.blocks)
    assert len(os.listdir("/proc/self/fd")) <= fds + 12


def test_locate_never_pairs_an_address_with_a_neighbouring_block():
    a = ringcomm.empty(1 << 20, np.uint8)
    block = memory.locate(a.ctypes.data, a.nbytes)
    assert memory.locate(block.addr + block.nbytes, 1) is not block
    assert memory.locate(block.addr - 1, 1) is not block


def test_blocks_stop_at_a_quarter_of_the_descriptor_limit(monkeypatch):
    """Each block keeps a descriptor open (its peers open it through /proc): past the pool's
    share of RLIMIT_NOFILE, empty() returns private memory instead of starving the program's own
    files and sockets, while freed blocks still serve."""
    monkeypatch.setattr(memory, "POOL", memory.Pool())
    assert memory.POOL.most_blocks >= 16
    memory.POOL.most_blocks = 2
    held = [ringcomm.empty(1 << 20, np.uint8) for _ in range(2)]
    assert all(memory.locate(a.ctypes.data, a.nbytes) is not None for a in held)
    third = ringcomm.empty(1 << 20, np.uint8)
    assert memory.locate(third.ctypes.data, third.nbytes) is None and len(memory.POOL.blocks) == 2
    third[...] = 5
    assert np.all(third == 5)
    del held[0]
    gc.collect()
    again = ringcomm.empty(1 << 20, np.uint8)
    assert memory.locate(again.ctypes.data, again.nbytes) is not None


def test_a_forked_child_does_not_hand_out_its_parents_blocks():
    a = ringcomm.empty(1 << 20, np.uint8)
    block = memory.locate(a.ctypes.data, a.nbytes)
    del a
    gc.collect()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the parent's free block is shared memory here: reusing it would write into the parent
        b = ringcomm.empty(1 << 20, np.uint8)
        os.write(w, b"1" if memory.locate(b.ctypes.data, b.nbytes) is not block else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


@pytest.mark.parametrize("shape,dtype,error,argument", [
    (-1, np.float32, UsageError, "shape"), ((2, -3), np.float32, UsageError, "shape"),
    ("12", np.float32, ArgumentTypeError, "shape"), ((2.0,), np.float32, ArgumentTypeError, "shape"),
    ((True,), np.float32, ArgumentTypeError, "shape"), (None, np.float32, ArgumentTypeError, "shape"),
    (4, object, ArgumentTypeError, "dtype"), (4, "not-a-dtype", ArgumentTypeError, "dtype"),
    (4, torch.qint8, ArgumentTypeError, "dtype")])
def test_bad_arguments_name_the_argument(shape, dtype, error, argument):
    with pytest.raises(error, match=rf'empty got unexpected .* argument "{argument}"'):
        ringcomm.empty(shape, dtype)


def test_a_peer_whose_block_cannot_be_opened_is_reached_by_cma_instead():
    """A failed open (another user's process, hidepid) gives None, once: the window then reads
    that peer through CMA as for any buffer."""
    peers = PeerBuffers([os.getpid(), 2 ** 22 + 12345])
    assert peers.open(1, 3, 42, 1 << 20) is None
    assert peer_buffers._MAPPED[(2 ** 22 + 12345, 42)] is None
    a = ringcomm.empty(1 << 20, np.uint8)
    fd, ino, start, nbytes = PeerBuffers.words(a.ctypes.data + 100, 10)
    assert start == a.ctypes.data and nbytes >= a.nbytes   # a buffer starts its block
    assert peers.open(0, fd, ino + 1, nbytes) is None    # another inode behind that descriptor: refused
    fds = len(os.listdir("/proc/self/fd"))
    view = peers.open(0, fd, ino, nbytes)                 # this process's own block, mapped a second time
    # the mapping keeps no descriptor (Python's mmap kept one per block a peer ever mapped)
    assert len(os.listdir("/proc/self/fd")) == fds
    view[5] = 77
    assert a[5] == 77
    assert PeerBuffers.words(np.empty(4).ctypes.data, 32) == (0, 0, 0, 0)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_on_empty_buffers_are_exact_and_read_peers_in_place(ranks):
    proc = run_mpi(ranks, "empty_buffers.py")
    assert "empty-buffers ok" in proc.stdout, proc.stdout + proc.stderr


def test_a_machine_without_room_for_a_block_gets_private_memory(monkeypatch):
    """ENOSPC from posix_fallocate (a memory cgroup at its limit), or no memfd at all: empty()
    returns ordinary private memory, which peers reach through CMA, and stops asking."""
    import errno
    calls = []

    def no_room(size):
        calls.append(size)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(memory, "POOL", memory.Pool())
    monkeypatch.setattr(memory, "_make", no_room)
    for _ in range(3):
        a = ringcomm.empty(1 << 20, np.float32)
        a[...] = 2
        assert np.all(a == 2) and memory.locate(a.ctypes.data, a.nbytes) is None
    assert len(calls) == 1 and "ENOSPC" in memory.POOL.failed
