"""The cupy stand-in (tests/stand_ins/cupy): every modelled rule catches its misuse and allows
correct use. In-process, plus one mpirun job for IPC between processes.

These tests check the stand-in itself, so they force it even where a real cupy exists.
"""
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import cupy_stand_in
from mpi_util import run_mpi

from ringcomm.core.ops import DTYPES, ReduceOp, combiner, divide_by_size, reducer


@pytest.fixture
def cp():
    with cupy_stand_in.installed(force=True) as module:
        module.stand_in.reset_host_copies()
        yield module


def caught(cp, fn, *needles) -> str:
    """``fn()`` raises StandInViolation mentioning every needle; its record is taken."""
    with pytest.raises(cp.stand_in.StandInViolation) as info:
        fn()
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    assert cp.stand_in.take_violations() == [text]
    return text


def upload(cp, values, dtype=np.float32):
    """A device array of ``values``, its host-to-device copy complete (synchronised)."""
    a = cp.asarray(np.asarray(values, dtype))
    cp.cuda.Stream.null.synchronize()
    return a


# ---- arrays -------------------------------------------------------------------------------------
def test_arrays_views_and_copies_behave_like_cupy(cp):
    host = np.arange(12, dtype=np.float32)
    a = cp.asarray(host)
    assert type(a).__module__ == "cupy" and type(a).__name__ == "ndarray"
    assert (a.shape, a.dtype, a.size, a.nbytes, a.itemsize, a.ndim) == ((12,), np.float32, 12, 48, 4, 1)
    assert a[3:].data.ptr == a.data.ptr + 12 and a[3:].base is a
    assert a.reshape(3, 4)[1].data.ptr == a.data.ptr + 16
    assert a.view(cp.uint8).shape == (48,) and a.view(cp.uint8).data.ptr == a.data.ptr
    assert cp.shares_memory(a[2:5], a[4:]) and not cp.shares_memory(a[:4], a[4:])
    b = a.copy()
    assert b.data.ptr != a.data.ptr and not cp.shares_memory(a, b)
    b[:6] = a[6:]
    b[6:].fill(-1)
    b[0] = 100
    assert b.get().tolist() == [100, 7, 8, 9, 10, 11] + [-1] * 6
    assert (a[::-3].get() == host[::-3]).all() and a[::-3].reshape(2, 2).get().tolist() == [[11, 8], [5, 2]]
    assert int(a[5]) == 5 and a[5].shape == () and float(a.astype(cp.float64)[7]) == 7.0
    assert cp.empty(0, cp.float32).data.ptr == 0
    assert cp.zeros((2, 3), cp.int32).get().tolist() == [[0] * 3] * 2
    mask = a > 5
    a[mask] = 0
    assert cp.asnumpy(a).tolist() == list(range(6)) + [0] * 6 and a[a < 3].get().tolist() == [0, 1, 2] + [0] * 6


def test_host_copies_are_counted_and_kernels_are_not(cp):
    a = cp.asarray(np.ones(100, np.float64))
    b = cp.empty_like(a)
    np.multiply(a, 3, out=b)
    b += a
    c = b.copy()
    assert cp.stand_in.host_copies() == {"to_host_bytes": 0, "to_host_calls": 0,
                                         "to_device_bytes": 800, "to_device_calls": 1}
    assert (cp.asnumpy(c) == 4).all() and c[0].item() == 4 and bool(c[1])
    assert cp.stand_in.host_copies()["to_host_calls"] == 3
    assert cp.stand_in.host_copies()["to_host_bytes"] == 800 + 8 + 8
    cp.stand_in.reset_host_copies()
    assert set(cp.stand_in.host_copies().values()) == {0}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ringcomm_reduction_kernels_run_bitwise_on_device_arrays(cp, dtype):
    d = DTYPES[dtype]
    rng = np.random.default_rng(7)

    def make():
        if dtype == "bfloat16":
            return rng.integers(0x3000, 0x4800, 257).astype(np.uint16)   # bf16 bits of 0.5 .. 8
        if d.is_float:
            return rng.standard_normal(257).astype(d.storage)
        return rng.integers(1, 9, 257).astype(d.storage)
    for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX):
        x, y = make(), make()
        dx, dy = upload(cp, x, d.storage), upload(cp, y, d.storage)
        reducer(op, d)(dx, dy)
        reducer(op, d)(x, y)
        out, dout = np.empty_like(x), np.empty_like(dx)   # numpy's empty_like reaches cupy's
        combiner(op, d)(out, x, y)
        combiner(op, d)(dout, dx, dy)
        if d.is_float:
            divide_by_size(x, d, 3)
            divide_by_size(dx, d, 3)
        assert type(dout).__name__ == "ndarray" and dout.data.ptr != dx.data.ptr
        assert dx.get().tobytes() == x.tobytes() and dout.get().tobytes() == out.tobytes(), (dtype, op)


