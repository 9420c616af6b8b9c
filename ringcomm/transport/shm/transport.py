"""ShmTransport: point-to-point between the ranks of one node through shared memory.

How a message moves (descriptors, where the receiver reads the payload from, payloads over MPI)
is messages.py, the point-to-point half of this class. This file sets the transport up, owns
its segments and windows, and fails and closes it.

Setup (collective over the node, every wait bounded by ``setup_timeout``, node.py): the ranks
exchange pids and /dev/shm's free space, each creates its **control segment** (a header, its
descriptor rings, WINDOW_SLOTS one-shot window regions, then its staging pool; the pool shrinks
to what /dev/shm can hold), maps every peer's, test-reads a peer's memory by CMA, and agrees.
After setup only ``allocate`` runs a handshake.

Thread safety: several communicators (each with its own progress thread) may share one
transport. The state is guarded by one lock, never held while sleeping (polling.py sleeps) nor
while a receive copies or reduces its payload (messages.py).
"""
from __future__ import annotations

import errno
import gc
import logging
import os
import secrets
import threading
import time
from collections import defaultdict, deque
from typing import Optional

import numpy as np

from ... import env
from ...core import copying
from ...diagnostics import faults
from ...errors import CommError, PeerAbortedError, UsageError, peer_ended, rank_name
from ..base import Transport, WindowSlot
from ..mpi import Ledger
from ..polling import spin_for
from ..window import (CAPACITY, JOB_CAPACITY, Window, close_window_owner, region_bytes, set_window_owner,
                      watching_closes, window_owner, window_round)
from . import cma, pipe, segments, staging
from .messages import Messages, _bytes, _Send
from .peer_buffers import PeerBuffers
from .node import Node
from .rings import BLOCK, CMA, RING_BYTES, Incoming, Outgoing, check_ordering, ring_view
from .segments import Segment, address, align

_log = logging.getLogger("ringcomm.shm")

ABORT, PID, PROBE_ADDR, PROBE_VALUE, HANDSHAKES, CLOSED = range(6)   # control header words
HEADER_BYTES = 64
WINDOW_SLOTS = 8          # one-shot window regions per rank (slot 0: ``transport.window``)
_BY_NAME = object()       # _create_once: peers could not open segments by descriptor
PAGE = 4096
# How often a stalled wait asks whether a peer's process still runs (aborted_reason): a dead
# peer fails its waiters within this, not at their timeout; reading /proc costs ~10 us a time.
LIFE_CHECK_EVERY = 0.25
# Arrays of sends that peers read by CMA and had not acknowledged when their transport closed: a
# peer may still receive one (its descriptor is out), so it must not be freed and reused while
# this process lives. Only a send left unmatched at close() lands here.
_UNREAD: list = []


