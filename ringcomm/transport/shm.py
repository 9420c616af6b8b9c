"""Host shared-memory transport: ranks of one node reduce straight out of each other's memory.

Every rank owns POSIX shared-memory segments (files in /dev/shm, mode 0600, names unique per
job) that all ranks of its node map. A send moves no bytes: it publishes a descriptor saying
where the peer can read the payload in a slot of the sender's control segment; the receiver
copies (``irecv``) or reduces (``irecv_reduce``, a numpy ufunc that releases the GIL) directly
from there into its own buffer and acknowledges the slot; the send completes on that
acknowledgement. One pass over the data per receive, no bounce copies.

Where the payload is read from depends on the collective's work array (``stage``):
- an array that lives in a segment (``allocate`` hands out such arrays, e.g. for DDP buckets)
  is published in place: (segment, offset, length);
- an ordinary private array is read by the peer straight out of the sender's process memory
  with Linux Cross Memory Attach (process_vm_readv): (CMA, address, length). One copy per
  receive instead of two: without CMA each sent range would first be copied into the rank's
  staging segment (the "shadow" at the same offsets) and read from there, which costs as much
  as the receive itself. The kernel allows CMA only where the reader could attach a debugger
  to the peer anyway (the same user, ptrace permitted), and the ranks of a node are already
  trusted with each other's 0600 segments, so it grants nothing a rank could not do already.
  Containers often forbid it (seccomp, ptrace restrictions: EPERM), so at setup every rank
  test-reads a random token from the next rank of the node and the node agrees: CMA
  everywhere, or the staging copy everywhere, silently. The token also catches ranks in other
  PID namespaces (a pid that names another process there), and a ring of such reads crosses
  every boundary between groups of ranks that cannot read each other. ``direct_reads`` says
  which ("cma" or "off: <why>"); RINGCOMM_SHM_CMA=0 forces the staging copy. Even with CMA on,
  collectives below ``cma_min_bytes`` (CMA_MIN_BYTES) stage: the kernel pins each page it
  reads, and for a cache-sized collective that costs more than the copy it saves.

Control segment of a rank: a header (word 0 the abort flag, words 1-3 the CMA probe: pid,
address and value of a token, word 4 the CMA floor this rank asks for), after it the rings
(below), and after those the one-shot window (window.py). Per destination on the node, a ring
of SLOTS descriptor slots of int64 fields [PUB, ACK, TAG, ORD, SEG, OFF, NBYTES]. Message k to a destination goes to
slot (k-1) % SLOTS once that slot's previous message is acknowledged; the sender writes
TAG..NBYTES and then PUB = k. The receiver discovers messages in PUB order, reads the fields
after seeing PUB, consumes the payload, then writes ACK = PUB. ORD numbers the messages of one
(source, destination, tag) stream, so a receive matches exactly the message it was posted for
even when streams (channels, lanes) interleave. A sent range (in a segment or in private memory
alike) must not change until its ACK: the executor keeps it so, as it does for MPI.

Memory ordering: the protocol needs stores to become visible in program order (payload and
fields before PUB; payload reads before ACK) and loads not to pass earlier loads. x86-64 (TSO)
guarantees both for plain stores and loads, and each numpy operation is an opaque C call the
compiler cannot reorder across. On weakly ordered CPUs (ARM, POWER) this would need fences; the
transport refuses to start there unless RINGCOMM_SHM_UNSAFE_ORDERING=1.

Segment lifetime: segments are created collectively (init, staging growth, ``allocate``): each
rank creates its file, the node synchronises, every rank maps every peer's file, the node
synchronises again and each owner unlinks its file. After that the mappings keep the memory
alive and /dev/shm holds nothing of ringcomm's, so even SIGKILL leaks nothing.

Waits poll (2 ms when every rank has a core, 50 us when ranks share cores; polling.py) and then
sleep with exponential backoff (to 1 ms), so 4 ranks on 2 cores still make progress; every wait
honours its timeout. A send whose buffer is neither in a
segment nor in the staged array (rare: the executor only sends from the staged work array)
publishes a descriptor marked "payload over MPI" and goes over the node communicator instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import secrets
from collections import defaultdict, deque
from typing import Optional

import numpy as np

from .. import env
from ..errors import CommError, CommTimeoutError, MismatchError, PeerAbortedError
from .base import Request, Transport
from .polling import spin_for, wait_polling
from .window import Window, region_bytes

SLOTS = 256                       # descriptors in flight per ordered pair before sends queue
PUB, ACK, TAG, ORD, SEG, OFF, NBYTES = range(7)
FIELDS = 8                        # 64-byte slots: one cache line each
HEADER = 8                        # int64 words before the rings; word 0 is the abort flag
PID, PROBE_ADDR, PROBE_VALUE = 1, 2, 3   # header words: where peers test-read this rank (CMA)
CMA_FLOOR = 4                     # header word: the smallest collective this rank would read by CMA
VIA_MPI = -1                      # SEG value: the payload follows over MPI
EMPTY = -2                        # SEG value: a zero-byte message (barriers), nothing to read
CMA = -3                          # SEG value: the payload is in the sender's process memory at OFF
CMA_CHUNK = 1 << 20               # bytes read per system call before reducing: stays in cache
# Collectives smaller than this stage instead of reading by CMA: a cache-sized collective copies
# fast, and process_vm_readv pins every page it reads, which then dominates (2 ranks here: the
# ring at 256 KiB-16 MiB took 1.2-1.6x longer with CMA, at 64 MiB 0.75x; docs/transports.md).
CMA_MIN_BYTES = 32 << 20
SHM_DIR = "/dev/shm"
PREFIX = "ringcomm-"
GROW_QUANTUM = 1 << 20
_TSO = {"x86_64", "amd64", "i386", "i686"}


def _check_ordering() -> None:
    if platform.machine().lower() not in _TSO and not env.get("RINGCOMM_SHM_UNSAFE_ORDERING"):
        raise CommError(f"the shm transport relies on x86 store ordering; this CPU is "
                        f"{platform.machine()} (set RINGCOMM_TRANSPORT=mpi, or "
                        f"RINGCOMM_SHM_UNSAFE_ORDERING=1 to try anyway)")


def _address(a) -> int:
    """Start address of an array's data: host (numpy) or device (cupy) memory."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_process_vm_readv():
    """libc's process_vm_readv, or None where there is none (not Linux, an old libc)."""
    try:
        f = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                  ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    f.restype = ctypes.c_ssize_t
    return f