# ---- no implicit way to the host ------------------------------------------------------------------
def test_implicit_conversion_to_host_is_refused(cp):
    import torch
    a = upload(cp, [1, 2, 3])
    for convert in (np.asarray, np.array, lambda x: np.ascontiguousarray(x, np.float64)):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(a)
        cp.stand_in.take_violations()   # recorded as well, in case some code swallows the TypeError
    for convert in (memoryview, lambda x: np.frombuffer(x, np.uint8), torch.from_numpy):
        with pytest.raises(TypeError):
            convert(a)
    for mixed in (lambda: np.add(a, np.ones(3, np.float32)), lambda: np.ones(3, np.float32) + a):
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            mixed()
    caught(cp, lambda: np.from_dlpack(a), "__dlpack__", "CUDA-aware")
    caught(cp, lambda: a.__cuda_array_interface__, "raw device pointer")
    assert cp.stand_in.host_copies()["to_host_calls"] == 0


def test_from_dlpack_shares_device_memory_and_refuses_cpu_tensors(cp):
    import torch
    a = upload(cp, [1, 2, 3, 4])
    b = cp.from_dlpack(a)
    assert b is not a and b.data.ptr == a.data.ptr and b.device == a.device
    with pytest.raises(TypeError, match="CPU arrays cannot be directly imported to CuPy"):
        cp.from_dlpack(torch.zeros(4))


def test_unmodelled_attributes_raise_import_errors_naming_them(cp):
    a = upload(cp, [1, 2])
    for touch, name in ((lambda: cp.fft, "cupy.fft"), (lambda: cp.cuda.runtime.memsetAsync, "cupy.cuda.runtime.memsetAsync"),
                        (lambda: a.sum(), "cupy.ndarray.sum"), (lambda: np.sum(a), "cupy.sum"),
                        (lambda: np.add.reduce(a), "numpy.add.reduce"), (lambda: cp.cuda.Device().pci_bus_id, "pci_bus_id")):
        with pytest.raises(ImportError, match=name.replace(".", r"\.")):
            touch()


# ---- devices ------------------------------------------------------------------------------------
def test_devices_are_per_thread_and_arrays_remember_theirs(cp):
    rt = cp.cuda.runtime
    assert rt.getDeviceCount() == 2 and rt.getDevice() == 0
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorInvalidDevice: invalid device ordinal"):
        rt.setDevice(2)
    with cp.cuda.Device(1):
        b = cp.zeros(4, cp.float32)
        assert b.device.id == 1 and cp.cuda.Device().id == 1
        seen = []
        worker = threading.Thread(target=lambda: seen.append(rt.getDevice()))
        worker.start()
        worker.join()
        assert seen == [0]   # a new thread starts on device 0, whatever its parent uses
    a = cp.zeros(4, cp.float32)
    assert a.device.id == 0 and rt.getDevice() == 0
    msg = r"The device where the array resides \(1\) is different from the current device \(0\)"
    with pytest.raises(ValueError, match=msg):
        np.add(a, b, out=a)            # mixing devices
    with pytest.raises(ValueError, match=msg):
        b.fill(1)                      # current device is not the array's
    errors = []

    def on_new_thread():               # a progress thread that never set the device
        try:
            np.add(b, 1, out=b)
        except ValueError as err:
            errors.append(str(err))
    worker = threading.Thread(target=on_new_thread)
    worker.start()
    worker.join()
    assert errors and "resides (1)" in errors[0]
    # A copy may cross devices, on the current device's stream: nothing orders it after b's
    # zero-fill on device 1's stream until device 1 is synchronised.
    caught(cp, lambda: b.copy(), "legacy default stream (Stream.null) of device 1", "pending write")
    cp.cuda.Device(1).synchronize()
    assert b.copy().device.id == 0 and (b.copy().get() == 0).all()
    with cp.cuda.Device(1):
        b += 1
        cp.cuda.Device().synchronize()
        assert (b.get() == 1).all()


