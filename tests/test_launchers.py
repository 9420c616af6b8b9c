"""ringcomm.init() and other launchers' variables: garbage is named, a silent world of one is refused."""
import importlib
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

import ringcomm

from mpi_util import ROOT, run_mpi
from ringcomm import UsageError
from ringcomm.init import inherited_launch, launcher_problem, launcher_views

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.mark.parametrize("environ, named", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1'"),
    ({"LOCAL_RANK": "one"}, "LOCAL_RANK='one'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"SLURM_NTASKS": "2.5"}, "SLURM_NTASKS='2.5'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, "SLURM_PROCID=4 is not below SLURM_NTASKS=4"),
    ({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2"),
])
def test_garbage_launcher_variables_are_usage_errors_naming_them(environ, named):
    with pytest.raises(UsageError, match=named.replace(".", r"\.")):
        launcher_views(environ)


def test_views_read_what_is_set():
    views = launcher_views({"RANK": " 1 ", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_NTASKS": "4", "PATH": "/x"})
    assert [(v.launcher, v.rank, v.size, v.text) for v in views] == [
        ("torchrun", 1, 2, "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1"), ("Slurm", None, 4, "SLURM_NTASKS=4")]
    assert launcher_views({"LOCAL_RANK": "0"}) == []          # no job-wide variable: nothing to compare


def test_mpi_alone_but_a_launcher_says_several_is_refused():
    problem = launcher_problem(0, 1, launcher_views({"RANK": "1", "WORLD_SIZE": "2"}))
    assert "MPI started this process alone" in problem and "RANK=1 WORLD_SIZE=2" in problem
    assert "mpirun -n 2" in problem and "MASTER_ADDR" in problem
    slurm = launcher_problem(0, 1, launcher_views({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}))
    assert "one of 4 processes" in slurm and "Slurm" in slurm


def test_agreeing_or_absent_launchers_pass():
    assert launcher_problem(0, 1, []) is None
    assert launcher_problem(0, 1, launcher_views({"RANK": "0", "WORLD_SIZE": "1"})) is None
    assert launcher_problem(1, 2, launcher_views({"RANK": "1", "WORLD_SIZE": "2"})) is None
    # mpirun inside a Slurm allocation: SLURM_* count mpirun's daemons, not the ranks.
    assert launcher_problem(3, 8, launcher_views({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})) is None


def test_mpi_and_torchrun_disagreeing_is_refused():
    problem = launcher_problem(1, 2, launcher_views({"RANK": "0", "WORLD_SIZE": "2"}))
    assert "MPI says this is rank 1 of 2" in problem and "RANK=0 WORLD_SIZE=2" in problem


def _python(code: str, **env_vars) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("RINGCOMM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


INIT = "import ringcomm; comm = ringcomm.init(); print('size', comm.size)"


def test_mpiruns_variables_without_its_socket_are_named_not_left_to_mpich():
    r, w = os.pipe()
    os.close(w)
    assert "PMI_RANK=1" in inherited_launch({"PMI_FD": str(r), "PMI_RANK": "1"})   # a pipe is not mpirun's socket
    os.close(r)
    why = inherited_launch({"PMI_FD": str(r), "PMI_RANK": "1"})                      # closed
    assert "not by mpirun" in why and 'if __name__ == "__main__"' in why
    a, b = socket.socketpair()
    try:
        assert inherited_launch({"PMI_FD": str(a.fileno()), "PMI_RANK": "0"}) is None
    finally:
        a.close()
        b.close()
    assert inherited_launch({}) is None and inherited_launch({"PMI_PORT": "host:1234"}) is None


def test_children_of_a_rank_that_call_init_are_told_they_cannot_join_and_the_job_goes_on():
    """A spawn child of a rank: MPICH ended it at MPI_Init. A fork child: it joined as its parent,
    and rank 0's parent then summed 13 where 3 was due (mpi_jobs/child_inits.py)."""
    out = run_mpi(2, "child_inits.py", timeout=120).stdout
    # Counted in the whole output, not per line: the ranks share one stdout, and mpirun once
    # joined rank 1's report to the end of rank 0's, on one line.
    assert out.count("spawn child: UsageError") == 2 and out.count("not by mpirun") == 2, out
    assert out.count("fork child: UsageError") == 2 and out.count("is a fork of pid") == 2, out
    assert out.count("sum 3.0") == 2 and "rank 0 done" in out and "rank 1 done" in out, out


def test_init_names_a_garbage_variable_before_starting_mpi():
    proc = _python(INIT + "\n", WORLD_SIZE="abc")
    assert proc.returncode != 0 and "UsageError: init: WORLD_SIZE='abc'" in proc.stderr, proc.stderr


def test_init_refuses_a_torchrun_environment_without_mpi():
    proc = _python(INIT, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert proc.returncode != 0 and "size" not in proc.stdout, proc.stdout
    assert "UsageError: init: MPI started this process alone" in proc.stderr, proc.stderr


class Held(Exception):
    pass


def test_an_init_while_another_thread_is_in_init_is_refused_before_any_message(monkeypatch):
    """Inits pair across ranks in call order, so two at once from one process could pair crosswise."""
    module = importlib.import_module("ringcomm.init")
    inside, release = threading.Event(), threading.Event()

    def start_mpi(*args, **kwargs):   # where init would start MPI: hold the first caller there
        inside.set()
        release.wait(30)
        raise Held()

    monkeypatch.setattr(module, "start_mpi", start_mpi)
    outcome = []
    first = threading.Thread(target=lambda: outcome.append(pytest.raises(Held, ringcomm.init)), name="first")
    first.start()
    assert inside.wait(30)
    try:
        with pytest.raises(UsageError, match="init: called from thread 'MainThread' while thread 'first' of this "
                                             "process is still in ringcomm.init"):
            ringcomm.init()
        with pytest.raises(UsageError, match="init_from_store: called from thread 'MainThread'"):
            ringcomm.init_from_store(None, 0, 1)
    finally:
        release.set()
        first.join(30)
    assert outcome and not first.is_alive()
    release.clear()
    with pytest.raises(Held):   # the first one over, the next init goes ahead
        threading.Timer(0.1, release.set).start()
        ringcomm.init()


def test_a_world_of_one_says_so_at_debug_info():
    proc = _python(INIT, RINGCOMM_DEBUG="info")
    assert proc.returncode == 0 and "size 1" in proc.stdout, proc.stderr
    assert "ringcomm INFO init: a world of 1 process" in proc.stderr, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.mpi
def test_torchrun_then_plain_init_process_group_gives_the_whole_world_over_shared_memory():
    from test_torch_c10d import torchrun
    proc = torchrun(2, "torchrun_world.py", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for init in range(3):
        for rank in (0, 1):
            assert (f"init {init}: world size 2 on rank {rank}: sum {3.0 + 2 * init} over {{{1 - rank}: 'shm'}}"
                    in proc.stdout), out


def _store_job(rank: int, size: int, port: int, **env_vars) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("RINGCOMM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), RINGCOMM_TIMEOUT="5", **env_vars)
    return subprocess.Popen([sys.executable, "-c", INIT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_torchrun_rank_whose_peers_never_come_fails_naming_them_not_a_world_of_one():
    proc = _store_job(0, 2, _free_port())
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "size" not in out, out
    assert "not every rank of [0, 1] reached the store within 5 s" in err, err


def test_torchrun_across_nodes_is_refused_at_init_naming_mpirun():
    port = _free_port()
    jobs = [_store_job(r, 2, port, RINGCOMM_NODE_ID=f"node{r}") for r in (0, 1)]
    for job in jobs:
        out, err = job.communicate(timeout=120)
        assert job.returncode != 0 and "size" not in out, out
        assert "run on 2 nodes (node0, node1)" in err and "Launch with mpirun" in err, err


@pytest.mark.parametrize("backend", ["ringcomm", "gloo"])
def test_init_process_group_under_mpirun_fails_at_its_timeout_when_a_rank_never_calls_it(backend, tmp_path):
    """env:// under mpirun takes its rendezvous over MPI (torch_groups.mpi_rendezvous), whose
    MPI_Init, allgather and bcast waited forever for a rank that never called init_process_group;
    now the exchanges are bounded by torch's timeout (2 s here), MPI_Init by its deadline (set to
    2 s here)."""
    started = time.monotonic()
    proc = run_mpi(3, "late_process_group.py", backend, "never_mpi", timeout=120, check=False,
                   env={"RINGCOMM_MPI_INIT_TIMEOUT": "2"})
    assert proc.returncode != 0
    assert re.search(r"ringcomm: init on rank [02]: MPI_Init has not returned after 2 s", proc.stderr), \
        proc.stderr[-3000:]
    assert time.monotonic() - started < 30
    proc = run_mpi(3, "late_process_group.py", backend, "no_group", timeout=120, check=False)
    for rank in (0, 2):
        line = re.search(rf"rank {rank} after ([\d.]+) s: (.*)", proc.stdout)
        assert line, proc.stdout + proc.stderr[-3000:]
        took, outcome = float(line.group(1)), line.group(2)
        assert took < 6, (took, outcome)
        assert outcome.startswith(("CommTimeoutError: init on rank", "PeerAbortedError: init on rank")), outcome