_process_vm_readv = _load_process_vm_readv()


def read_process(pid: int, addr: int, dst_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``addr`` in process ``pid`` to ``dst_addr`` here; OSError on failure.

    ctypes drops the GIL for the call, so other threads run while the kernel copies. The kernel
    may stop short (a page it could not read), so the rest is asked for again; that second call
    then reports the error.
    """
    local, remote = _IoVec(), _IoVec()
    done = 0
    while done < nbytes:
        local.base, local.len = dst_addr + done, nbytes - done
        remote.base, remote.len = addr + done, nbytes - done
        got = _process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:   # 0 would loop forever; the kernel only returns it for empty vectors
            code = ctypes.get_errno() if got < 0 else errno.EIO
            raise OSError(code, os.strerror(code))
        done += got


def _cma_min_bytes() -> int:
    """RINGCOMM_SHM_CMA_MIN (bytes, e.g. 32M), else CMA_MIN_BYTES."""
    value = env.get("RINGCOMM_SHM_CMA_MIN")
    return CMA_MIN_BYTES if value is None else value


def _errno_text(err: OSError) -> str:
    name = errno.errorcode.get(err.errno, str(err.errno))
    if err.errno == errno.ESRCH:
        return f"{name} (the process is gone)"
    return f"{name} ({err.strerror})"


class Segment:
    """One rank's shared mapping: ``data`` is a uint8 array over all of it."""

    __slots__ = ("seg_id", "data", "addr", "nbytes")

    def __init__(self, seg_id: int, data: np.ndarray):
        self.seg_id, self.data = seg_id, data
        self.addr, self.nbytes = _address(data), data.nbytes

    def contains(self, addr: int, nbytes: int) -> bool:
        return self.addr <= addr and addr + nbytes <= self.addr + self.nbytes


def _map(path: str, nbytes: int, create: bool) -> np.ndarray:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)   # the mapping keeps the memory; the descriptor is not needed
    return np.frombuffer(mm, dtype=np.uint8)


