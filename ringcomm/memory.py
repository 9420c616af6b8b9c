"""``ringcomm.empty``: host buffers that the node's other ranks can map (MPI_Alloc_mem's idea,
NCCL's ncclMemAlloc for host memory).

A large all-reduce inside a node is bound by memory traffic. The direct algorithms reach a
peer's ordinary buffer only through the kernel (process_vm_readv and _writev: CMA), a copy into
a buffer of their own and then the arithmetic; the kernel's copy is slower than a memcpy, and
each call costs microseconds of its own, so a 64 MiB all-reduce of two ranks stays well above
the time of a local ``x += y`` (docs/performance.md). A buffer from ``empty`` lies in a memfd
block whose descriptor its peers open (``/proc/<pid>/fd/<fd>``, the shm transport's way to share
segments) and map once: a direct algorithm then reduces straight out of the peer's memory and
stores its result straight into it, about 2 S bytes of memory traffic per rank against 3 S for
``x += y`` (S the vector).

Blocks are memfds, not files in /dev/shm: a Docker /dev/shm of 64 MiB does not limit them, and
nothing is left behind by a job killed at any moment. Every page is reserved when the block is
made (posix_fallocate), so a short machine says ENOSPC here, where ``empty`` falls back to
private memory, instead of SIGBUS later.

A block outlives the arrays carved from it: when the last view of one is gone the block goes
back to this process's pool, and is never unmapped. Peers therefore may cache their mapping for
as long as this process lives (a mapped range of a rank is that block for good). A later
``empty`` takes the smallest free block that holds it and wastes at most half of it (``SLACK``):
a freed block once served only requests of its exact size, so a program whose buffer sizes vary
(a last short batch, buckets rebuilt) made a new block, and held one more descriptor, for every
size it ever asked for. The memory this process holds is then about its peak, as with torch's
caching allocators. Each block keeps its descriptor open (peers open it through /proc), so
blocks stop at a quarter of the process's descriptor limit (``most_blocks``): beyond, ``empty``
returns private memory rather than starve the program's own files and sockets. A child made by
fork starts with an empty pool: it inherits the mappings, shared with its parent, and must not
hand them out again.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import functools
import logging
import mmap
import os
import sys
import threading
import weakref
from typing import Optional

import numpy as np

from .errors import bad_type, bad_value

MIN_BYTES = 256 << 10   # smaller buffers gain nothing (the direct algorithms run from a few MiB)
GRAIN = 64 << 10        # block sizes are multiples of this, so freed blocks fit later requests
SLACK = 2               # a free block serves requests of more than 1/SLACK of its size

_log = logging.getLogger("ringcomm")


class Block:
    """One memfd, mapped here for good: ``addr`` its address, ``fd`` its descriptor, ``ino`` its
    inode (peers check it: a descriptor number alone could name another file by then)."""
    __slots__ = ("fd", "ino", "data", "addr", "nbytes")

    def __init__(self, fd: int, data: np.ndarray):
        self.fd, self.data = fd, data
        self.ino = os.fstat(fd).st_ino
        self.addr, self.nbytes = data.ctypes.data, data.nbytes


class _Lease:
    """The base of the arrays ``empty`` returns: numpy keeps it alive as long as any view of the
    array, and its finalizer gives the block back."""
    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, block: Block, nbytes: int):
        self.__array_interface__ = {"data": (block.addr, False), "typestr": "|u1", "shape": (nbytes,),
                                    "version": 3}


class Pool:
    """This process's blocks: ``blocks`` sorted by address (for ``locate``), ``free`` by size (a
    size only while it has a free block)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.blocks: list = []
        self.starts: list = []
        self.free: dict = {}
        self.failed: Optional[str] = None   # why memfds cannot be made here, once found
        self.most_blocks = _most_blocks()
        self.said_full = False

    def take(self, nbytes: int) -> Optional[Block]:
        size = -(-nbytes // GRAIN) * GRAIN
        with self.lock:
            spare = self._fitting(size)
            if spare is not None:
                return spare
            if self.failed is not None:
                return None
            if len(self.blocks) >= self.most_blocks:   # freed blocks still serve: only new ones stop
                if not self.said_full:
                    self.said_full = True
                    _log.info("ringcomm.empty: no new shared block: %d blocks hold a file descriptor each, a "
                              "quarter of this process's limit (RLIMIT_NOFILE); private memory for sizes no free "
                              "block holds", len(self.blocks))
                return None
        try:
            block = _make(size)
        except OSError as err:
            with self.lock:
                self.failed = f"{errno.errorcode.get(err.errno, err.errno)}: {err.strerror}"
            _log.info("ringcomm.empty: no shared block of %d bytes (%s); private memory instead, "
                      "which peers reach only through the kernel (CMA)", size, self.failed)
            return None
        with self.lock:
            i = bisect.bisect(self.starts, block.addr)
            self.starts.insert(i, block.addr)
            self.blocks.insert(i, block)
        return block

    def _fitting(self, size: int) -> Optional[Block]:
        """The smallest free block of at least ``size`` bytes and at most SLACK times it, taken
        out of the free lists (under the lock)."""
        fits = [n for n in self.free if size <= n <= SLACK * size]
        if not fits:
            return None
        spare = self.free[min(fits)]
        block = spare.pop()
        if not spare:
            del self.free[block.nbytes]
        return block

    def give_back(self, block: Block) -> None:
        with self.lock:
            if block in self.blocks:   # not a parent's block in a forked child (forget)
                self.free.setdefault(block.nbytes, []).append(block)

    def locate(self, addr: int, nbytes: int) -> Optional[Block]:
        """The block holding ``nbytes`` at ``addr`` of this process, or None."""
        if not self.starts:
            return None
        # Under the lock: ``take`` inserts into the two lists one after the other, and a lookup
        # between the two would pair an address with its neighbour's block.
        with self.lock:
            i = bisect.bisect(self.starts, addr) - 1
            if i < 0:
                return None
            block = self.blocks[i]
        return block if block.addr <= addr and addr + nbytes <= block.addr + block.nbytes else None

    def forget(self) -> None:
        """In a forked child: the parent's blocks are shared with it, never to be handed out here."""
        self.lock = threading.Lock()
        self.blocks, self.starts, self.free = [], [], {}


def _most_blocks() -> int:
    """A quarter of this process's soft descriptor limit (at least 16)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 256
    return 1 << 20 if soft == resource.RLIM_INFINITY else max(16, soft // 4)


def _make(size: int) -> Block:
    fd = os.memfd_create("ringcomm-buffer", os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, size)   # every page now, or ENOSPC now: never SIGBUS later
        data = map_shared(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return Block(fd, data)


def map_shared(fd: int, size: int) -> np.ndarray:
    """mmap(2) of ``fd``, shared and writable, through libc, as a uint8 array. Python's mmap.mmap
    keeps a duplicate of the descriptor: two per block where the block's own is all that peers
    need, and one more in every peer that maps it. Neither side ever unmaps a block. OSError on
    failure."""
    addr = _libc_mmap()(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:   # MAP_FAILED
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr))


@functools.lru_cache(maxsize=1)
def _libc_mmap():
    f = ctypes.CDLL(None, use_errno=True).mmap
    f.restype = ctypes.c_void_p
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return f


POOL = Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL.forget)


def locate(addr: int, nbytes: int) -> Optional[Block]:
    return POOL.locate(addr, nbytes)


def empty(shape, dtype=np.float32):
    """An uninitialised host array of ``shape`` and ``dtype`` (a numpy dtype, or a torch dtype for
    a CPU tensor) that the other ranks of this node can map: collectives on it inside a node read
    and write it in place instead of through the kernel (the module docstring). Any other use of
    it is an ordinary array's. Below 256 KiB, or where the system cannot make a shared block, it
    is ordinary private memory."""
    dims = _shape(shape)
    torch_dtype, np_dtype, itemsize = _dtype(dtype)
    count = 1
    for d in dims:
        count *= d
    nbytes = count * itemsize
    block = POOL.take(nbytes) if nbytes >= MIN_BYTES else None
    if block is None:
        raw = np.empty(nbytes, np.uint8)
    else:
        lease = _Lease(block, nbytes)
        weakref.finalize(lease, POOL.give_back, block)
        raw = np.asarray(lease)
    if torch_dtype is None:
        return raw.view(np_dtype).reshape(dims)
    torch = sys.modules["torch"]
    if not nbytes:   # torch views no empty byte tensor as another dtype
        return torch.empty(dims, dtype=torch_dtype)
    return torch.from_numpy(raw).view(torch_dtype).reshape(dims)


def _shape(shape) -> tuple:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise bad_type("empty", "shape", "an int or a sequence of ints", type(shape).__name__) from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise bad_type("empty", "shape", "an int or a sequence of ints", f"{shape!r}")
        if d < 0:
            raise bad_value("empty", "shape", "sizes >= 0", shape)
    return tuple(int(d) for d in dims)


def _dtype(dtype) -> tuple:
    """(the torch dtype or None, the numpy dtype of a numpy result or None, the item size)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        plain = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
        if not (dtype.is_floating_point or dtype.is_complex or dtype in plain):   # quantized ones are not
            raise bad_type("empty", "dtype", "a numpy dtype or a torch dtype of plain numbers", str(dtype))
        return dtype, None, dtype.itemsize
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise bad_type("empty", "dtype", "a numpy dtype or a torch dtype", repr(dtype)) from None
    if np_dtype.hasobject or np_dtype.itemsize == 0:
        raise bad_type("empty", "dtype", "a numpy dtype of fixed-size plain data", str(np_dtype))
    return None, np_dtype, np_dtype.itemsize
