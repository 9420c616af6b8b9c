"""CUDA IPC transport: ranks sharing a node (or one GPU) reduce straight out of each other's
device memory.

The same descriptor protocol as the host shm transport (see shm.py: slots in a host
shared-memory control segment, PUB/ACK flags, ordinals per tag), with device segments instead of
/dev/shm files. Each rank allocates its segments with cudaMalloc (not cupy's pool, whose blocks
are sub-allocated and cannot be exported one by one), exports them with cudaIpcGetMemHandle, and
the node exchanges the handles over MPI once per segment; each peer opens every handle once
(cudaIpcOpenMemHandle) and caches the mapping until the segment is released. A receive copies or
reduces from the peer's mapping with a cupy kernel on the receiver's current stream.

Ordering: the caller's kernels are ordered before the collective's by the stream the job runs
on (core/streams.py: it waits for an event recorded on the caller's stream at the call); every
kernel here (copies into the pool, copies and reductions out of peers' memory) runs on that
stream, the current stream of the job's thread. Across processes, stream synchronisation needs
no extra IPC objects:
- a sender synchronises its stream before publishing a descriptor, so the payload (the staged
  copy, or a reduction made in an earlier step) is complete in device memory;
- a receiver synchronises its stream after its copy/reduce kernel and only then acknowledges,
  so the sender cannot overwrite data still being read.
The host flags themselves follow shm.py's memory-ordering argument (x86 TSO). shm.py's direct
reads of a peer's private memory (CMA) are off here: the payload is always in device segments.

Sends from device memory outside every registered segment are copied into the rank's staging
pool, which here is a device segment (shm/staging.py decides when a send waits for room); a
payload that goes over MPI (larger than a pool share, or no room) is bounced through host memory,
since MPI here is not CUDA-aware. ``carried()`` counts the bytes received each way, so a check
can tell what actually carried a collective. cupy is imported lazily: importing this module never
needs a GPU.

Release (``close``, and a setup that fails after some peer opened a handle): CUDA leaves freeing
memory that another process still has mapped undefined, so each rank first synchronises and
closes its mappings of peers' memory, the node agrees that all have, and only then does each
rank free its own. If the agreement fails (a peer is gone or stuck), the memory is not freed:
the driver reclaims it when the process exits.
"""
from __future__ import annotations

import numpy as np

from ..core.schedule import DEVICE_SEGMENT_BYTES
from ..errors import CommError
from .devices import cupy_module, is_device_array
from .shm import Segment, ShmTransport, staging

_LAZY_PEER_ACCESS = 1   # cudaIpcMemLazyEnablePeerAccess
# The device staging pool: room for four schedule segments (16 MiB each: core/schedule.py) in
# flight to each peer, so that a collective's payload does not overflow through host memory
# (device memory is less scarce than a container's /dev/shm). Two were not enough: a two-lane
# algorithm (hierarchical_tree) then overflowed 16-32 MiB of a 72 MiB all_reduce through host in
# 9 of 12 runs on a loaded machine (the stand-in). At most DEVICE_POOL_CAP per rank: up to 8 peers
# get four segments, up to 16 two.
DEVICE_SHARE_BYTES = 4 * DEVICE_SEGMENT_BYTES
DEVICE_POOL_CAP = 32 * DEVICE_SEGMENT_BYTES


def _device_view(cupy, ptr: int, nbytes: int, owner):
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))


