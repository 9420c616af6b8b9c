"""What benchmarks/gpu_check.py's checks share: the context every rank runs in, the runner that
prints one line per check, and the checks of the one-rank job (the N-rank ones: gpu_check_ranks.py).

Every rank runs every check; rank 0 prints "STATUS name: detail", where STATUS is PASS (every
rank passed), FAIL (a rank raised: its error and where), SKIP (the check cannot run here: why) or
ENV (the machine cannot do CUDA IPC at all: an environment failure, not a ringcomm defect). A check
that needs what this machine lacks is skipped, never faked: CUDA tensors need a CUDA build of torch,
NCCL one GPU per rank, a bitwise device/host comparison of bf16 a torch CUDA tensor (cupy has no bf16).

With the cupy stand-in (tests/stand_ins, ``cupy.IS_STAND_IN``) the same checks exercise ringcomm's
CUDA code paths on a CPU, and the stand-in's record of undefined behaviour (a missing stream
ordering, memory freed while a peer has it mapped) fails the check it happened in. That proves the
code paths, not a GPU: timings are skipped there.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# name -> what it checks (gpu_check.py prints these as SKIP lines where there is no GPU)
RANK_CHECKS = {
    "cupy-ipc": "raw cupy IPC between the ranks (cudaIpcGetMemHandle/OpenMemHandle), without ringcomm",
    "grid": "every collective x algorithm x dtype on device memory, bitwise equal to the host path",
    "device-only": "an all_reduce on CUDA IPC reads peers' device memory only, never host memory",
    "async": "async collectives in flight at once, waited out of order",
    "split": "device collectives on comm.split() and comm.dup(), CUDA IPC among their members",
    "streams": "the caller's side stream is waited for, results visible on another stream",
    "memory": "staging pool larger than one share, device memory back to baseline after close",
    "p2p-first": "a device send before any device collective, received by one rank: through host, no handshake",
    "validation": "mixed devices and host-only algorithms refused before a sequence number is taken",
    "mpi-refusal": "backend 'mpi' refuses device memory with a UsageError naming the backends that take it",
    "fault": "count mismatch and a peer's abort on device collectives: errors with the reason, in seconds",
    "ddp": "ringcomm DDP buckets on the device (CUDA model on torch CUDA builds)",
    "torch-ddp": "torch's DDP over the 'ringcomm' backend on a CUDA model",
    "time-64MiB": "64 MiB float32 all_reduce against a device-local add of the same size",
}
SINGLE_CHECKS = {
    "nccl-1rank": "backend 'nccl' at 1 rank on CUDA tensors and cupy arrays, in place",
    "gloo-1rank": "backend 'gloo' at 1 rank on CUDA tensors (all_reduce, broadcast), others refused",
}


class Skip(Exception):
    """The check cannot run on this machine; the text says why."""


class Environment(Exception):
    """The machine cannot do what the check needs (CUDA IPC itself failed): not ringcomm's fault."""


class Ctx:
    """What every check gets: MPI, cupy, this rank's device, a ringcomm communicator."""

    def __init__(self, args):
        from mpi4py import MPI
        import cupy
        self.args, self.MPI, self.cupy = args, MPI, cupy
        self.world = MPI.COMM_WORLD
        self.report = self.world.Dup()   # outcomes only: a check that failed midway cannot pair with them
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.stand_in = bool(getattr(cupy, "IS_STAND_IN", False))
        local = self.world.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = local.Get_rank()
        local.Free()
        self.devices = cupy.cuda.runtime.getDeviceCount()
        self.device = self.local_rank % self.devices
        cupy.cuda.Device(self.device).use()
        self.torch = _torch_cuda()
        if self.torch is not None:
            self.torch.cuda.set_device(self.device)
        self.ipc_ok = True
        self._comm = None

    @property
    def comm(self):
        """A ringcomm communicator; a new one after a check left the last one broken."""
        import ringcomm
        if self._comm is None or self._comm._broken is not None or self._comm._closed:
            self._comm = ringcomm.init()
        return self._comm

    def close(self) -> None:
        if self._comm is not None and self._comm._broken is None:
            self._comm.close()
        self._comm = None

    def fresh(self, backend=None):
        import ringcomm
        return ringcomm.init(backend)

    def device_name(self) -> str:
        if self.stand_in:
            return f"cupy stand-in ({self.devices} pretend devices)"
        props = self.cupy.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def on_device(self, host: np.ndarray):
        """A device copy of ``host``, complete (the copy is synchronised)."""
        a = self.cupy.asarray(host)
        self.cupy.cuda.get_current_stream().synchronize()
        return a


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def run(ctx: Ctx, checks: dict) -> int:
    """Run ``checks`` (name -> function) on every rank; rank 0 prints a line each. Returns the
    number of failed checks."""
    failed = 0
    for name, fn in checks.items():
        t0 = time.monotonic()
        status, detail = _outcome(ctx, fn)
        every = ctx.report.allgather((status, detail, ctx.rank))
        status, detail = _combine(every)
        failed += status == "FAIL"
        if ctx.rank == 0:
            took = f" [{time.monotonic() - t0:.1f} s]" if status in ("PASS", "FAIL") else ""
            print(f"{status} {name}: {detail}{took}", flush=True)
    return failed