# ---- streams ------------------------------------------------------------------------------------
def test_a_stream_reading_another_streams_pending_write_is_caught(cp):
    a, b = upload(cp, [0] * 8), upload(cp, [0] * 8)
    writer, reader = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with writer:
        a.fill(5)
    with reader:
        text = caught(cp, lambda: b.__setitem__(Ellipsis, a), "pending write", "wait_event")
    assert f"stream {writer.ptr:#x}" in text and f"stream {reader.ptr:#x}" in text
    reader.wait_event(writer.record())            # ordered by an event: fine
    with reader:
        b[...] = a
    with writer:
        caught(cp, lambda: a.fill(6), "pending read")   # writer overwrites what reader still reads
    reader.synchronize()
    with writer:
        a.fill(6)
    event = cp.cuda.Event()
    event.record(writer)
    event.synchronize()
    with reader:
        b[...] = a
    assert (b.get(stream=reader) == 6).all()


def test_legacy_default_stream_orders_blocking_streams_only(cp):
    a = upload(cp, [0] * 4)
    with cp.cuda.Stream():                        # blocking: the null stream waits for it
        a.fill(1)
    a += 1                                        # on Stream.null
    cp.cuda.Stream.null.synchronize()
    with cp.cuda.Stream(non_blocking=True):       # like torch's streams: no implicit barrier
        a.fill(3)
    caught(cp, lambda: a.__iadd__(1), "non-blocking", "pending write")
    cp.cuda.Device().synchronize()                # a device sync completes every stream
    a += 1                                        # on Stream.null, pending
    with cp.cuda.Stream():                        # a blocking stream waits for Stream.null
        a += 1
    with cp.cuda.Stream(non_blocking=True):       # a non-blocking one does not
        caught(cp, lambda: a.__iadd__(1), "legacy default stream", "pending write")
    cp.cuda.Device().synchronize()
    assert (a.get() == 5).all()


def test_host_reads_of_another_streams_pending_writes_are_caught(cp):
    a = upload(cp, [0] * 4)
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        a.fill(9)
    caught(cp, lambda: a.get(), "cupy.ndarray.get", f"stream {side.ptr:#x}")
    caught(cp, lambda: cp.asnumpy(a), "device to host")
    caught(cp, lambda: bool(a[0]), "device to host")
    assert (a.get(stream=side) == 9).all()        # a copy on the writer's stream is ordered
    with side:
        a.fill(8)
        assert (cp.asnumpy(a) == 8).all()         # so is one on the current stream = writer
    assert (a.get() == 8).all()                   # that get synchronised the stream


def test_work_handed_to_a_thread_must_be_ordered_after_the_callers_stream(cp):
    caller = cp.cuda.Stream(non_blocking=True)
    with caller:
        x = cp.zeros(16, cp.float32)
        x += 1                                    # the caller's kernel, still pending
    handed = cp.cuda.get_current_stream()         # outside the block: Stream.null
    assert handed == cp.cuda.Stream.null
    with caller:
        handed = cp.cuda.get_current_stream()     # the caller's stream, as a library sees it
    assert handed == caller
    outcome = {}

    def progress(use_callers_stream: bool):
        try:
            if use_callers_stream:
                with cp.cuda.ExternalStream(handed.ptr):
                    x[...] = x * 2
            else:
                x[...] = x * 2                    # on this thread's default: Stream.null
            outcome[use_callers_stream] = "ran"
        except cp.stand_in.StandInViolation as err:
            outcome[use_callers_stream] = str(err)
    for flag in (False, True):
        worker = threading.Thread(target=progress, args=(flag,))
        worker.start()
        worker.join()
    assert "legacy default stream" in outcome[False] and f"stream {caller.ptr:#x}" in outcome[False]
    assert outcome[True] == "ran"
    assert len(cp.stand_in.take_violations()) == 1
    caller.synchronize()
    assert (x.get() == 2).all()