class _Send(Request):
    __slots__ = ("t", "peer", "tag", "ord", "buf", "where", "slot", "num", "mpi_req")

    def __init__(self, t, peer, tag, ordinal, buf, where):
        self.t, self.peer, self.tag, self.ord, self.buf, self.where = t, peer, tag, ordinal, buf, where
        self.slot = self.num = -1
        self.mpi_req = None

    def test(self) -> bool:
        t = self.t
        t.progress()
        if self.slot < 0:
            return False
        if self.mpi_req is not None and not self.mpi_req.Test():
            return False
        return t.rings_out[self.peer][self.slot, ACK] >= self.num

    def wait(self, timeout):
        return wait_polling(self.test, timeout, lambda: self.t.aborted_reason(self.peer))


class _Recv(Request):
    __slots__ = ("t", "peer", "tag", "ord", "buf", "reduce", "scratch", "own", "done", "mpi", "slot", "error")

    def __init__(self, t, peer, tag, ordinal, buf, reduce, scratch, own=None):
        self.t, self.peer, self.tag, self.ord = t, peer, tag, ordinal
        self.buf, self.reduce, self.scratch, self.own = buf, reduce, scratch, own
        self.done, self.mpi, self.slot, self.error = False, None, -1, None

    def test(self) -> bool:
        if not self.done:
            self.t.progress()
            if not self.done:
                self.t.try_receive(self)
        if self.error is not None:
            raise self.error
        return self.done

    def wait(self, timeout):
        return wait_polling(self.test, timeout, lambda: self.t.aborted_reason(self.peer))

    def cancel(self) -> None:
        if not self.done and self.slot < 0:
            self.t._plain[self.peer].pop((self.tag, self.ord), None)
            self.done = True