def _outcome(ctx: Ctx, fn) -> tuple:
    stand_in = ctx.cupy.stand_in if ctx.stand_in else None
    try:
        detail = fn(ctx)
        status = "PASS"
    except Skip as why:
        status, detail = "SKIP", str(why)
    except Environment as why:
        status, detail = "ENV", str(why)
    except Exception as err:   # the check failed on this rank: say where
        frames = traceback.extract_tb(err.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames)
                      if Path(f.filename).resolve().parent == HERE), "?")
        status, detail = "FAIL", f"rank {ctx.rank} ({where}): {type(err).__name__}: {err}"
    if stand_in is not None:
        left = stand_in.take_violations()   # undefined behaviour the stand-in saw, even if swallowed
        if left and status != "FAIL":
            status, detail = "FAIL", f"rank {ctx.rank}: the cupy stand-in recorded: {left[0]}"
    return status, detail


def _combine(every: list) -> tuple:
    for wanted in ("FAIL", "ENV", "SKIP"):
        hits = [(d, r) for s, d, r in every if s == wanted]
        if hits:
            return wanted, hits[0][0]
    return "PASS", every[0][1]




# ---- the one-rank job: the reference backends on CUDA tensors (NCCL needs a GPU per rank) ------
def _cuda_tensors(ctx):
    if ctx.torch is None:
        raise Skip("torch here has no CUDA (a CPU build, or no driver): no CUDA tensors to hand a torch backend")
    return ctx.torch


def check_nccl(ctx) -> str:
    torch = _cuda_tensors(ctx)
    from ringcomm.backends.nccl import unavailable_reason
    why = unavailable_reason()
    if why:
        raise Skip(why)
    comm = ctx.fresh("nccl")
    try:
        t = torch.arange(1000, dtype=torch.float32, device="cuda")
        comm.all_reduce(t, op="avg")
        b = torch.full((77,), 3, dtype=torch.bfloat16, device="cuda")
        comm.broadcast(b, root=0)
        a = ctx.on_device(np.arange(513, dtype=np.float64))
        ptr = a.data.ptr
        comm.all_reduce(a)
        assert t.is_cuda and bool((t == torch.arange(1000, device="cuda")).all()), "nccl all_reduce of a CUDA tensor"
        assert bool((b == 3).all()), "nccl broadcast of a bf16 CUDA tensor"
        assert a.data.ptr == ptr and bool((a == ctx.cupy.arange(513)).all()), "nccl all_reduce of a cupy array"
    finally:
        comm.close()
    return "all_reduce (fp32 avg, cupy fp64) and broadcast (bf16) in place on the device, through DLPack"


def check_gloo(ctx) -> str:
    torch = _cuda_tensors(ctx)
    import ringcomm
    comm = ctx.fresh("gloo")
    try:
        t = torch.arange(1000, dtype=torch.float32, device="cuda")
        comm.all_reduce(t)
        comm.broadcast(t, root=0)
        assert t.is_cuda and bool((t == torch.arange(1000, device="cuda")).all()), "gloo all_reduce of a CUDA tensor"
        try:
            comm.reduce_scatter(torch.zeros(10, device="cuda"), torch.ones(10, device="cuda"))
        except ringcomm.UsageError as err:
            assert "all_reduce and broadcast" in str(err), str(err)
        else:
            raise AssertionError("gloo took a reduce_scatter of CUDA tensors")
    finally:
        comm.close()
    return "all_reduce and broadcast of CUDA tensors through DLPack; reduce_scatter refused by name"


SINGLE = {"nccl-1rank": check_nccl, "gloo-1rank": check_gloo}