# ---- raw memory and IPC in one process ------------------------------------------------------------
def test_raw_device_memory(cp):
    rt, cuda = cp.cuda.runtime, cp.cuda
    assert rt.malloc(0) == 0
    ptr = rt.malloc(64)
    view = cp.ndarray((16,), cp.float32, memptr=cuda.MemoryPointer(cuda.UnownedMemory(ptr, 64, None), 0))
    assert view.data.ptr == ptr and view.device.id == 0
    host = np.arange(16, dtype=np.float32)
    rt.memcpy(ptr, host.ctypes.data, 64, rt.memcpyHostToDevice)
    back = np.zeros(16, np.float32)
    rt.memcpy(back.ctypes.data, ptr + 32, 32, rt.memcpyDefault)
    assert back[:8].tolist() == list(range(8, 16))
    assert cp.stand_in.host_copies()["to_device_bytes"] == 64 and cp.stand_in.host_copies()["to_host_bytes"] == 32
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorInvalidValue"):
        rt.memcpy(ptr, host.ctypes.data, 64, rt.memcpyDeviceToHost)   # kind contradicts the pointers
    caught(cp, lambda: cuda.UnownedMemory(ptr, 65, None), "overruns")
    caught(cp, lambda: cuda.UnownedMemory(12345, 8, None), "no device allocation")
    with pytest.raises(rt.CUDARuntimeError, match="not its start"):
        rt.free(ptr + 4)
    assert len(cp.stand_in.live_allocations("malloc")) == 1
    rt.free(ptr)
    assert cp.stand_in.live_allocations("malloc") == []
    with pytest.raises(rt.CUDARuntimeError, match="already"):
        rt.free(ptr)
    caught(cp, lambda: view.fill(0), "freed with cudaFree")          # use after free
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorMemoryAllocation: out of memory"):
        rt.malloc(5 << 30)


def test_opening_ones_own_ipc_handle_is_refused(cp):
    rt = cp.cuda.runtime
    ptr = rt.malloc(256)
    handle = rt.ipcGetMemHandle(ptr + 16)         # any pointer inside names the allocation
    assert isinstance(handle, bytes) and len(handle) == 64 and handle == rt.ipcGetMemHandle(ptr)
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorDeviceUninitialized: invalid device context"):
        rt.ipcOpenMemHandle(handle)
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorInvalidValue"):
        rt.ipcGetMemHandle(12345)
    rt.free(ptr)


_OWNER = """
import sys, time
sys.path.insert(0, {stand_ins!r})
from cupy.cuda import runtime
freed = runtime.malloc(1024)
stale = runtime.ipcGetMemHandle(freed)
runtime.free(freed)
ptr = runtime.malloc(1024)              # same size, and the freed one's descriptor number
print(stale.hex(), runtime.ipcGetMemHandle(ptr).hex(), flush=True)
time.sleep(60)
"""


def test_handles_die_with_their_memory_and_a_killed_owner_leaks_nothing(cp):
    rt = cp.cuda.runtime
    owner = subprocess.Popen([sys.executable, "-c", _OWNER.format(stand_ins=str(cupy_stand_in.STAND_INS))],
                             stdout=subprocess.PIPE, text=True)
    try:
        stale, handle = map(bytes.fromhex, owner.stdout.readline().split())
        assert stale[:24] + stale[32:] == handle[:24] + handle[32:]   # only the nonce differs
        with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorInvalidResourceHandle.*freed"):
            rt.ipcOpenMemHandle(stale)
        peer = rt.ipcOpenMemHandle(handle)        # another process's handle opens
        assert rt.ipcOpenMemHandle(handle) == peer   # again: the same pointer, counted
        rt.ipcCloseMemHandle(peer)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        owner.stdout.close()
    rt.ipcCloseMemHandle(peer)                    # the last close unmaps; the kernel frees it
    with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorInvalidResourceHandle"):
        rt.ipcOpenMemHandle(handle)
    assert not [f for f in os.listdir("/dev/shm") if "stand-in" in f]   # memfd: never a name


