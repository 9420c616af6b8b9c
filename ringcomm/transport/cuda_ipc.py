"""CUDA IPC transport: ranks sharing a node (or one GPU) reduce straight out of each other's
device memory.

The same descriptor protocol as the host shm transport (see shm.py: slots in a host
shared-memory control segment, PUB/ACK flags, ordinals per tag), with device segments instead of
/dev/shm files. Each rank allocates its segments with cudaMalloc (not cupy's pool, whose blocks
are sub-allocated and cannot be exported one by one), exports them with cudaIpcGetMemHandle, and
the node exchanges the handles over MPI once per segment; each peer opens every handle once
(cudaIpcOpenMemHandle) and caches the mapping until the segment is released. A receive copies or
reduces from the peer's mapping with a cupy kernel on the receiver's current stream.

Ordering across processes uses stream synchronisation, which needs no extra IPC objects:
- ``stage`` synchronises the device once, so kernels the caller queued (e.g. the backward pass
  on torch's stream) have finished before peers may read the work array;
- a sender synchronises its stream before publishing a descriptor, so the payload (the staged
  copy, or a reduction made in an earlier step) is complete in device memory;
- a receiver synchronises its stream after its copy/reduce kernel and only then acknowledges,
  so the sender cannot overwrite data still being read.
The host flags themselves follow shm.py's memory-ordering argument (x86 TSO). shm.py's direct
reads of a peer's private memory (CMA) are off here: the payload is always in device segments.

Sends from device memory outside every registered segment are copied into the rank's staging
pool, which here is a device segment (shm/staging.py decides when a send waits for room); a
payload that goes over MPI (larger than a pool share, or no room) is bounced through host memory,
since MPI here is not CUDA-aware. cupy is imported lazily: importing this module never needs a GPU.
"""
from __future__ import annotations

import numpy as np

from ..errors import CommError
from .shm import Segment, ShmTransport, staging

_LAZY_PEER_ACCESS = 1   # cudaIpcMemLazyEnablePeerAccess


def cupy_module():
    """The cupy module, or CommError saying why CUDA IPC cannot run here."""
    try:
        import cupy
    except ImportError as err:
        raise CommError(f"CUDA IPC needs cupy (pip install cupy-cuda12x): {err}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:   # cupy raises CUDARuntimeError without a driver
        raise CommError(f"CUDA IPC needs a CUDA device: {err}") from None
    if count < 1:
        raise CommError("CUDA IPC needs a CUDA device: none found")
    return cupy


def is_device_array(a) -> bool:
    """True for cupy arrays, without importing cupy."""
    return type(a).__module__.startswith("cupy")


def _device_view(cupy, ptr: int, nbytes: int, owner):
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))


class CudaIpcTransport(ShmTransport):
    name = "cuda_ipc"
    payload_tag = 8   # it shares the node communicator with the host shm transport

    def __init__(self, node_comm, ranks, *, world_rank: int, world_size: int,
                 setup_timeout: float = 300.0):
        self.cupy = cupy_module()
        self._malloced: dict = {}   # seg_id -> device pointer this rank allocated
        self._opened: dict = {}     # (node rank, seg_id) -> device pointer opened from a handle
        super().__init__(node_comm, ranks, world_rank=world_rank, world_size=world_size,
                         setup_timeout=setup_timeout)
        self.window = None   # the window is host memory; device arrays never use it

    def _direct_reads_blocked(self) -> str:
        return "device memory: process_vm_readv reads host memory only"

    # ---- device segments ---------------------------------------------------------------------
    def _choose_share(self, free, layout) -> tuple:
        share = staging.share_size(self.n - 1, staging.SHARE_BYTES, None, staging.POOL_CAP)
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
        opened = {}
        if not failed:
            for i in self.others:
                try:
                    opened[i] = rt.ipcOpenMemHandle(rows[i].astype(np.int64).tobytes(), _LAZY_PEER_ACCESS)
                except Exception as e:
                    err = f"cannot open the IPC handle of rank {self.ranks[i]}: {e}"
                    break
            failed, _ = self.node.agree("device segment opened", err is not None)
        if failed:
            for p in opened.values():
                rt.ipcCloseMemHandle(p)
            if ptr:
                rt.free(ptr)
            raise CommError(f"cuda_ipc transport on rank {self.rank}: could not set up device "
                            f"segments on ranks {failed}" + (f": {err}" if err else ""))
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

    def _check_array(self, flat) -> None:
        if not is_device_array(flat):
            raise CommError(f"cuda_ipc transport on rank {self.rank}: got a {type(flat).__name__}; "
                            f"it carries cupy (CUDA) arrays only")
        if flat.nbytes:
            self.cupy.cuda.Device().synchronize()   # the caller's kernels finish before peers read

    def _send_outside(self, req) -> None:
        """MPI here reads host memory only: bounce the payload through a host copy."""
        req.keep = self.cupy.asnumpy(req.buf.reshape(-1).view(self.cupy.uint8))
        req.mpi = self.comm.Isend(req.keep, dest=req.peer, tag=self.payload_tag)

    def _from_host(self, tmp):
        return self.cupy.asarray(tmp)

    def _before_publish(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def _after_consume(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def close(self) -> None:
        if self._closed:
            return
        rt = self.cupy.cuda.runtime
        try:
            self.cupy.cuda.Device().synchronize()
            for p in self._opened.values():
                rt.ipcCloseMemHandle(p)
            self._opened.clear()
            super().close()
            for ptr in self._malloced.values():
                rt.free(ptr)
            self._malloced.clear()
        except Exception:   # a dead context at interpreter exit: the driver reclaims it all
            self._closed = True