class CudaIpcTransport(ShmTransport):
    name = "cuda_ipc"
    payload_tag = 8   # it shares the node communicator with the host shm transport

    def __init__(self, node_comm, ranks, *, world_rank: int, world_size: int,
                 setup_timeout: float = 300.0, setup_aborted=None, timeout=None, ledger=None):
        """``setup_timeout`` and ``setup_aborted()`` (a reason, or None) bound the setup, which
        runs inside the first CUDA collective (routed.py); ``timeout`` bounds later handshakes."""
        self.cupy = cupy_module()
        self.device = self.cupy.cuda.runtime.getDevice()   # the job's device (core/streams.py)
        self._malloced: dict = {}   # seg_id -> device pointer this rank allocated
        self._opened: dict = {}     # (node rank, seg_id) -> device pointer opened from a handle
        self._bytes = {"device": 0, "host": 0}
        self._setup_aborted = setup_aborted
        try:
            super().__init__(node_comm, ranks, world_rank=world_rank, world_size=world_size,
                             setup_timeout=setup_timeout, ledger=ledger)
        finally:
            self._setup_aborted = None
        self.node.timeout = setup_timeout if timeout is None else timeout
        self.window = None   # the window is host memory; device arrays never use it

    # ShmTransport's handshakes give up when ``_aborted`` is set; during setup a peer's abort
    # notice (which the communicator reads) counts too.
    @property
    def _aborted(self):
        return self.__dict__.get("_aborted_reason") or (self._setup_aborted() if self._setup_aborted else None)

    @_aborted.setter
    def _aborted(self, reason) -> None:
        self.__dict__["_aborted_reason"] = reason

    _host_memory = False   # pipes' and copies' C loops copy host memory; device sends take the device pool

    def _direct_reads_blocked(self) -> str:
        return "device memory: process_vm_readv reads host memory only"

    # ---- device segments ---------------------------------------------------------------------
    def _choose_share(self, free, layout) -> tuple:
        share = staging.share_size(self.n - 1, DEVICE_SHARE_BYTES, None, DEVICE_POOL_CAP)
        return share, share   # device memory: /dev/shm's free space does not limit it

    def _host_pool_bytes(self, share: int) -> int:
        return 0   # the pool is device memory (_pool_segment), not part of the host control segment

    def _host_pool_share(self, pool_bytes: int, wanted: int) -> int:
        return wanted   # device memory: the whole share, in its own segment

    def _pool_segment(self, share: int, layout) -> tuple:
        if not share:
            return None, 0
        seg = self._new_data_segment(share * len(self.others), register=False)
        return seg, 0

    def _new_data_segment(self, nbytes: int, register: bool = True) -> Segment:
        rt = self.cupy.cuda.runtime
        seg_id = self._next_seg
        self._next_seg += 1
        ptr, handle, err = 0, b"", None
        try:
            ptr = rt.malloc(nbytes)
            handle = bytes(rt.ipcGetMemHandle(ptr))
        except Exception as e:  # CUDARuntimeError: out of memory, IPC unsupported, ...
            err = f"cannot export {nbytes} device bytes: {e}"
        words = np.frombuffer(handle.ljust(64, b"\0")[:64], np.int64)   # a handle is 64 bytes
        failed, rows = self.node.agree("device segment", err is not None, *words.tolist())
        if failed:   # nobody opened anything yet: free at once
            if ptr:
                rt.free(ptr)
            raise self._setup_failed(failed, err)
        opened = {}
        for i in self.others:
            try:
                opened[i] = rt.ipcOpenMemHandle(rows[i].astype(np.int64).tobytes(), _LAZY_PEER_ACCESS)
            except Exception as e:
                err = f"cannot open the IPC handle of rank {self.ranks[i]}: {e}"
                break
        failed, _ = self.node.agree("device segment opened", err is not None)
        if failed:   # some peers opened this rank's memory: they close first (module doc)
            self._free_after_peers(list(opened.values()), [ptr])
            raise self._setup_failed(failed, err)
        self._malloced[seg_id] = ptr
        seg = Segment(seg_id, _device_view(self.cupy, ptr, nbytes, self))
        views = [None] * self.n
        for i, p in opened.items():
            self._opened[(i, seg_id)] = p
            views[i] = _device_view(self.cupy, p, nbytes, self)
        if register:
            self._register(seg, views)
        else:   # the staging pool: peers read it, this rank's sends never come from it
            with self._lock:
                for i in self.others:
                    self._peers[(i, seg_id)] = views[i]
        return seg

    def _setup_failed(self, failed: list, err) -> CommError:
        return CommError(f"cuda_ipc transport on rank {self.rank}: could not set up device segments on "
                         f"ranks {failed}" + (f": {err}" if err else ""))

    def _check_array(self, flat) -> None:
        if not is_device_array(flat):
            raise CommError(f"cuda_ipc transport on rank {self.rank}: got a {type(flat).__name__}; "
                            f"it carries cupy (CUDA) arrays only")
        if flat.device.id != self.device:
            raise CommError(f"cuda_ipc transport on rank {self.rank}: got an array on cuda:{flat.device.id}; "
                            f"its device memory is on cuda:{self.device}")

    def _send_outside(self, req) -> None:
        """MPI here reads host memory only: bounce the payload through a host copy."""
        req.keep = self.cupy.asnumpy(req.buf.reshape(-1).view(self.cupy.uint8))
        self.ledger.sent[req.peer] += 1
        req.mpi = self.comm.Isend(req.keep, dest=req.peer, tag=self.payload_tag)

    def _from_host(self, tmp):
        self._bytes["host"] += tmp.nbytes
        return self.cupy.asarray(tmp)

    def _move(self, req) -> bool:
        done = super()._move(req)   # always True here: no pipes on device memory (_host_memory)
        if req.seg >= 0:   # read in place from a peer's device segment (not empty, not over MPI)
            self._bytes["device"] += req.nbytes
        return done

    def carried(self) -> dict:
        """Bytes received so far: {"device": read from peers' device memory, "host": through host memory}."""
        return dict(self._bytes)

    def _before_publish(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def _after_consume(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def _free_after_peers(self, opened: list, owned: list) -> bool:
        """Close ``opened`` mappings, agree with the node that every rank has, then free ``owned``
        (module doc). False if the agreement failed and the memory was left to process exit."""
        rt = self.cupy.cuda.runtime
        with self.cupy.cuda.Device(self.device):
            self.cupy.cuda.Device().synchronize()   # no kernel of ours still reads a peer's memory
            for p in opened:
                rt.ipcCloseMemHandle(p)
            try:
                failed, _ = self.node.agree("device segment released", False)
            except CommError:
                return False
            if failed:
                return False
            for ptr in owned:
                if ptr:
                    rt.free(ptr)
        return True

    def close(self) -> None:
        """Collective over the node (module doc); a later close does nothing."""
        if self._closed:
            return
        opened, owned = list(self._opened.values()), list(self._malloced.values())
        self._opened.clear()
        self._malloced.clear()
        super().close()
        try:
            self._free_after_peers(opened, owned)
        except Exception:   # a dead context at interpreter exit: the driver reclaims it all
            pass