_WRITER = """
import sys, time
sys.path.insert(0, {stand_ins!r})
import cupy
from cupy.cuda import runtime
ptr = runtime.ipcOpenMemHandle(bytes.fromhex(sys.argv[1]))
mem = cupy.cuda.UnownedMemory(ptr, 1024, None)
cupy.ndarray((256,), cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0)).fill(5)   # never synchronised
print("written", flush=True)
time.sleep(60)
"""


def test_a_peer_processs_unsynchronised_write_counts_until_it_dies(cp):
    rt = cp.cuda.runtime
    ptr = rt.malloc(1024)
    mine = cp.ndarray((256,), cp.float32, memptr=cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, 1024, None), 0))
    writer = subprocess.Popen([sys.executable, "-c", _WRITER.format(stand_ins=str(cupy_stand_in.STAND_INS)),
                               rt.ipcGetMemHandle(ptr).hex()], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "written"
        caught(cp, lambda: mine.get(), f"of process {writer.pid}", "pending write")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        writer.stdout.close()
    assert (mine.get() == 5).all()                # its queued work died with it: nothing pending
    rt.free(ptr)                                  # and a dead opener does not hold the memory


# ---- violations cannot be swallowed -------------------------------------------------------------
def test_a_swallowed_violation_still_fails_the_block():
    with pytest.raises(AssertionError, match="swallowed"), cupy_stand_in.installed(force=True) as cp:
        a = upload(cp, [1])
        with cp.cuda.Stream(non_blocking=True):
            a.fill(2)
        try:
            a.get()
        except cp.stand_in.StandInViolation:
            pass   # what careless code might do: the block still fails


def test_a_process_exiting_with_recorded_violations_fails():
    code = ("import cupy, numpy as np\n"
            "a = cupy.asarray(np.zeros(2))\n"
            "try:\n    np.asarray(a)\nexcept TypeError:\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(cupy_stand_in.STAND_INS))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 86, proc.stderr
    assert "1 recorded violation(s) nobody took" in proc.stderr and "Implicit conversion" in proc.stderr


# ---- the helper prefers a real cupy -------------------------------------------------------------
def test_job_env_puts_the_stand_in_first_only_without_a_real_cupy(tmp_path, monkeypatch):
    base = {"PYTHONPATH": "/somewhere"}
    cupy_stand_in.real_cupy_importable.cache_clear()
    try:
        if not cupy_stand_in.real_cupy_importable():
            env = cupy_stand_in.job_env(3, env=base)
            assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(cupy_stand_in.STAND_INS), str(cupy_stand_in.ROOT)]
            assert env["STAND_IN_CUPY_DEVICES"] == "3"
        (tmp_path / "cupy").mkdir()
        (tmp_path / "cupy" / "__init__.py").write_text("# a real cupy, as far as the helper can tell\n")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        cupy_stand_in.real_cupy_importable.cache_clear()
        assert cupy_stand_in.job_env(env=base) == base
        assert cupy_stand_in.job_env(env=base, force=True)["PYTHONPATH"].startswith(str(cupy_stand_in.STAND_INS))
    finally:
        cupy_stand_in.real_cupy_importable.cache_clear()


# ---- IPC between processes ----------------------------------------------------------------------
@pytest.mark.mpi
def test_ipc_between_two_processes():
    proc = run_mpi(2, "stand_in_cupy_ipc.py", env=cupy_stand_in.job_env(force=True), timeout=120)
    assert "PASS stand-in IPC" in proc.stdout, proc.stdout + proc.stderr
    for scenario in ("own handle refused", "round trip with synchronisation", "reads of unsynchronised peer writes",
                     "overwrite of memory a peer still reads", "close with unsynchronised launches",
                     "free while the peer has it open", "device array refused by MPI"):
        assert f"ok {scenario}" in proc.stdout, proc.stdout
