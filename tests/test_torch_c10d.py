"""Every c10d collective on "ringcomm" against gloo, through plain ``dist.init_process_group``,
under torchrun (2 and 3 processes: the store bootstrap, shared memory) and mpirun (4 processes:
MPI's rendezvous, a 2-D DeviceMesh). The job is tests/mpi_jobs/c10d_vs_gloo.py. Then torch's
parallelism libraries (FSDP2, tensor parallelism, pipelining) trained over "ringcomm" against one
process: tests/mpi_jobs/torch_parallelisms.py."""
import socket
import subprocess
import sys

import pytest

from mpi_util import JOBS, ROOT, mpi_env, run_mpi

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# A few names of each kind; every check the job makes must pass (it exits non-zero otherwise).
NAMES = ["all_reduce torch.int8 BXOR", "all_reduce torch.bfloat16 PRODUCT", "all_reduce avg",
         "all_reduce premul_sum", "broadcast complex bool", "all_gather uneven", "all_gather_coalesced",
         "reduce_scatter uneven", "all_to_all uneven", "all_to_all_single uneven", "gather", "scatter",
         "send_recv tags", "large send_recv", "recv anysource", "batch_isend_irecv", "coalescing_manager", "all_reduce_coalesced",
         "sparse all_reduce", "sub-groups concurrent", "sub-groups from threads", "split_group", "profiler ranges"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int, script, timeout: float = 240, args=(), **env_vars) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=n script args`` with no MPI variables, this checkout first on the path."""
    env = {k: v for k, v in mpi_env().items() if k not in LAUNCHER_VARS and not k.startswith(("PMI", "OMPI"))}
    env.update(env_vars)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "--monitor-interval=1", str(JOBS / script), *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def assert_all_passed(proc, n: int, names: list) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "FAILED" not in out, out[-6000:]
    for name in names:
        assert proc.stdout.count(f"check {name} ok") == n, f"check {name} not passed on {n} ranks:\n{out[-6000:]}"
    assert proc.stdout.count(", 0 failed") == n, out[-6000:]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_c10d_collective_matches_gloo_under_torchrun(n):
    assert_all_passed(torchrun(n, "c10d_vs_gloo.py"), n, NAMES)


@pytest.mark.mpi
def test_every_c10d_collective_and_a_2d_device_mesh_match_gloo_under_mpirun():
    proc = run_mpi(4, "c10d_vs_gloo.py", timeout=300)
    assert_all_passed(proc, 4, NAMES + ["device mesh 2-D"])
    assert proc.stdout.count("check sub-group collectives ok") == 2, proc.stdout   # on the evens, 0 and 2


PARALLELISMS = {2: ["fsdp2", "pipelining ScheduleGPipe", "pipelining Schedule1F1B"],
                4: ["fsdp2 x tensor parallel", "pipelining ScheduleGPipe", "pipelining Schedule1F1B"]}


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_tensor_parallel_and_pipelining_on_ringcomm_train_like_one_process(n):
    """torch's parallelism libraries over the "ringcomm" group (tests/mpi_jobs/torch_parallelisms.py):
    FSDP2's padded shards, a 2-D FSDP2 x tensor-parallel mesh, pipeline stages' sends."""
    proc = run_mpi(n, "torch_parallelisms.py", timeout=240)
    assert_all_passed(proc, n, PARALLELISMS[n])


SAMPLE = ("test_all_reduce_sum or test_all_gather_v or test_scatter_full_group or test_send_recv_any_source "
          "or test_all_to_all_single_unequal_split or test_barrier_full_group or test_DistributedDataParallel_SyncBatchNorm_Diff")


@pytest.mark.mpi
def test_a_sample_of_torchs_own_distributed_tests_passes_on_ringcomm(tmp_path):
    """A few of torch's DistributedTest bodies, unchanged (the whole list: make torch-tests)."""
    sys.path.insert(0, str(ROOT / "tests" / "torch_suite"))
    try:
        from run import outcomes, run
    finally:
        sys.path.pop(0)
    found = outcomes(run("ringcomm", 2, tmp_path, SAMPLE))
    passed = sorted(n for n, (state, _) in found.items() if state == "passed")
    problems = {n: v for n, v in found.items() if v[0] == "failed"}
    assert len(passed) >= 7 and not problems, (passed, problems)


@pytest.mark.parametrize("order", ["ringcomm first", "torch first"])
def test_import_ringcomm_registers_the_backend_without_importing_torch(order):
    imports = ("import ringcomm, sys; assert 'torch' not in sys.modules, 'import ringcomm imported torch'; "
               "import torch.distributed as dist" if order == "ringcomm first" else
               "import torch.distributed as dist; import ringcomm")
    code = f"{imports}; assert 'RINGCOMM' in dist.Backend._plugins, dist.Backend._plugins; print('registered')"
    proc = subprocess.run([sys.executable, "-c", code], env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "registered" in proc.stdout, proc.stderr


@pytest.mark.parametrize("scheme", ["env", "tcp", "file"])
def test_init_methods_of_torchs_harness_bootstrap_from_the_store(scheme, tmp_path):
    port = free_port()
    url = {"env": "env://", "tcp": f"tcp://127.0.0.1:{port}", "file": f"file://{tmp_path}/rendezvous"}[scheme]
    env = {k: v for k, v in mpi_env().items() if k not in LAUNCHER_VARS and not k.startswith(("PMI", "OMPI"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    jobs = [subprocess.Popen([sys.executable, str(JOBS / "init_method.py"), url, str(r), "2"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    for r, job in enumerate(jobs):
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and f"rank {r} of 2 via {scheme}: sum 3.0" in out, err[-3000:]
