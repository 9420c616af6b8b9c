"""DDP and the torch.distributed backend under real mpirun jobs (one launch per job checks many things)."""
import pytest

from mpi_util import run_mpi

TRAIN_CHECKS = ["default", "bucket_view", "tiny_buckets", "seeded_differently", "no_sync",
                "no_sync_bucket_view", "fp16_hook", "bf16_hook", "fp16_wrapper", "unused_found",
                "unused_zero_grad", "unused_error", "rebuild_agreed", "sparse_embedding"]


def _checks_passed(stdout: str, n: int, names: list) -> None:
    # Substring counts, not lines: mpirun may interleave two ranks' output within one line.
    for name in names:
        assert stdout.count(f"check {name} ok") == n, f"check {name} not passed on all {n} ranks:\n{stdout}"
    for r in range(n):
        assert stdout.count(f"rank {r} done") == 1, f"rank {r} did not finish:\n{stdout}"


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_single_process_training(n, tmp_path):
    trace = tmp_path / "trace.json"
    out = run_mpi(n, "ddp_train_checks.py", env={"RINGCOMM_TIMELINE": str(trace)}).stdout
    _checks_passed(out, n, TRAIN_CHECKS + ["timeline"])
    assert sorted(p.name for p in tmp_path.glob("trace.rank*.json")) == [f"trace.rank{r}.json" for r in range(n)]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_ddp_on_reference_backends(backend):
    out = run_mpi(2, "ddp_train_checks.py", backend).stdout
    _checks_passed(out, 2, TRAIN_CHECKS)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["ringcomm", "mpi", "gloo"])
def test_torch_distributed_on_ringcomm(backend):
    """torch.distributed backend "ringcomm", over each backend ringcomm.init offers."""
    out = run_mpi(2, "ddp_torch_backend.py", backend).stdout
    _checks_passed(out, 2, ["backend_name", "collectives", "torch_ddp_matches_gloo"])


@pytest.mark.mpi
@pytest.mark.parametrize("order", ["dynamo_later", "dynamo-first"])
def test_torch_compile_runs_ringcomm_as_python_and_compiles_what_ddp_wraps(order):
    """Collectives and sends inside a compiled function, ringcomm's DDP (with a BatchNorm) and
    torch's DDP on backend "ringcomm", each under torch.compile, give bit for bit what they give
    uncompiled, and ringcomm's DDP gets its module compiled (mpi_jobs/torch_compiled.py): before,
    Dynamo traced into ringcomm and each stopped with its errors. torch._dynamo loaded before
    ringcomm, or only at the first compile (ddp's import must not load it: 0.6 s). Dynamo's log
    must name no frame of ringcomm's and, of ddp's, only the wrapper's forward."""
    out = run_mpi(2, "torch_compiled.py", order).stdout
    _checks_passed(out, 2, ["calls_in_compiled_functions", "ringcomm_ddp_compiled", "torch_ddp_compiled",
                            "only_the_forward_traced"])


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["ringcomm", "mpi", "gloo"])
def test_forked_children_are_refused_and_dataloader_workers_leave_the_group_intact(backend):
    """A child forked from a rank (os.fork, a DataLoader worker) raises on every call instead of
    pairing with its parent's peers, and its close() leaves the parent's group working
    (mpi_jobs/forked_children.py): before, two children's all_reduces summed each other's data."""
    out = run_mpi(2, "forked_children.py", backend, timeout=120).stdout
    _checks_passed(out, 2, ["children_refused", "dataloader_workers"])


def test_ddp_matches_torch_ddp_where_they_once_parted():
    """Against torch's DDP over gloo in one job: unused parameters (never, some steps, one rank,
    after no_sync), buffers after no_sync, bucket_cap_mb=0, static_graph (with a parameter a
    reentrant checkpoint gives two gradients, and one never used), a model converted after
    wrapping; a comm hook's wrong result and ranks with different models raise
    (mpi_jobs/ddp_vs_torch.py)."""
    out = run_mpi(2, "ddp_vs_torch.py").stdout
    for name in ("never_used", "used_some_steps", "used_on_one_rank", "no_sync_then_unused",
                 "no_sync_then_unused_views", "buffers_after_no_sync", "bucket_cap_0", "static_graph",
                 "static_graph_reentrant", "static_graph_reentrant_unused", "double_after_wrap", "hook_result",
                 "different_models"):
        assert f"check {name} ok" in out, out
