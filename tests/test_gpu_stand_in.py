"""ringcomm's CUDA code paths on the cupy stand-in (tests/stand_ins): what issue 12 fixed.

Two kinds of test:
- benchmarks/gpu_check.py --stand-in under mpirun -n 2 and -n 3 (ranks on pretend devices 0, 1,
  2): the GPU acceptance's own checks, one test per check, named for the defect it guards;
- in-process tests of what needs no second process (validation, the device scope of a job on
  the progress thread, the bf16 kernel, the reference backends' hand-over to torch).

The stand-in proves code paths and catches misuse (a missing stream ordering, memory freed
while a peer maps it, a device pointer handed to host code); it proves nothing about a GPU.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cupy_stand_in
from mpi_util import mpi_env, mpirun_path
import ringcomm
from ringcomm.core.buffers import as_buffer
from ringcomm.core.ops import DTYPES, ReduceOp, reducer
from ringcomm.selection.selector import Selector
from ringcomm.testing import run_threads

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "gpu_check.py"


# ---- the acceptance checks on the stand-in, 2 and 3 ranks ----------------------------------------
@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def stand_in_run(request):
    """One run of gpu_check.py --stand-in; {check name: (status, detail)} and the whole output."""
    proc = subprocess.run([sys.executable, str(CHECK), "--stand-in", "--ranks", str(request.param)],
                          capture_output=True, text=True, timeout=280, cwd=ROOT)
    lines = {}
    for line in proc.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("PASS", "FAIL", "SKIP", "ENV"):
            name, _, detail = rest.partition(": ")
            lines[name] = (status, detail)
    return lines, proc


def passed(run, name: str) -> str:
    lines, proc = run
    assert name in lines, f"no line for {name}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    status, detail = lines[name]
    assert status == "PASS", f"{name}: {status} {detail}"
    return detail


mpi = pytest.mark.mpi

# (check, what its detail must say, the defect of issue 12 it guards): one test each, 2 and 3 ranks
CHECKS = [
    ("grid", ["bitwise equal to the host path"], "all-collectives-algorithms-dtypes"),
    # defect 10: what carried the bytes is counted, not assumed; and no host copy at all
    ("device-only", ["0 through host", "stand-in host copies: 0"], "defect10"),
    # defect 3: rank k uses pretend device k; the progress thread starts on device 0
    ("async", [], "defect3"),
    ("split", [], "sub-communicators"),
    # defect 4: the stand-in records a read of another stream's pending write as a violation
    ("streams", [], "defect4"),
    # defect 6: the stand-in records a free while a peer still maps the memory
    ("memory", ["no malloc or IPC mapping left"], "defect6"),
    # a device send before any collective must not start the node's CUDA IPC handshake
    ("p2p-first", ["no CUDA IPC transport set up"], "send-before-setup"),
    # defects 7 and 8, across processes
    ("validation", ["out on another device", "RINGCOMM_ALGO"], "defects7-8"),
    # defect 2: send/recv too (mpi4py would have handed MPI a device pointer)
    ("mpi-refusal", [], "defect2"),
    # defect 9, and the CUDA IPC set-up inside a collective bounded and released by a peer's abort
    ("fault", [], "defect9"),
    # defect 5
    ("ddp", ["no host copy"], "defect5"),
]


@mpi
@pytest.mark.parametrize("check,needles", [c[:2] for c in CHECKS], ids=[f"{c[0]}-{c[2]}" for c in CHECKS])
def test_stand_in_check_passes(stand_in_run, check, needles):
    detail = passed(stand_in_run, check)
    missing = [n for n in needles if n not in detail]
    assert not missing, f"{check}: the detail does not say {missing}: {detail}"


@mpi
def test_the_verdict_passes_and_says_what_it_could_not_check(stand_in_run):
    lines, proc = stand_in_run
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "gpu_check: PASS" in proc.stdout and "cupy stand-in: code paths only, no GPU" in proc.stdout
    for name in ("torch-ddp", "nccl-1rank", "gloo-1rank"):
        assert lines[name][0] == "SKIP" and "no CUDA" in lines[name][1], lines[name]
    assert lines["time-64MiB"] == ("SKIP", "times over the cupy stand-in mean nothing")


@mpi
def test_gpu_perf_prints_every_section_and_no_segment_goes_through_host():
    """benchmarks/gpu_perf.py, which timed the device segment size on the H200 (docs/gpu.md),
    keeps running: every row of every section, and each algorithm's 40 MiB all_reduce (three
    16 MiB segments a step) carried by the device pool alone. Its times mean nothing here."""
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'stand_ins'}", "STAND_IN_CUPY_DEVICES": "2",
           "STAND_IN_CUPY_PEER_ACCESS": "1"}
    proc = subprocess.run([mpirun_path(), "-n", "2", sys.executable, str(ROOT / "benchmarks" / "gpu_perf.py"),
                           "--sizes", "4,1K,1M", "--big", "40M", "--iters", "2"],
                          env=mpi_env(env), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = proc.stdout.splitlines()
    sections = [row.split(":")[0] for row in rows]
    names = [a for a in ringcomm.algorithms.names("all_reduce") if not ringcomm.algorithms.is_window("all_reduce", a)]
    assert sections == ["floor"] + ["sizes"] * 3 + ["segments"] * 3 + ["algorithms"] * (len(names) + 3) + ["torch"], proc.stdout
    through = [row for row in rows if "B through host" in row]
    assert [row.split()[3] for row in through] == names, proc.stdout
    assert all(row.endswith(", 0 B through host") for row in through), proc.stdout
    assert [row.split(", ")[1].split()[0] for row in rows if row.startswith("segments")] == ["1", "4", "16"], proc.stdout
    assert rows[-1] == "torch: SKIP (this torch has no CUDA)"


# ---- in process --------------------------------------------------------------------------------
@pytest.fixture
def cp():
    with cupy_stand_in.installed() as module:
        if not getattr(module, "IS_STAND_IN", False):
            pytest.skip("a real cupy is installed: gpu_check.py runs these paths on the GPU")
        module.stand_in.reset_host_copies()
        yield module


def device_array(cp, values, device=0, dtype=np.float32):
    with cp.cuda.Device(device):
        a = cp.asarray(np.asarray(values, dtype))
        cp.cuda.Stream.null.synchronize()
    return a


def test_cupy_arrays_are_buffers_on_their_device_sharing_memory(cp):
    a = device_array(cp, np.arange(12).reshape(3, 4), device=1)
    buf = as_buffer(a, "all_reduce", "x")
    assert (buf.kind, buf.device, buf.dtype.name, buf.numel) == ("cupy", "cuda:1", "float32", 12)
    assert buf.flat.data.ptr == a.data.ptr
    with pytest.raises(ringcomm.UsageError, match="C-contiguous"):
        as_buffer(a[:, ::2], "all_reduce", "x")
    with pytest.raises(ringcomm.ArgumentTypeError, match="uint16"):
        as_buffer(device_array(cp, [1, 2], dtype=np.uint16), "all_reduce", "x")


def test_mixed_devices_are_refused_before_a_sequence_number(cp):
    """Defect 8: cpu out for a cuda x, and cuda:0 with cuda:1, named by device."""
    def body(comm):
        x = device_array(cp, np.ones(8), device=0)
        for out, needles in ((np.zeros(8, np.float32), ("cuda:0", "cpu")),
                             (device_array(cp, np.zeros(8), device=1), ("cuda:0", "cuda:1"))):
            with pytest.raises(ringcomm.UsageError) as info:
                comm.all_reduce(x, out=out)
            assert all(n in str(info.value) for n in needles), str(info.value)
            with pytest.raises(ringcomm.UsageError):
                comm.all_gather(out, x[:8])
        return comm._seq
    assert run_threads(1, body) == [0]


def test_in_place_calls_set_their_copy_aside_on_the_arrays_device(cp):
    """An in-place gather root's block and an in-place all_to_all's x are copied aside as the
    call starts; from a thread whose current device is 0, an array on device 1 must get its copy
    on device 1 (cupy allocates on the current device)."""
    def body(comm):
        out = device_array(cp, np.arange(4), device=1)
        asides = [ringcomm.collectives.get(name).prepare(comm, out, out).inp.flat.device.id
                  for name in ("gather", "all_to_all")]
        comm.gather(out, out)
        comm.all_to_all(out, out)
        return asides, cp.asnumpy(out).tolist()
    assert run_threads(1, body) == [([1, 1], [0, 1, 2, 3])]


def test_a_forced_window_algorithm_runs_on_device_memory_where_one_rank_moves_nothing(cp):
    """Defect 7 (RINGCOMM_ALGO forcing one_shot reached window.post with a cupy array) is refused
    across processes (the "validation" check above); a communicator of one rank moves nothing, so
    there the forced algorithm runs, as it does on host memory."""
    def body(comm):
        x = device_array(cp, np.arange(4))
        comm.all_reduce(x)
        out = device_array(cp, np.zeros(4))
        comm.all_reduce(x, out=out)
        comm.all_reduce(np.ones(4, np.float32))
        return comm._seq, cp.asnumpy(out).tolist()
    assert run_threads(1, body, selector=Selector(forced={"all_reduce": "one_shot"})) == [(3, [0, 1, 2, 3])]


def test_a_job_on_the_progress_thread_runs_on_the_buffers_device_after_the_callers_stream(cp):
    """Defects 3 and 4 in one process: the premul_sum scaling kernel runs on the progress thread,
    which starts on device 0 with its own current stream; x is on device 1 and was written on a
    side stream the caller did not synchronise."""
    def body(comm):
        with cp.cuda.Device(1):
            side, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
            with side:
                x = cp.empty(1000, cp.float32)
                x.fill(3.0)
                y = cp.zeros(1000, cp.float32)
                work = comm.all_reduce(x, op=ringcomm.premul_sum(2.0), out=y, async_op=True)
            work.wait(30)
            with other:
                return bool((y == 6.0).all()) and bool((x == 3.0).all())
    assert run_threads(1, body) == [True]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
def test_bf16_reductions_of_device_arrays_read_nothing_back_to_the_host(cp):
    """The bf16 rounding asked the host whether any lane was NaN: a device-to-host copy and a
    synchronisation per reduction."""
    bf16 = DTYPES["bfloat16"]
    a = np.array([0x3F80, 0x7F81, 0xFFC1, 0x4000, 0x7F7F, 0x0001], np.uint16)   # 1, NaNs, 2, max, tiny
    b = np.array([0x3F80, 0x3F80, 0x0000, 0x7FC0, 0x7F7F, 0x8001], np.uint16)
    want = a.copy()
    reducer(ReduceOp.SUM, bf16)(want, b)
    da, db = device_array(cp, a, dtype=np.uint16), device_array(cp, b, dtype=np.uint16)
    cp.stand_in.reset_host_copies()
    reducer(ReduceOp.SUM, bf16)(da, db)
    assert cp.stand_in.host_copies()["to_host_calls"] == 0
    cp.cuda.Stream.null.synchronize()
    assert da.get().tobytes() == want.tobytes()


def test_c10d_backends_take_device_arrays_through_dlpack_not_from_numpy(cp, monkeypatch):
    """Defect 1: torch.from_numpy on a cupy view raised TypeError for every gloo/NCCL call with a
    CUDA tensor. The CPU build has no CUDA tensors, so torch.from_dlpack is stood in for here."""
    from ringcomm.backends import c10d
    from ringcomm.backends.nccl import NCCLCommunicator
    handed = []

    def from_dlpack(a):
        handed.append(a)
        return torch.zeros(a.size, dtype=torch.uint16 if a.dtype == np.uint16 else torch.float32)

    def from_numpy(a):
        raise AssertionError(f"torch.from_numpy got a {type(a).__module__} array")
    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    monkeypatch.setattr(torch, "from_numpy", from_numpy)
    flat = device_array(cp, np.ones(5))
    cp.stand_in.reset_host_copies()
    assert c10d.C10dBackend.tensor(None, flat, DTYPES["float32"]).dtype == torch.float32
    bits = device_array(cp, np.ones(5), dtype=np.uint16)
    assert c10d.C10dBackend.tensor(None, bits, DTYPES["bfloat16"]).dtype == torch.bfloat16
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))   # what DLPack gives for device memory
    nccl = NCCLCommunicator.__new__(NCCLCommunicator)
    nccl._staged = []
    nccl.tensor(flat, DTYPES["float32"])
    assert handed == [flat, bits, flat] and nccl._staged == []   # in place: nothing staged
    assert cp.stand_in.host_copies()["to_host_calls"] == 0


def test_ddp_and_the_torch_backend_keep_tensors_on_devices_the_communicator_lists(cp):
    """Defect 5: no communicator declared its devices, so CUDA buckets always went to the host."""
    from ddp.comm_hooks import comm_accepts, device_type
    from ringcomm.integrations.torch_tensors import accepts as _accepts

    class Tensor:   # the CPU build cannot make a CUDA tensor; _accepts reads these things
        device = torch.device("cuda", 0)

        def is_contiguous(self):
            return True

        def is_neg(self):
            return False

        def is_conj(self):
            return False
    devices = run_threads(1, lambda comm: comm.devices)[0]
    assert devices == ("cpu", "cuda")
    assert run_threads(2, lambda comm: comm.devices) == [("cpu",)] * 2   # the threads transport: host only
    with_cuda, host_only = type("C", (), {"devices": devices}), type("C", (), {"devices": ("cpu",)})
    assert _accepts(with_cuda, Tensor()) and not _accepts(host_only, Tensor())
    assert comm_accepts(with_cuda, torch.device("cuda", 1)) and not comm_accepts(host_only, torch.device("cuda", 1))
    assert device_type(device_array(cp, [1.0])) == "cuda" and device_type(torch.ones(1)) == "cpu"
