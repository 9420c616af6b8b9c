"""Two ranks, the cupy stand-in, CUDA IPC: correct use passes, each misuse is caught.

Rank 0 owns a runtime.malloc'd segment and exports it; rank 1 opens the handle. Run by
tests/test_stand_in_cupy.py with the stand-in forced first on PYTHONPATH. Prints
"PASS stand-in IPC" on rank 0 when every scenario behaved.
"""
import os
import sys

import numpy as np
import shm_guard  # noqa: F401  (an uncaught error on one rank aborts the whole job)
from mpi4py import MPI

import cupy
from cupy.cuda import runtime

assert getattr(cupy, "IS_STAND_IN", False), "this job checks the stand-in, not a real cupy"
CUDARuntimeError, StandInViolation = runtime.CUDARuntimeError, cupy.stand_in.StandInViolation

world = MPI.COMM_WORLD
rank = world.Get_rank()
assert world.Get_size() == 2, "run with mpirun -n 2"
N = 1024


def log(*a):
    if rank == 0:
        print(*a, flush=True)


def expect_violation(fn, *needles):
    """``fn`` must raise StandInViolation whose text has every needle; the record is taken."""
    try:
        fn()
    except StandInViolation as err:
        text = str(err)
    else:
        raise AssertionError(f"rank {rank}: no violation from {fn}")
    for needle in needles:
        assert needle in text, f"rank {rank}: {needle!r} not in: {text}"
    taken = cupy.stand_in.take_violations()
    assert taken and taken[-1] == text, taken
    return text


def expect_cuda_error(fn, prefix):
    try:
        fn()
    except CUDARuntimeError as err:
        assert str(err).startswith(prefix), err
    else:
        raise AssertionError(f"rank {rank}: no {prefix} from {fn}")


def over(ptr, owner):
    mem = cupy.cuda.UnownedMemory(ptr, N * 4, owner)
    return cupy.ndarray((N,), cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))


pids = world.allgather(os.getpid())
stream = cupy.cuda.Stream(non_blocking=True)
ptr = runtime.malloc(N * 4) if rank == 0 else 0
handle = world.bcast(runtime.ipcGetMemHandle(ptr) if rank == 0 else None, root=0)
assert isinstance(handle, bytes) and len(handle) == 64

# 0. A process cannot open its own handle; another device cannot map it without peer access.
if rank == 0:
    expect_cuda_error(lambda: runtime.ipcOpenMemHandle(handle), "cudaErrorDeviceUninitialized: invalid device context")
else:
    with cupy.cuda.Device(1):   # device 0's memory, without peer access
        expect_cuda_error(lambda: runtime.ipcOpenMemHandle(handle), "cudaErrorPeerAccessUnsupported")
peer = runtime.ipcOpenMemHandle(handle) if rank == 1 else 0
a = over(ptr if rank == 0 else peer, None)
log("ok own handle refused, cross-device mapping refused")

# 1. The right way: write, synchronise, publish; read, synchronise, acknowledge.
cupy.stand_in.reset_host_copies()
if rank == 0:
    with stream:
        a.fill(3.0)
    stream.synchronize()
world.barrier()                                   # "published"
if rank == 1:
    mine = cupy.empty(N, cupy.float32)
    with stream:
        np.multiply(a, 2, out=mine)               # reads the peer's memory in place
        a[:N // 2] = mine[:N // 2]                # and writes a reply into it
    stream.synchronize()
    copies = cupy.stand_in.host_copies()
    assert copies["to_host_calls"] == 0 and copies["to_device_calls"] == 0, copies
    assert (mine.get() == 6.0).all()
world.barrier()                                   # "acknowledged"
if rank == 0:
    got = a.get()
    assert (got[:N // 2] == 6.0).all() and (got[N // 2:] == 3.0).all(), got
log("ok round trip with synchronisation (no host copies on the reader)")

# 2. Publishing before synchronising: the reader's kernel and its host copy are both caught.
if rank == 0:
    with stream:
        a.fill(7.0)                               # no stream.synchronize() before the barrier
world.barrier()
if rank == 1:
    expect_violation(lambda: cupy.asnumpy(a), f"process {pids[0]}", "pending write",
                     "must synchronise that stream")
    with stream:
        expect_violation(lambda: a + 1, "cupy.add", f"process {pids[0]}")
world.barrier()
if rank == 0:
    stream.synchronize()
world.barrier()
if rank == 1:
    assert (a.get() == 7.0).all()                 # after the writer's sync: fine
log("ok reads of unsynchronised peer writes caught (kernel and host copy)")

# 3. Acknowledging a read before synchronising it: the owner's next write is caught.
if rank == 1:
    with stream:
        mine = a * 1                              # a read of the peer's memory, pending
world.barrier()                                   # "acknowledged" too early
if rank == 0:
    with stream:
        expect_violation(lambda: a.fill(0.0), "pending read", f"process {pids[1]}")
world.barrier()
if rank == 1:
    stream.synchronize()
world.barrier()
if rank == 0:
    with stream:
        a.fill(0.0)
    stream.synchronize()
world.barrier()
log("ok overwrite of memory a peer still reads caught")

# 4. Closing a mapping with launches on it not synchronised.
if rank == 1:
    with stream:
        a.fill(1.0)
    expect_violation(lambda: runtime.ipcCloseMemHandle(peer), "ipcCloseMemHandle", "synchronise first")
    peer = runtime.ipcOpenMemHandle(handle)
    a = over(peer, None)
world.barrier()
log("ok close with unsynchronised launches caught")

# 5. Freeing while the peer still has it open: caught at the owner, and at the peer's next use.
world.barrier()
if rank == 0:
    expect_violation(lambda: runtime.free(ptr), "freed", f"[{pids[1]}]", "undefined behaviour")
world.barrier()
if rank == 1:
    expect_violation(lambda: a.fill(2.0), "freed by its owner")
    runtime.ipcCloseMemHandle(peer)
world.barrier()
log("ok free while the peer has it open caught, at both ends")

# 6. The right order: peer closes first, then the owner frees.
ptr = runtime.malloc(N * 4) if rank == 0 else 0
handle = world.bcast(runtime.ipcGetMemHandle(ptr) if rank == 0 else None, root=0)
if rank == 1:
    runtime.ipcCloseMemHandle(runtime.ipcOpenMemHandle(handle))
world.barrier()
if rank == 0:
    runtime.free(ptr)
    assert cupy.stand_in.live_allocations("malloc") == []
log("ok free after the peer closed")

# 7. A device array handed to MPI is refused before anything is sent.
if rank == 0:
    expect_violation(lambda: world.Send(cupy.zeros(4, cupy.float32), dest=1), "__dlpack__", "CUDA-aware")
world.barrier()
log("ok device array refused by MPI")

assert cupy.stand_in.violations() == [], cupy.stand_in.violations()
assert cupy.stand_in.live_allocations("ipc") == []
log("PASS stand-in IPC")
sys.stdout.flush()