class Layout:
    """Byte offsets inside a rank's control segment, for ``n`` ranks on the node."""

    def __init__(self, n: int):
        self.rings = HEADER_BYTES                        # ring to node rank d at rings + d * RING_BYTES
        # window slot 0 (the job's) holds JOB_CAPACITY per round, the sub-communicators' CAPACITY
        self.capacities = [JOB_CAPACITY] + [CAPACITY] * (WINDOW_SLOTS - 1)
        self.window_at, at = [], self.rings + n * RING_BYTES
        for capacity in self.capacities:
            self.window_at.append(at)
            at += align(region_bytes(capacity))
        self.pool = -(-at // PAGE) * PAGE

    def bytes(self, pool_bytes: int) -> int:
        return self.pool + pool_bytes



class _FaultWindow(Window):
    """The window with the one_shot fault hook (RINGCOMM_FAULT, tests only)."""

    def __init__(self, *args, fire, **kwargs):
        super().__init__(*args, **kwargs)
        self._fire, self._reached = fire, False
        self.core = self.direct_core = None   # the hook sits in publish(), which the compiled rounds do not call

    def publish(self, stamp, word=0):
        k = super().publish(stamp, word)
        if k == 2:
            self._fire("one_shot")
        return k

    def mapped(self, rank, addr, nbytes):
        self._reaching()
        return super().mapped(rank, addr, nbytes)

    def _write(self, rank, addr, src):
        self._reaching()
        return super()._write(rank, addr, src)

    def _reaching(self):
        if not self._reached:   # once: a rank stopped here and resumed goes on
            self._reached = True
            self._fire("direct")


class ShmTransport(Messages, Transport):
    """``node_comm`` is an MPI communicator holding exactly the ranks that share this memory;
    ``ranks[i]`` is the global rank of node rank i. ``setup_timeout`` bounds every handshake
    (the communicator's timeout: ``ringcomm.init(timeout=)`` or RINGCOMM_TIMEOUT)."""

    name = "shm"
    payload_tag = 7   # the MPI tag of every payload over MPI (messages.py); one per transport kind
    _by_fd = True   # share segments by descriptor (segments.py); False once the node cannot
    # The pool and sends are host memory: large sends may go through pipes (pipe.py), and copies
    # go through core/_copy.h (core/copying.py).
    _host_memory = True

    def __init__(self, node_comm, ranks, *, world_rank: int, world_size: int,
                 setup_timeout: float = 300.0, ledger: Optional[Ledger] = None):
        """``ledger``: where the node communicator's messages are counted (transport/mpi.py), if
        another transport over it counts there too."""
        check_ordering()
        self.setup_timeout = setup_timeout
        self.comm = node_comm
        self.rank, self.size = world_rank, world_size
        self.ranks = list(ranks)
        self.local = {r: i for i, r in enumerate(self.ranks)}
        self.me, self.n = node_comm.Get_rank(), node_comm.Get_size()
        if self.ranks[self.me] != world_rank or len(self.ranks) != self.n:
            raise CommError(f"shm transport: node communicator ranks {self.ranks} do not match "
                            f"world rank {world_rank} at node rank {self.me}")
        self.others = [p for p in range(self.n) if p != self.me]
        self.ledger = Ledger(node_comm, self.n) if ledger is None else ledger   # payloads over MPI
        self._lock = threading.Lock()
        self._aborted: Optional[str] = None
        self._closed = False
        # This rank's control header and its peers', once set-up maps them (None and [] before,
        # and again once forgotten): a failed CMA probe during set-up asks aborted_reason.
        self.header: Optional[np.ndarray] = None
        self.peer_header: list = []
        self._ended: list = []   # per peer, once set-up knows them: why its process ended (aborted_reason)
        self._fault = faults.armed(world_rank)
        self._sent = 0                                 # non-empty sends, for the ring fault
        self._said: set = set()                        # info messages already logged
        self.node = Node(node_comm, self.ranks, world_rank, setup_timeout, self._node_gone)
        self._next_seg = 0
        self._data: dict = {}                          # seg_id -> Segment: sends from it are read in place
        self._peers: dict = {}                         # (node rank, seg_id) -> that rank's mapping
        self._staged: list = []                        # [start, end) of staged arrays read by CMA
        self._pipes: list = []                         # pipe sends published and not yet all in their ring
        self._out_ord = [defaultdict(int) for _ in range(self.n)]
        self._in_ord = [defaultdict(int) for _ in range(self.n)]
        self._plain: list = [{} for _ in range(self.n)]      # (tag, ord) -> posted copy-receive
        self._slots_used = {0}   # window slots given to communicators of this rank (0: the job's)
        self._slot_of: dict = {}   # a live view's context id -> its window's slot
        self._slot_last: dict = {}   # slot -> (context id, node ranks) of the last window this rank had on it
        self._slots_offered = 0  # bit mask: slots a split in flight offered its peers (reserve_window_slots)
        self._members_of: dict = {}       # open views' context id -> their members (revive_context)
        self._dead_contexts: set = set()   # closed views' context ids: their messages are dropped (drop_context)
        self._mpi_in: list = [{} for _ in range(self.n)]     # (tag, ord) -> (MPI request, bytes)
        self._inflight: list = [deque() for _ in range(self.n)]   # published sends holding pool space or read by CMA
        self._orphans: list = []                       # MPI receives of refused messages, left to finish
        self._setup()

    # ---- setup ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        self.pid, self.namespace = os.getpid(), segments.pid_namespace()
        self.token = secrets.randbits(48)
        segments.sweep(self.namespace)   # files of killed jobs of this user (segments.py)
        free, _ = segments.space()
        hello = self.node.exchange("setup", [self.pid, self.namespace, self.token,
                                             -1 if free is None else free])
        self._names = [tuple(int(v) for v in row[:3]) for row in hello]
        self._pids = [int(row[0]) for row in hello]
        # Peers in this pid namespace, as /proc shows it, can be watched for their death
        # (aborted_reason): each as the pair (pid, start time), which a reused pid does not fake.
        # None: not watched.
        watch = self.namespace != 0 and segments.proc_is_ours()
        self._starts = [segments.process_start(pid) if watch and ns == self.namespace and i != self.me else None
                        for i, (pid, ns, _) in enumerate(self._names)]
        self._life_checked = [0.0] * self.n
        self._ended = [None] * self.n
        known = [int(row[3]) for row in hello if row[3] >= 0]
        layout = self.layout = Layout(self.n)
        wanted, share = self._choose_share(min(known) if known else None, layout)
        self._probe = np.array([secrets.randbits(62)], np.int64)   # private memory, kept alive
        self._cma_why: Optional[str] = None
        self._copy = copying.copier() if self._host_memory else copying.numpy_copy
        self._raw_copy = self._copy is copying.copy   # the compiled copy, for the pool's memoryviews
        self._memory = cma.PeerMemory(self.rank, self.ranks, self._pids, self._copy, gone=self.aborted_reason)
        self._blocks = PeerBuffers(self._pids)   # peers' ringcomm.empty blocks their sends lie in (BLOCK)
        sizes = [layout.bytes(self._host_pool_bytes(s)) for s in self._fallbacks(share)]
        created = self._create("created", "mapped", sizes, "setup", prepare=self._write_header,
                               on_mapped=self._probe_peer)
        if created is None:
            raise CommError(self._space_text("its control segment and staging pool", sizes[-1]))
        ctrl, views, cma_failed = created
        self._control = ctrl
        self._init_control(ctrl, views, layout)
        got = self._host_pool_share(ctrl.nbytes - layout.pool, share)
        self._init_pool(got, layout)
        if got < wanted:
            free, total = segments.mib(min(known, default=None)), segments.mib(segments.space()[1])
            self._say("pool", f"shm transport on rank {self.rank}: /dev/shm has {free} free of {total} "
                      f"for the {self.n} ranks of this node; staging pool share per peer "
                      f"{segments.mib(got)} instead of {segments.mib(wanted)} (larger messages go over "
                      f"MPI); {segments.space_advice()}")
        why = self._direct_reads_blocked()
        if why is None and cma_failed:
            why = self._cma_why or f"direct reads failed on ranks {cma_failed}"
        self.direct_reads = "cma" if why is None else f"off: {why}"
        self._direct = why is None
        self.cma_min_bytes = cma.min_bytes()
        self.cma_p2p_min_bytes = cma.p2p_min_bytes(probe=self._direct)
        self._memory.bounce = not self._direct or cma.slow_distances()
        # Pipes where this node cannot use CMA (containers often forbid it): where it can, one CMA
        # copy beats the pipe's two from 16 MiB on and ties it at 4 MiB (docs/transports.md).
        # They need the compiled piece, and a host pool whose share holds a ring (not cuda_ipc's).
        self._pipe_ok = bool(not self._direct and self._host_memory and pipe.enabled() and self.pool is not None
                             and self._pool_view is not None and self.pool_share >= pipe.RING_BYTES)
        self._pipe_spin = spin_for(self.n)
        whole_job = self.ranks == list(range(self.size))
        self.window = self._make_window(self.window_regions(0)) if whole_job else None

    def _choose_share(self, free: Optional[int], layout: Layout) -> tuple:
        """(wanted, chosen) bytes per peer of the staging pool: RINGCOMM_SHM_POOL, else
        SHARE_BYTES within POOL_CAP; chosen also within a fair part of /dev/shm's free space
        (3/4 of it, split by rank), so that every rank of the node gets a pool."""
        wanted, cap = env.get("RINGCOMM_SHM_POOL"), None
        if wanted is None:
            wanted, cap = staging.SHARE_BYTES, staging.POOL_CAP
        wanted = staging.share_size(self.n - 1, wanted, None, cap)
        budget = None if free is None else free * 3 // 4 // self.n - layout.bytes(0)
        return wanted, staging.share_size(self.n - 1, wanted, budget, None)

    @staticmethod
    def _fallbacks(share: int) -> list:
        """Share sizes to try when /dev/shm refuses the first: halving, down to no pool at all."""
        out = [share]
        while out[-1] > staging.SHARE_QUANTUM:
            out.append(out[-1] // 2 // staging.SHARE_QUANTUM * staging.SHARE_QUANTUM)
        return out + ([0] if out[-1] else [])

    def _write_header(self, data: np.ndarray) -> None:
        """Before peers can map it: where peers test-read this rank's memory (CMA)."""
        header = data[:HEADER_BYTES].view(np.int64)
        header[PID], header[PROBE_ADDR], header[PROBE_VALUE] = self.pid, address(self._probe), self._probe[0]

    def _probe_peer(self, views: list) -> tuple:
        """After mapping: read the next rank's token by CMA; (1,) if that failed, else (0,)."""
        self._cma_why = self._direct_reads_blocked()
        if self._cma_why is None:
            p = (self.me + 1) % self.n
            header = views[p][:HEADER_BYTES].view(np.int64)
            self._cma_why = self._memory.probe(p, int(header[PROBE_ADDR]), int(header[PROBE_VALUE]))
        return (int(self._cma_why is not None),)

    def _init_control(self, ctrl: Segment, views: list, layout: Layout) -> None:
        self.header = ctrl.data[:HEADER_BYTES].view(np.int64)
        self.peer_header = [v[:HEADER_BYTES].view(np.int64) for v in views]
        rings = layout.rings
        self._out = [None] * self.n
        self._in = [None] * self.n
        for p in self.others:
            self._peers[(p, ctrl.seg_id)] = views[p]   # its staging pool is read there
            self._out[p] = Outgoing(ring_view(ctrl.data[rings + p * RING_BYTES:]))
            self._in[p] = Incoming(ring_view(views[p][rings + self.me * RING_BYTES:]))
        self._windows = [[v[at:][:region_bytes(capacity)] for v in views]
                         for at, capacity in zip(layout.window_at, layout.capacities)]
        self.node.mark = lambda count: self.header.__setitem__(HANDSHAKES, count)
        self.node.progress = lambda i: int(self.peer_header[i][HANDSHAKES])
        self.header[HANDSHAKES] = self.node.count

    def _init_pool(self, share: int, layout: Layout) -> None:
        self._pool_seg, base = self._pool_segment(share, layout)
        data = self._pool_seg.data
        self._pool_view = memoryview(data) if isinstance(data, np.ndarray) else None   # host pool
        self.pool_share = share
        self.pool = staging.StagingPool(base, share, self.others, self._copy_in) if share else None

    def window_regions(self, slot: int) -> list:
        """One-shot window region ``slot`` (0..WINDOW_SLOTS-1) of every node rank, in node rank
        order (window.py's layout); slot 0 is ``self.window``'s."""
        if not 0 <= slot < WINDOW_SLOTS:
            raise UsageError(f'window_regions got unexpected value for argument "slot" (expected 0 to '
                             f'{WINDOW_SLOTS - 1}, got {slot!r})')
        return self._windows[slot]

    def _window_access(self, node_ranks: list) -> dict:
        """The reader and writer a window's direct algorithms reach peers' memory with (window
        rank -> node rank); neither where this node cannot use CMA."""
        if not self._direct:
            return {}
        pull, push = self._memory.pull, self._memory.push
        # The compiled direct rounds read peers themselves, leaving to ``pull`` the reads that
        # take the detour past slow distances (PeerMemory). Hosts with slow distances (the EPYC)
        # once gave them no pids at all: the Python road cost a 1 MiB all_to_all of 2 ranks
        # 98-117 us against 72-73 compiled, where the arrays (numpy's, 16 bytes into a page on
        # both sides) never needed the detour.
        return dict(reader=lambda r, addr, dst: pull(node_ranks[r], addr, dst),
                    writer=lambda r, addr, src: push(node_ranks[r], addr, src),
                    pids=tuple(self._pids[r] for r in node_ranks), detour=self._memory.bounce,
                    memory=PeerBuffers([self._pids[r] for r in node_ranks]))

    def _make_window(self, regions: list):
        kwargs = dict(aborted=self.aborted_reason, spin=spin_for(self.n), capacity=JOB_CAPACITY,
                      **self._window_access(list(range(self.n))))
        if self._fault is not None and self._fault.phase in ("one_shot", "direct"):
            return _FaultWindow(self.me, regions, fire=self._fire, **kwargs)
        return Window(self.me, regions, **kwargs)

    # ---- segments ------------------------------------------------------------------------------
    def _path(self, node_rank: int, seg_id: int) -> str:
        pid, namespace, token = self._names[node_rank]
        return segments.segment_path(pid, namespace, token, seg_id)

    def _create(self, created_kind: str, mapped_kind: str, sizes: list, phase: str,
                prepare=None, on_mapped=None):
        """Collective over the node: a new segment per rank, mapped by every rank.

        Each rank creates its file at the first of ``sizes`` /dev/shm can hold. Peers open it by
        descriptor where the node allows it (no name left behind at any moment, segments.py),
        else by name until every peer has mapped it. Returns (own Segment, every rank's mapping
        in node-rank order, global ranks whose ``on_mapped`` flag was set), or None when some
        rank found /dev/shm too small for even the last size (every rank returns None alike).
        Other failures raise CommError on every rank.
        """
        if self._by_fd:
            created = self._create_once(created_kind, mapped_kind, sizes, phase, prepare, on_mapped, True)
            if created is not _BY_NAME:
                return created
            self._by_fd = False
            self._say("by name", f"shm transport on rank {self.rank}: the ranks of this node cannot open "
                      f"each other's segments through /proc/<pid>/fd; they share them by name in "
                      f"{segments.SHM_DIR} during setup and allocate, and files of a job killed at that "
                      f"moment stay until the next job of this user starts")
        return self._create_once(created_kind, mapped_kind, sizes, phase, prepare, on_mapped, False)

    def _create_once(self, created_kind, mapped_kind, sizes, phase, prepare, on_mapped, by_fd: bool):
        seg_id = self._next_seg
        self._next_seg += 1
        mine = self._path(self.me, seg_id)
        data, fd, identity, err, nbytes = None, -1, (0, 0), None, 0
        for size in sizes:
            try:
                made = segments.create(mine, size, keep_fd=by_fd)
                data, fd, identity = made if by_fd else (made, -1, (0, 0))
                nbytes = size
                break
            except OSError as e:
                err = e
                if e.errno != errno.ENOSPC:
                    break
        ok = False
        try:
            if data is not None and prepare is not None:
                prepare(data)
            self._fire(phase)
            code = err.errno if data is None and err is not None else 0
            failed, rows = self.node.agree(created_kind, data is None, nbytes, code, fd, *identity)
            if failed:
                if all(rows[self.local[r], 1] == errno.ENOSPC for r in failed):
                    return None
                raise CommError(f"shm transport on rank {self.rank}: could not create shared-memory "
                                f"segments on ranks {failed}" + (f": {mine}: {err}" if data is None else ""))
            views, map_err = [None] * self.n, None
            for i in range(self.n):
                where = f"/proc/{self._pids[i]}/fd/{rows[i, 2]}" if by_fd else self._path(i, seg_id)
                try:
                    if i == self.me:
                        views[i] = data
                    elif by_fd:
                        views[i] = segments.open_by_fd(self._pids[i], int(rows[i, 2]), int(rows[i, 0]),
                                                       (int(rows[i, 3]), int(rows[i, 4])))
                    else:
                        views[i] = segments.open_peer(where, int(rows[i, 0]))
                except OSError as e:
                    map_err = f"cannot map rank {self.ranks[i]}'s segment {where}: {e}"
                    break
            extra = on_mapped(views) if on_mapped is not None and map_err is None else (0,)
            failed, flags = self.node.agree(mapped_kind, map_err is not None, *extra)
            if failed and by_fd:
                return _BY_NAME   # every rank alike: try again by name
            if failed:
                raise CommError(f"shm transport on rank {self.rank}: could not map each other's "
                                f"segments on ranks {failed}" + (f": {map_err}" if map_err else ""))
            ok = True
        finally:   # every peer has mapped it, or the creation failed: neither name nor descriptor is needed
            if fd >= 0:
                os.close(fd)
            segments.unlink_quietly(mine)
            if not ok and not by_fd:   # a peer that died cannot unlink its own
                for i in self.others:
                    segments.unlink_quietly(self._path(i, seg_id))
        return Segment(seg_id, data), views, [self.ranks[i] for i in np.flatnonzero(flags[:, 0])]

    def _register(self, seg: Segment, views: list) -> None:
        with self._lock:
            self._data[seg.seg_id] = seg
            for i in self.others:
                self._peers[(i, seg.seg_id)] = views[i]

    def _space_text(self, what: str, needed: int, instead: str = "") -> str:
        free, total = segments.space()
        return (f"shm transport on rank {self.rank}: /dev/shm is too small for {what}: "
                f"{segments.mib(needed)} needed per rank, {segments.mib(needed * self.n)} for the {self.n} "
                f"ranks of this node, {segments.mib(free)} free of {segments.mib(total)}{instead}; "
                f"{segments.space_advice()}")

    def allocate(self, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """A new array of ``nbytes`` bytes in shared memory, so peers read sends from it in place.

        Collective over the ranks of this node (every one calls it, like DDP building its
        buckets); call it while no collective is in flight. The memory lives until ``close``.
        Where /dev/shm cannot hold it on some rank, every rank of the node returns ordinary
        private memory instead (said once at RINGCOMM_DEBUG=info): slower, never a SIGBUS.
        """
        dtype = np.dtype(dtype)
        if nbytes < 0 or nbytes % dtype.itemsize:
            raise UsageError(f'allocate got unexpected value for argument "nbytes" (expected a '
                             f'non-negative multiple of {dtype.itemsize}, got {nbytes})')
        self._check_usable()
        seg = self._new_data_segment(max(nbytes, 1))
        if seg is None:
            self._say("allocate", self._space_text(f"allocate({nbytes})", nbytes,
                                                   "; using private memory instead, on every rank of the node"))
            return np.zeros(nbytes // dtype.itemsize, dtype)
        return seg.data[:nbytes].view(dtype)

    def owns(self, a) -> bool:
        with self._lock:
            return self._locate(address(a), a.nbytes) is not None

    def _locate(self, addr: int, nbytes: int):
        for seg in self._data.values():
            if seg.contains(addr, nbytes):
                return seg.seg_id, addr - seg.addr
        return None


    # ---- hooks for transports whose data segments are device memory (cuda_ipc) ----------------
    def _direct_reads_blocked(self) -> Optional[str]:
        """Why this rank must not even try CMA; None if it may."""
        return cma.blocked()

    def _host_pool_bytes(self, share: int) -> int:
        """Bytes of the staging pool inside the (host) control segment for ``share`` per peer."""
        return share * len(self.others)

    def _host_pool_share(self, pool_bytes: int, wanted: int) -> int:
        """The share the pool part of the created control segment holds (``wanted`` at most:
        /dev/shm may have made setup settle for less)."""
        return pool_bytes // len(self.others) if self.others else 0

    def _pool_segment(self, share: int, layout: Layout) -> tuple:
        """(segment, offset) where the staging pool starts: after the control part here."""
        return self._control, layout.pool

    def _copy_in(self, off: int, buf) -> None:
        if self._pool_view is not None and type(buf) is np.ndarray and buf.flags.c_contiguous:
            if self._raw_copy and buf.nbytes > copying.PIECE:
                copying.copy_bytes(self._pool_view[off:off + buf.nbytes], buf)
                return
            try:   # through memoryviews: half the cost of numpy's slice, view and assignment
                self._pool_view[off:off + buf.nbytes] = memoryview(buf).cast("B")
                return
            except (TypeError, ValueError):   # a format memoryview cannot cast (complex numbers)
                pass
        self._pool_seg.data[off:off + buf.nbytes] = _bytes(buf)

    def _new_data_segment(self, nbytes: int) -> Optional[Segment]:
        """Collective over the node: a segment for ``allocate``, mapped by every peer; None if
        /dev/shm cannot hold it on some rank."""
        created = self._create("allocate", "allocate mapped", [nbytes], "segment")
        if created is None:
            return None
        seg, views, _ = created
        self._register(seg, views)
        return seg

    def _check_array(self, flat) -> None:
        if not isinstance(flat, np.ndarray):
            raise CommError(f"shm transport on rank {self.rank}: got a {type(flat).__module__}."
                            f"{type(flat).__name__}; host shared memory carries numpy arrays only")

    def _send_outside(self, req: _Send) -> None:
        """Start the MPI send of a payload over MPI (lock held)."""
        self.ledger.sent[req.peer] += 1
        req.mpi = self.comm.Isend(_bytes(req.buf), dest=req.peer, tag=self.payload_tag)

    def _from_host(self, tmp: np.ndarray):
        return tmp

    def _before_publish(self) -> None:
        pass

    def _after_consume(self) -> None:
        pass

    # ---- failure and shutdown ------------------------------------------------------------------
    def _fire(self, phase: str) -> None:
        if self._fault is not None:
            faults.fire(phase, self.rank, self._fault)

    def _say(self, key: str, text: str) -> None:
        """Log ``text`` at info, once per transport and ``key`` (RINGCOMM_DEBUG=info shows it)."""
        if key in self._said:
            return
        self._said.add(key)
        from ...selection.selector import configure_debug_logging
        configure_debug_logging()
        _log.info(text)

    def _check_usable(self) -> None:
        if self._aborted is not None:
            raise PeerAbortedError(self._aborted)
        if self._closed:
            raise CommError(f"shm transport on rank {self.rank} is closed")

    def aborted_reason(self, peer: Optional[int] = None, as_rank: Optional[int] = None) -> Optional[str]:
        """Why waits on node rank ``peer`` (None: on no one peer) must stop, or None. ``as_rank``:
        the peer's rank in the communicator that waits (a sub-communicator: its window's rounds,
        its messages' waits), which the reason names beside its rank in the job: "rank 3" alone,
        said to a communicator of two, named no member of it."""
        if self._aborted is not None:
            return self._aborted
        if peer is None or peer >= len(self.ranks):
            return None
        job_rank = self.ranks[peer]
        name = job_rank if as_rank is None else as_rank
        if peer < len(self.peer_header):
            header = self.peer_header[peer]
            if header[ABORT]:
                return f"{rank_name(name, job_rank)} aborted its {self.name} transport"
            if header[CLOSED]:   # it will post nothing more: waiting out the timeout tells nobody more
                return f"{rank_name(name, job_rank)} has closed its communicator (close())"
        ended = self._peer_ended(peer) if peer < len(self._ended) else None
        if ended and name != job_rank:   # the reason kept names the job rank alone
            return peer_ended(name, self._pids[peer], job_rank)
        return ended or None

    def peer_gone(self, peer: int, as_rank: Optional[int] = None) -> Optional[str]:
        p = self.local.get(peer)
        return None if p is None or p == self.me else self.aborted_reason(p, as_rank)

    def _node_gone(self) -> Optional[str]:
        """Why a handshake of this node's ranks cannot complete: this transport aborted, or a
        peer's process ended (``_ended_now``; known once set-up has exchanged the pids)."""
        why = self._aborted   # once: CUDA IPC's reads a peer's abort notice during set-up
        if why is not None:
            return why
        ended = [why for why in map(self._peer_ended, range(len(self._ended))) if why]
        return "; ".join(ended) if ended else None

    def _peer_ended(self, peer: int) -> Optional[str]:
        return self._ended[peer] or self._ended_now(peer)

    def _ended_now(self, peer: int) -> Optional[str]:
        """Why ``peer``'s process will post nothing more, if it has ended (killed, or gone
        without closing): asked at most every LIFE_CHECK_EVERY seconds. A dead peer otherwise left
        its waiters to their timeout, which says nothing of the death (a send then blamed a recv
        the program had not posted)."""
        start, now = self._starts[peer], time.monotonic()
        if start is None or now < self._life_checked[peer]:
            return None
        self._life_checked[peer] = now + LIFE_CHECK_EVERY
        pid = self._pids[peer]
        if not segments.process_ended(pid, start):
            return None
        self._ended[peer] = peer_ended(self.ranks[peer], pid)
        return self._ended[peer]

    def abort(self, reason: BaseException) -> None:
        self._aborted = f"aborted: {reason}"
        if not self._closed:
            self.header[ABORT] = 1   # peers waiting on this rank are released, not left to time out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.header is not None:
                self.header[CLOSED] = 1
            _UNREAD.extend(req.buf for held in self._inflight for req in held if req.seg in (CMA, BLOCK))
            for req in self._pipes:   # never filled again: its buffer may go
                pipe.retire(req.pipe)
            self._pipes.clear()
            for held in self._inflight:
                held.clear()
            for plain in self._plain:
                plain.clear()
            self._data.clear()
            self._peers.clear()
            self._staged.clear()

    def forget(self) -> None:
        """Once nothing uses this transport (its world and every sub-communicator closed): drop
        its references into the segments, and collect. A segment's pages leave /dev/shm when
        the last view of it goes, and views sit in reference cycles of the communicators that
        used them, which the collector found when it liked: a loop of init and close on a
        64 MiB /dev/shm held four closed communicators' pools, and the fifth init had no room.
        Collecting here (only where /dev/shm has room for fewer than three more such
        transports: a collection takes 70 ms in a process that imported torch) returns the pages
        of every communicator the caller has dropped; one it still holds keeps them until it
        goes."""
        self.close()
        held = self.n * (self._control.nbytes if self._control is not None else 0)
        with self._lock:
            self.window = self._control = self._pool_seg = self._pool_view = self.pool = None
            self.header, self.peer_header, self._windows = None, [], []
            self._out, self._in = [None] * self.n, [None] * self.n
            self._data.clear()
            self._peers.clear()
        free, _ = segments.space()
        if free is not None and free < 3 * held:
            gc.collect()

    def describe(self) -> dict:
        return {r: self.name for r in self.ranks if r != self.rank}

    # ---- sub-communicators -------------------------------------------------------------------------
    def reserve_window_slots(self) -> int:
        """Bit mask of the window slots no communicator of this rank uses (slot 0 is the job's)
        and no other split in flight has offered; they stay offered until
        ``release_window_slots``. Two threads splitting two communicators at once (one dup per
        thread) must offer disjoint slots: offering the same free ones, both splits picked the
        same slot, and their one-shot rounds read each other's payloads.

        A slot a closed communicator of this rank had is offered again once no member of that
        communicator still has it open (``release_window``): a peer that has not closed it may
        still be reading this rank's last round there (no later round of that window tells this
        rank it is done). Slots were never offered again before: the eighth communicator made
        and closed on a rank had no window, and its 1 KiB all-reduce ran recursive doubling."""
        with self._lock:
            free = sum(1 << s for s in range(1, WINDOW_SLOTS)
                       if s not in self._slots_used and not self._slots_offered >> s & 1 and self._quiet(s))
            self._slots_offered |= free
        return free

    def _quiet(self, slot: int) -> bool:
        """Whether every peer of this rank's last window on ``slot`` has closed that window."""
        last = self._slot_last.get(slot)
        if last is None:
            return True
        context, node_ranks = last
        regions = self._windows[slot]
        return all(window_owner(regions[r]) != context for r in node_ranks)

    def window_rounds(self, offered: int) -> int:
        """The highest round this rank's regions of the ``offered`` slots show: a window made on
        one of them counts its rounds from past every member's (subcommunicators.py)."""
        rounds = [window_round(self._windows[s][self.me]) for s in range(1, WINDOW_SLOTS) if offered >> s & 1]
        return max(rounds, default=0)

    def release_window(self, context: int) -> None:
        """The view ``context`` closed: its window's slot is this rank's to offer again once every
        peer of that window has closed it too (``reserve_window_slots``)."""
        with self._lock:
            slot = self._slot_of.pop(context, None)
            if slot is not None and not self._closed:
                self._slots_used.discard(slot)
                close_window_owner(self._windows[slot][self.me], context)

    def release_window_slots(self, offered: int) -> None:
        """The split that reserved ``offered`` is decided: the slot it took is used now
        (``window_of``), the rest free again."""
        with self._lock:
            self._slots_offered &= ~offered

    def split(self, members, color, key, context, slot=None):
        """A view for a sub-communicator: its own tags over these rings and segments, and its own
        window (slot ``slot``, which every member agreed is free) when all members are here."""
        if members is None:
            return None
        from ..view import TransportView
        return TransportView(self, members, context, self.window_of(members, slot, context))

    def window_of(self, members: list, slot: Optional[WindowSlot], context: int):
        """The one-shot window ``slot`` over ``members`` (global ranks, in their communicator's
        order) for the view ``context``, or None when there is no slot or a member is not on
        this node. Its rounds count from ``slot.start``: a reused slot's regions still show the
        last rounds of the window before."""
        if slot is None or slot.index <= 0 or not all(m in self.local for m in members):
            return None
        regions = self.window_regions(slot.index)
        node_ranks = [self.local[m] for m in members]
        with self._lock:
            self._slots_used.add(slot.index)
            self._slot_of[context] = slot.index
            self._slot_last[slot.index] = (context, [r for r in node_ranks if r != self.me])
            set_window_owner(regions[self.me], context)
        mine = [regions[r] for r in node_ranks]
        aborted = watching_closes(mine, context, members, lambda peer: self.aborted_reason(node_ranks[peer], peer))
        return Window(members.index(self.rank), mine, aborted=aborted, spin=spin_for(self.n), start=slot.start,
                      **self._window_access(node_ranks))

