"""Real mpirun jobs: every collective on every backend, async in flight, and init's choices.

Each launch batches thousands of checks (a launch costs about a second of startup); the jobs
write a JSON report that is asserted here, so a failure lists every wrong case by name.
"""
import json
import re
import time

import pytest

import ringcomm
from mpi_util import run_mpi

BACKENDS = "ringcomm,mpi,gloo"


def report_of(tmp_path, n, script, *args, env=None):
    path = tmp_path / "report.json"
    proc = run_mpi(n, script, path, *args, env=env, timeout=240, check=False)
    if not path.exists():
        pytest.fail(f"{script} wrote no report (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}")
    report = json.loads(path.read_text())
    assert not report["failures"], "\n".join(report["failures"][:40])
    assert proc.returncode == 0, proc.stderr
    report["stdout"] = proc.stdout
    return report


@pytest.mark.mpi
@pytest.mark.parametrize("n,pretend_nodes", [(2, 0), (3, 3), (4, 0), (4, 2)],
                         ids=["n2", "n3-every-rank-its-own-node", "n4", "n4-two-pretend-nodes"])
def test_every_collective_on_every_backend_matches_float64(tmp_path, n, pretend_nodes):
    """Pretend nodes change only ringcomm's roads (shared memory inside a node, MPI between); the
    reference backends hand every call to their library whatever node a rank claims, so they
    run the grid in the one-node layouts (each launch of three backends took 13-19 s)."""
    backends = "ringcomm" if pretend_nodes else BACKENDS
    args = ["--backends", backends] + (["--pretend-nodes", pretend_nodes] if pretend_nodes else [])
    report = report_of(tmp_path, n, "collectives_grid.py", *args)
    for backend in backends.split(","):
        assert report["backends"][backend]["checks"] >= 500 * n, report["backends"][backend]
    nodes = pretend_nodes or 1
    ranks = report["backends"]["ringcomm"]["ranks"]
    assert [r["node_count"] for r in ranks] == [nodes] * n
    node_of = [r * nodes // n for r in range(n)]   # how the job assigns pretend nodes
    assert [r["local_size"] for r in ranks] == [node_of.count(node_of[r]) for r in range(n)]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_async_collectives_in_flight_and_init_choices(tmp_path, n):
    report = report_of(tmp_path, n, "async_and_init.py", "--backends", BACKENDS)
    assert report["checks"] >= 30 * n


def test_unknown_backend_is_a_usage_error_naming_the_valid_ones(monkeypatch):
    with pytest.raises(ringcomm.UsageError, match="ringcomm, mpi, gloo, nccl.*'bogus'"):
        ringcomm.init("bogus")
    with pytest.raises(ringcomm.ArgumentTypeError, match="backend"):
        ringcomm.init(3)
    monkeypatch.setenv("RINGCOMM_BACKEND", "bogus")
    with pytest.raises(ringcomm.UsageError, match="RINGCOMM_BACKEND"):
        ringcomm.init()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf"])
def test_bad_timeout_in_the_environment_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv("RINGCOMM_TIMEOUT", value)
    with pytest.raises(ringcomm.UsageError, match="RINGCOMM_TIMEOUT"):
        ringcomm.init("mpi")


def test_bad_timeout_argument_is_rejected_before_mpi_starts():
    with pytest.raises(ringcomm.UsageError, match="timeout"):
        ringcomm.init("mpi", timeout=0)
    with pytest.raises(ringcomm.ArgumentTypeError, match="timeout"):
        ringcomm.init("mpi", timeout="10")


@pytest.mark.mpi
def test_a_collective_nobody_joins_times_out_on_every_backend(tmp_path):
    """And the job then exits promptly: rank 0's timed-out split left its allgather posted on
    the gloo world, the exit's barrier over MPI paired with it on the peers, and every exit
    waited out the barrier's 10 s bound (gloo.py ``_release`` meets in the store now)."""
    report = report_of(tmp_path, 3, "timeouts.py", "--backends", BACKENDS)
    ended = time.time()
    assert report["checks"] == 3 * len(BACKENDS.split(","))
    left = [float(t) for t in re.findall(r"rank \d leaves at ([\d.]+)", report["stdout"])]
    assert len(left) == 3, report["stdout"]
    assert ended - max(left) < 6, f"the ranks' exit took {ended - max(left):.1f} s"


@pytest.mark.mpi
def test_ranks_that_disagree_raise_mismatch_on_every_rank_of_a_reference_backend(tmp_path):
    """count, root, dtype, op, kind, uneven counts and all_to_all splits, rank 2 of 3 differing,
    and all_to_all splits alike on every rank that cannot pair up: MPI returned partial or stale
    buffers as results, gloo killed the job with SIGABRT (mpi_jobs/reference_mismatch.py)."""
    report = report_of(tmp_path, 3, "reference_mismatch.py", "--backends", "mpi,gloo")
    assert report["checks"] == 3 * 2 * 19


SCHEDULES = "all_to_all=pairwise,all_gather=ring,reduce_scatter=ring,all_reduce=ring,broadcast=binomial," \
            "reduce=binomial,gather=binomial,scatter=binomial"


@pytest.mark.mpi
@pytest.mark.parametrize("forced", ["", SCHEDULES,
                                    "all_to_all=bruck,all_reduce=rabenseifner,gather=linear,scatter=linear"],
                         ids=["own-choice", "schedules", "bruck-rabenseifner-linear"])
def test_ranks_that_disagree_raise_on_every_rank_of_ringcomm(tmp_path, forced):
    """The same cases on backend ringcomm: every rank raises (MismatchError, or PeerAbortedError
    from a peer that found it), within half the timeout. Before: on the schedules, ranks 0 and 1
    of a pairwise all_to_all and rank 1 of a ring all_gather returned normally while rank 2
    raised (each message matched its own receiver: uneven calls now end with the confirmation
    barrier); a rank that broadcast where the others ran a ring all_reduce left every rank
    waiting for the 20 s timeout (a message of this call's number from a peer not waited on now
    says it); with RINGCOMM_ALGO=all_to_all=bruck an uneven all_to_all ran bruck's equal blocks,
    which raised a false MismatchError where the splits agreed and, where they did not, returned
    an element never written on every rank (the cost model now picks for uneven calls)."""
    report = report_of(tmp_path, 3, "reference_mismatch.py", "--backends", "ringcomm",
                       env={"RINGCOMM_ALGO": forced} if forced else None)
    assert report["checks"] == 3 * 19


def _cuda_reason():
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"needs a CUDA GPU: torch {torch.__version__} reports none"
    return None


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
def test_nccl_backend_runs_the_grid_on_one_gpu(tmp_path):
    # One rank: NCCL refuses two ranks on one device, and a GPU machine here has one.
    report = report_of(tmp_path, 1, "collectives_grid.py", "--backends", "nccl")
    assert report["backends"]["nccl"]["checks"] >= 500


@pytest.mark.mpi
@pytest.mark.parametrize("layout", [(True, False, True), (False, True)], ids=["3ranks", "2ranks"])
def test_processes_mixing_compiled_and_python_rounds_get_the_same_bits(layout):
    """Also that they choose alike: on 2 ranks, a rank without the compiled round chose another
    all_reduce than its peer before the job agreed on the rounds' price (agreement.py)."""
    import subprocess
    import sys
    from mpi_util import JOBS, ROOT, mpi_env, mpirun_path
    from ringcomm.core import compiled
    if not compiled.available():
        pytest.skip("the compiled round was not built (no C compiler)")
    job = [sys.executable, str(JOBS / "compiled_round.py")]
    cmd = [mpirun_path()]
    for on in layout:
        cmd += [":"] * (len(cmd) > 1) + ["-n", "1"] + ([] if on else ["-env", "RINGCOMM_COMPILED", "0"]) + job
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    import re   # ranks' lines may interleave on the shared stdout
    found = sorted(re.findall(r"rank (\d) ok \d+ (compiled=True|compiled=False)", proc.stdout))
    assert found == [(str(r), f"compiled={on}") for r, on in enumerate(layout)], proc.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "shm"), (2, "mpi")])
def test_read_only_inputs_are_taken_where_the_call_only_reads_them(n, transport):
    """Over shared memory (staged, and read in place by CMA), over MPI point-to-point (an empty
    confirmation receive once landed in the read-only input, which mpi4py refuses), and on the
    reference backends (mpi_jobs/read_only_inputs.py)."""
    backends = BACKENDS.split(",") if transport == "shm" and n == 2 else ["ringcomm"]
    proc = run_mpi(n, "read_only_inputs.py", *backends, env={"RINGCOMM_TRANSPORT": transport}, timeout=240)
    for backend in backends:
        assert f"read-only inputs: {backend} ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", ["ringcomm", "mpi", "gloo"])
def test_send_recv_keep_one_contract_on_every_cpu_backend(backend):
    """A receive that does not fit is a MismatchError (gloo: never a short buffer or SIGABRT),
    an empty message from any rank arrives, and receives from any rank take their messages in
    posting order whatever order they are waited in (mpi_jobs/p2p_contract.py)."""
    out = run_mpi(3, "p2p_contract.py", backend, env={"RINGCOMM_TIMEOUT": "30"}, timeout=120).stdout
    assert f"p2p contract: {backend} ok" in out, out