class ShmTransport(Transport):
    """Point-to-point between the ranks of one node through shared memory.

    ``node_comm`` is an MPI communicator holding exactly the ranks that share this memory;
    ``ranks`` maps its ranks to the global ranks the algorithms name (``ranks[i]`` is node rank i).
    Use one transport from one thread at a time (the Communicator serialises its collectives).
    """

    name = "shm"

    def __init__(self, node_comm, ranks, *, world_rank: int, world_size: int,
                 setup_timeout: float = 300.0):
        _check_ordering()
        self.setup_timeout = setup_timeout   # bounds the node-wide handshakes of segment setup
        self.comm = node_comm
        self.rank, self.size = world_rank, world_size
        self.ranks = list(ranks)
        self.local = {r: i for i, r in enumerate(self.ranks)}
        self.me = node_comm.Get_rank()
        self.n = node_comm.Get_size()
        if self.ranks[self.me] != world_rank or len(self.ranks) != self.n:
            raise CommError(f"shm transport: node communicator ranks {self.ranks} do not match "
                            f"world rank {world_rank} at node rank {self.me}")
        job = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}" if self.me == 0 else None
        self.job = node_comm.bcast(job, root=0)   # names unique per job and node
        self._next_seg = 0
        self._own: dict[int, Segment] = {}            # seg_id -> my segment
        self._peers: dict[tuple, np.ndarray] = {}     # (node rank, seg_id) -> uint8 view
        self._staging: Optional[Segment] = None
        self._shadow: Optional[tuple] = None          # (address, nbytes, read by CMA?) of the staged array
        self._chunk: Optional[np.ndarray] = None      # reused by CMA reductions, stays in cache
        self._allocated: list[Segment] = []
        self._aborted: Optional[str] = None
        self._closed = False
        self._out_num = [0] * self.n
        self._out_ord: list = [defaultdict(int) for _ in range(self.n)]
        self._in_ord: list = [defaultdict(int) for _ in range(self.n)]
        self._queued: list = [deque() for _ in range(self.n)]
        self._seen = [0] * self.n                       # messages discovered per source
        self._arrived: list = [{} for _ in range(self.n)]   # (tag, ord) -> slot, not yet taken
        self._plain: list = [{} for _ in range(self.n)]     # (tag, ord) -> posted copy-receive
        words = HEADER + self.n * SLOTS * FIELDS
        ctrl = self._create(words * 8 + region_bytes())
        self.header = ctrl[0].data[:words * 8].view(np.int64)[:HEADER]
        self.rings_out = ctrl[0].data[:words * 8].view(np.int64)[HEADER:].reshape(self.n, SLOTS, FIELDS)
        self.peer_header = [v[:words * 8].view(np.int64)[:HEADER] for v in ctrl[1]]
        self.rings_in = [v[:words * 8].view(np.int64)[HEADER:].reshape(self.n, SLOTS, FIELDS)[self.me]
                         for v in ctrl[1]]
        # The window (one-shot collectives) lives after the rings. Its ranks are node ranks, so it
        # is offered only when this node holds the whole job in rank order.
        whole_job = self.ranks == list(range(world_size))
        self.window = Window(self.me, [v[words * 8:] for v in ctrl[1]], aborted=self.aborted_reason,
                             spin=spin_for(self.n)) if whole_job else None
        # The CMA probe goes into the header now: the handshakes of the segment setup below
        # make every peer's visible before anyone test-reads it.
        self._probe = np.array([secrets.randbits(62)], np.int64)   # private memory, kept alive
        self.header[PID], self.header[PROBE_ADDR], self.header[PROBE_VALUE] = \
            os.getpid(), _address(self._probe), self._probe[0]
        self.header[CMA_FLOOR] = _cma_min_bytes()
        # A first staging segment now, while every rank is here: collectives of up to this size
        # (where a rank's program can be empty and skip stage) never need a growth handshake.
        self._staging = self._new_data_segment(GROW_QUANTUM)
        self._pids = [int(h[PID]) for h in self.peer_header]
        self.direct_reads = self._agree_direct_reads()
        self._direct = self.direct_reads == "cma"
        # Every rank must stage a collective alike (staging growth is collective): the largest
        # floor any rank asked for applies to all.
        self.cma_min_bytes = max(int(h[CMA_FLOOR]) for h in self.peer_header)

    # ---- direct reads (CMA) ------------------------------------------------------------------
    def _direct_reads_blocked(self) -> Optional[str]:
        """Why this rank must not even try CMA; None if it may (hook)."""
        if not env.get("RINGCOMM_SHM_CMA"):
            return "RINGCOMM_SHM_CMA=0"
        if _process_vm_readv is None:
            return "libc has no process_vm_readv"
        return None

    def _agree_direct_reads(self) -> str:
        """Collective over the node: "cma" if every rank read its neighbour's probe, else "off: why".

        All or nothing, so that every rank stages alike (staging growth is a collective).
        """
        why = self._direct_reads_blocked()
        if why is None:
            p = (self.me + 1) % self.n
            got = np.zeros(1, np.int64)
            try:
                self._pull(p, int(self.peer_header[p][PROBE_ADDR]), got)
            except CommError as err:
                why = str(err)
            else:
                if got[0] != self.peer_header[p][PROBE_VALUE]:
                    why = f"rank {self.rank} read a wrong probe value from rank {self.ranks[p]}"
        failed = self._agree(why is not None, "agree on direct reads")
        if not failed:
            return "cma"
        return f"off: {why}" if why else f"off: direct reads failed on ranks {failed}"

    def _pull(self, p: int, addr: int, dst: np.ndarray) -> None:
        """Copy ``dst.nbytes`` bytes at ``addr`` of node rank ``p``'s memory into ``dst``."""
        try:
            read_process(self._pids[p], addr, _address(dst), dst.nbytes)
        except OSError as err:
            raise CommError(f"shm transport on rank {self.rank}: cannot read {dst.nbytes} bytes at "
                            f"{addr:#x} of rank {self.ranks[p]} (pid {self._pids[p]}): "
                            f"{_errno_text(err)}") from None

    def _receive_direct(self, req: _Recv, addr: int) -> None:
        """Consume a CMA message: read it into the (flat) receive buffer, or reduce it into it
        chunk by chunk, so that what the kernel copies is still in cache for the reduction."""
        buf = req.buf
        if req.reduce is None:
            if buf.flags.c_contiguous:
                self._pull(req.peer, addr, buf)
            else:   # the kernel writes one contiguous range
                tmp = np.empty(buf.shape, buf.dtype)
                self._pull(req.peer, addr, tmp)
                buf[...] = tmp
            return
        if self._chunk is None:
            self._chunk = np.empty(CMA_CHUNK, np.uint8)
        tmp = self._chunk.view(buf.dtype)
        for i in range(0, buf.size, tmp.size):
            dst = buf[i:i + tmp.size]
            part = tmp[:dst.size]
            self._pull(req.peer, addr + i * buf.itemsize, part)
            _reduce(req, dst, part, i)

    # ---- segments --------------------------------------------------------------------------
    def _path(self, node_rank: int, seg_id: int) -> str:
        return f"{SHM_DIR}/{self.job}-{node_rank}-{seg_id}"

    def _agree(self, failed: bool, what: str) -> list:
        """Node-wide allgather of a failure flag, bounded by ``setup_timeout`` (never a hang)."""
        mine, every = np.array([int(failed)], np.int64), np.zeros(self.n, np.int64)
        req = self.comm.Iallgather(mine, every)
        if not wait_polling(req.Test, self.setup_timeout, self.aborted_reason):
            raise CommTimeoutError(f"shm transport on rank {self.rank}: timed out after "
                                   f"{self.setup_timeout:g} s waiting for the ranks of this node "
                                   f"{self.ranks} to {what} (did every rank enter the same collective?)")
        return [self.ranks[i] for i in np.flatnonzero(every)]

    def _create(self, nbytes: int):
        """Collective over the node: a new segment per rank, mapped by all, unlinked at once."""
        seg_id = self._next_seg
        self._next_seg += 1
        mine = self._path(self.me, seg_id)
        err, data = None, None
        views = [None] * self.n
        try:
            try:
                data = _map(mine, nbytes, create=True)
            except OSError as e:
                err = f"cannot create {mine} ({nbytes} bytes): {e}"
            failed = self._agree(err is not None, f"create {nbytes}-byte segments")
            if not failed:
                for i in range(self.n):
                    try:
                        views[i] = data if i == self.me else _map(self._path(i, seg_id), nbytes, create=False)
                    except OSError as e:
                        err = f"cannot map {self._path(i, seg_id)}: {e}"
                        break
                failed = self._agree(err is not None, "map each other's segments")
        finally:   # every peer has mapped it (or given up): the name is no longer needed
            if data is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(mine)
        if failed:
            raise CommError(f"shm transport on rank {self.rank}: could not set up shared memory on "
                            f"ranks {failed}" + (f": {err}" if err else ""))
        seg = Segment(seg_id, data)
        self._own[seg_id] = seg
        for i, v in enumerate(views):
            if i != self.me:
                self._peers[(i, seg_id)] = v
        return seg, views

    def _drop(self, seg: Segment) -> None:
        """Forget a segment everywhere on this rank; the memory goes when the last view does."""
        self._own.pop(seg.seg_id, None)
        for i in range(self.n):
            self._peers.pop((i, seg.seg_id), None)

    def allocate(self, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """A new array of ``nbytes`` bytes inside shared memory, so ``stage`` skips the copy-in.

        Collective over the ranks of this node (every one calls it with the same size, like
        DDP building its buckets); call it while no async collective is in flight. The memory
        lives until ``close``.
        """
        dtype = np.dtype(dtype)
        if nbytes < 0 or nbytes % dtype.itemsize:
            raise ValueError(f'allocate got unexpected value for argument "nbytes" (expected a '
                             f'non-negative multiple of {dtype.itemsize}, got {nbytes})')
        seg = self._new_data_segment(max(nbytes, 1))
        self._allocated.append(seg)
        return seg.data[:nbytes].view(dtype)

    def owns(self, a: np.ndarray) -> bool:
        return self._locate(_address(a), a.nbytes) is not None

    def _locate(self, addr: int, nbytes: int):
        for seg in self._own.values():
            if seg.contains(addr, nbytes):
                return seg.seg_id, addr - seg.addr
        return None

    @contextlib.contextmanager
    def stage(self, arrays: tuple):
        """Make the collective's work array (``arrays[0]``) sendable from shared memory for the length of one collective.

        If ``flat`` lives in a segment (``allocate``), sends publish it in place: no copy at all.
        Otherwise the collective still works on ``flat`` itself: with CMA peers read its sent
        ranges where they are; without, the staging segment shadows it and a send copies just
        its own range to the same offset there before publishing it. Receives land straight in
        ``flat``, so nothing is copied back, and only bytes that are actually sent are copied in
        (a 2-rank ring all-reduce copies S, not 2S).

        Every rank of the node enters stage for the same collective with the same byte count,
        and ``direct_reads`` is the same on all of them, so growing the staging segment (a
        collective) is decided on those alone.
        """
        if not arrays:
            yield
            return
        flat = arrays[0]
        self._check_array(flat)
        nbytes = flat.nbytes
        direct = self._direct and nbytes >= self.cma_min_bytes
        if nbytes and not direct and (self._staging is None or self._staging.nbytes < nbytes):
            old = self._staging
            size = max(nbytes, 2 * old.nbytes if old else 0)
            self._staging = self._new_data_segment(-(-size // GROW_QUANTUM) * GROW_QUANTUM)
            if old is not None:
                self._release(old)
        if not nbytes or self.owns(flat):
            yield
            return
        self._shadow = (_address(flat), nbytes, direct)
        try:
            yield
        finally:
            self._shadow = None

    def _where(self, buf: np.ndarray):
        """(SEG, OFF) a peer can read ``buf`` at: a segment, the sender's own memory (CMA), or
        the staging segment after copying ``buf`` there; None if none of them."""
        addr, nbytes = _address(buf), buf.nbytes
        if not nbytes:
            return EMPTY, 0
        found = self._locate(addr, nbytes)
        if found is not None or self._shadow is None:
            return found
        base, total, direct = self._shadow
        off = addr - base
        if not (0 <= off and off + nbytes <= total):
            return None
        if direct:
            return CMA, addr
        self._staging.data[off:off + nbytes] = _bytes(buf)
        return self._staging.seg_id, off

    # ---- point to point --------------------------------------------------------------------
    def _node_rank(self, peer: int) -> int:
        try:
            return self.local[peer]
        except KeyError:
            raise CommError(f"shm transport on rank {self.rank}: rank {peer} is not on this node "
                            f"(node ranks {self.ranks})") from None

    def isend(self, buf, peer, tag):
        self._check_usable()
        p = self._node_rank(peer)
        ordinal = self._out_ord[p][tag]
        self._out_ord[p][tag] = ordinal + 1
        req = _Send(self, p, tag, ordinal, buf, self._where(buf))
        if req.where is None:   # not readable by the peer: the payload goes over MPI
            req.mpi_req = self._send_outside(buf, p, tag)
        self._queued[p].append(req)
        self._publish(p)
        return req

    def irecv(self, buf, peer, tag):
        return self._post(buf, peer, tag, None, None)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch, own=None):
        return self._post(buf, peer, tag, reduce, scratch, own)

    def _post(self, buf, peer, tag, reduce, scratch, own=None):
        self._check_usable()
        p = self._node_rank(peer)
        ordinal = self._in_ord[p][tag]
        self._in_ord[p][tag] = ordinal + 1
        req = _Recv(self, p, tag, ordinal, buf, reduce, scratch, own)
        if reduce is None:
            self._plain[p][(tag, ordinal)] = req
        self.try_receive(req)
        return req

    def _publish(self, p: int) -> None:
        """Publish queued sends to ``p`` in order: message k goes to slot (k-1) % SLOTS once
        that slot's previous message is acknowledged; fields first, PUB last (module doc)."""
        queue, ring = self._queued[p], self.rings_out[p]
        while queue:
            num = self._out_num[p] + 1
            row = ring[(num - 1) % SLOTS]
            if row[PUB] != row[ACK]:
                return
            req = queue.popleft()
            self._out_num[p] = num
            seg, off = req.where if req.where is not None else (VIA_MPI, 0)
            row[TAG], row[ORD], row[SEG], row[OFF], row[NBYTES] = req.tag, req.ord, seg, off, req.buf.nbytes
            self._before_publish()
            row[PUB] = num
            req.slot, req.num = (num - 1) % SLOTS, num

    def _discover(self, p: int) -> None:
        """Index the messages ``p`` has published since the last look (PUB numbers are dense)."""
        ring, seen, arrived = self.rings_in[p], self._seen[p], self._arrived[p]
        while True:
            slot = seen % SLOTS
            if ring[slot, PUB] != seen + 1:
                break
            arrived[(int(ring[slot, TAG]), int(ring[slot, ORD]))] = slot
            seen += 1
        self._seen[p] = seen

    def probe(self, source, tag=None, context=0):
        """The first published message nobody has posted a copy-receive for (see Transport.probe)."""
        if source is None:
            peers = range(self.n)
        elif source in self.local:
            peers = [self.local[source]]
        else:
            return None
        for p in peers:
            self._discover(p)
            for (t, o), slot in self._arrived[p].items():
                if (t == tag if tag is not None else t >> 32 == context) and (t, o) not in self._plain[p]:
                    return self.ranks[p], t, int(self.rings_in[p][slot, NBYTES])
        return None

    def progress(self) -> None:
        """Publish what waits for a slot; complete copy-receives whose message is there."""
        for p in range(self.n):
            if self._queued[p]:
                self._publish(p)
            plain = self._plain[p]
            if plain:
                self._discover(p)
                arrived = self._arrived[p]
                for key in [k for k, req in plain.items() if k in arrived or req.slot >= 0]:
                    self.try_receive(plain[key])

    def try_receive(self, req: _Recv) -> None:
        """Consume ``req``'s message if it has been published; at most once."""
        if req.done:
            return
        ring = self.rings_in[req.peer]
        if req.slot < 0:
            key = (req.tag, req.ord)
            arrived = self._arrived[req.peer]
            if key not in arrived:
                self._discover(req.peer)
                if key not in arrived:
                    return
            req.slot = arrived.pop(key)
        row = ring[req.slot]
        nbytes = int(row[NBYTES])
        seg = int(row[SEG])
        if nbytes != req.buf.nbytes:   # raised when the receive is waited; nothing is written
            req.error = MismatchError(f"rank {self.rank}: message from rank {self.ranks[req.peer]} "
                                      f"(tag {req.tag}) has {nbytes} bytes, the receive expected "
                                      f"{req.buf.nbytes}")
            if seg == VIA_MPI:   # drain the payload so that the MPI stream stays in step
                self.comm.Recv(np.empty(nbytes, np.uint8), source=req.peer, tag=req.tag)
        elif seg == VIA_MPI:
            target = req.buf if req.reduce is None else req.scratch[:req.buf.size]
            if req.mpi is None:
                req.mpi = self.comm.Irecv(_bytes(target), source=req.peer, tag=req.tag)
            if not req.mpi.Test():
                return
            if req.reduce is not None:
                _reduce(req, req.buf, target, 0)
        elif seg == CMA:
            try:
                self._receive_direct(req, int(row[OFF]))
            except CommError as err:   # raised when the receive is waited, like a mismatch
                req.error = err
        elif seg != EMPTY:
            off = int(row[OFF])
            src = self._peers[(req.peer, seg)][off:off + nbytes].view(req.buf.dtype)
            if req.reduce is None:
                req.buf[...] = src
            else:
                _reduce(req, req.buf, src, 0)
            self._after_consume()
        row[ACK] = row[PUB]
        req.done = True
        if req.reduce is None:
            del self._plain[req.peer][(req.tag, req.ord)]

    # Hooks for transports whose segments are device memory (cuda_ipc).
    def _new_data_segment(self, nbytes: int) -> Segment:
        """Collective over the node: a segment for work arrays, mapped by every peer."""
        return self._create(nbytes)[0]

    def _release(self, seg: Segment) -> None:
        """Collective over the node: forget a superseded staging segment."""
        self._drop(seg)

    def _check_array(self, flat) -> None:
        if not isinstance(flat, np.ndarray):
            raise CommError(f"shm transport on rank {self.rank}: got a {type(flat).__module__}."
                            f"{type(flat).__name__}; host shared memory carries numpy arrays only")

    def _send_outside(self, buf, p: int, tag: int):
        """Start sending a buffer that lives in no segment; the receiver sees SEG == VIA_MPI."""
        return self.comm.Isend(_bytes(buf), dest=p, tag=tag)

    def _before_publish(self) -> None:
        pass

    def _after_consume(self) -> None:
        pass

    # ---- failure and shutdown --------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._aborted is not None:
            raise PeerAbortedError(self._aborted)
        if self._closed:
            raise CommError(f"shm transport on rank {self.rank} is closed")

    def aborted_reason(self, peer: Optional[int] = None) -> Optional[str]:
        if self._aborted is not None:
            return self._aborted
        if peer is not None and self.peer_header[peer][0]:
            return f"rank {self.ranks[peer]} aborted its shm transport"
        return None

    def abort(self, reason: BaseException) -> None:
        self._aborted = f"aborted: {reason}"
        if not self._closed:
            self.header[0] = 1   # peers waiting on this rank are released, not left to time out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for plain in self._plain:
            plain.clear()
        self._staging = None
        self._allocated.clear()
        self._own.clear()
        self._peers.clear()

    def describe(self) -> dict:
        return {r: self.name for r in self.ranks if r != self.rank}

    def split(self, members, color, key, context, slot=None):
        from .view import TransportView
        return None if members is None else TransportView(self, members, context)


def _reduce(req: _Recv, dst, msg, start: int) -> None:
    """dst = dst OP msg, or own OP msg when the receive has an own operand; ``dst`` starts at
    element ``start`` of the receive buffer (reductions out of CMA reads go in chunks)."""
    if req.own is None:
        req.reduce(dst, msg)
    else:
        req.reduce(dst, msg, req.own[start:start + dst.size])


def _bytes(buf):
    return buf.reshape(-1).view(np.uint8)
