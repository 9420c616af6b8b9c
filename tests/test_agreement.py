"""Settings every rank must share are compared at init (ringcomm/agreement.py): ranks that differ,
or a rank that cannot read its own, raise one UsageError on every rank, naming the setting and
which ranks hold which value; the cost model's host inputs are agreed instead."""
import sys
import threading

import pytest

from mpi_util import JOBS, mpi_env, mpirun_path
from ringcomm import UsageError, agreement
from ringcomm.agreement import Settings

SAME = dict(backend="ringcomm", transport="auto", algo="(unset)", preflight="off",
            tuning="0123456789ab", tuning_source="built-in defaults")


def settings(**changes) -> Settings:
    return Settings(**{**SAME, **changes})


def test_equal_settings_pass_and_differing_ones_name_the_setting_and_the_ranks():
    agreement.check([settings(), settings(), settings()])
    gathered = [settings(algo="ring"), settings(), settings(), settings(algo="ring", preflight="on (fields)")]
    with pytest.raises(UsageError) as info:
        agreement.check(gathered)
    text = str(info.value)
    assert "RINGCOMM_ALGO: 'ring' on ranks 0, 3; '(unset)' on ranks 1, 2" in text, text
    assert "pre-flight check" in text and "'off' on ranks 0, 1, 2; 'on (fields)' on rank 3" in text, text
    assert "RINGCOMM_TRANSPORT" not in text and "tuning table" not in text, text


def test_tuning_tables_compare_by_content_and_the_error_says_where_each_was_read():
    agreement.check([settings(tuning_source="/a/t.json"), settings(tuning_source="/b/t.json")])
    with pytest.raises(UsageError, match=r"tuning table.*'0123456789ab from /a/t.json, /b/t.json' on ranks 0, 1; "
                                         r"'ffffffffffff from /c/t.json' on rank 2"):
        agreement.check([settings(tuning_source="/a/t.json"), settings(tuning_source="/b/t.json"),
                         settings(tuning="ffffffffffff", tuning_source="/c/t.json")])


def test_a_rank_that_cannot_read_its_settings_is_named_on_every_rank():
    with pytest.raises(UsageError, match=r"^init: ranks 1, 2: RINGCOMM_SHM_POOL='x': bad$"):
        agreement.check([settings(), settings(problem="RINGCOMM_SHM_POOL='x': bad"),
                         settings(problem="RINGCOMM_SHM_POOL='x': bad")])


def test_the_cost_model_gets_the_most_crowded_rank_the_smallest_cache_and_the_python_rounds_if_any():
    gathered = [settings(ranks_here=4, cores=2, cache=32 << 20), settings(ranks_here=4, cores=1, cache=16 << 20),
                settings(ranks_here=2, cores=8, cache=64 << 20, compiled=False)]
    assert agreement.agreed(gathered) == agreement.Agreed(4, 1, 16 << 20, False)
    assert agreement.agreed([settings(ranks_here=2, cores=2, cache=0)]) == agreement.Agreed(2, 2, 0, True)


def test_reads_are_priced_fast_only_when_every_rank_s_host_measured_them_fast():
    fast, slow, unmeasured = settings(read_cost=1.8), settings(read_cost=3.8), settings(read_cost=0.0)
    assert agreement.agreed([fast, fast]).fast_reads
    assert not agreement.agreed([fast, slow]).fast_reads        # the slowest host decides
    assert not agreement.agreed([fast, unmeasured]).fast_reads  # CMA off, or another backend
    from ringcomm.selection.selector import Selector
    selector = Selector()
    agreement.agreed([fast, fast]).apply(selector)
    assert selector.fast_reads


def test_the_read_probe_runs_only_where_direct_reads_can_run(monkeypatch):
    from ringcomm.transport.shm import cma
    monkeypatch.setattr(cma, "read_cost", lambda: 1.5)
    assert agreement.host_read_cost("ringcomm", 2) == 1.5
    assert agreement.host_read_cost("mpi", 2) == 0.0 and agreement.host_read_cost("ringcomm", 1) == 0.0
    monkeypatch.setenv("RINGCOMM_SHM_CMA", "0")
    assert agreement.host_read_cost("ringcomm", 2) == 0.0
    monkeypatch.setenv("RINGCOMM_SHM_CMA", "maybe")   # reported by env.check_all, not here
    assert agreement.host_read_cost("ringcomm", 2) == 0.0
    monkeypatch.setenv("RINGCOMM_SHM_CMA", "1")
    monkeypatch.setattr(cma, "read_cost", lambda: float("inf"))   # the read failed
    assert agreement.host_read_cost("ringcomm", 2) == 0.0


def test_the_exchange_through_a_store_carries_long_texts_and_raises_on_every_rank():
    """torchrun's road (init_from_store): the same exchange over the Store, texts past any fixed row."""
    import torch.distributed as dist
    from ringcomm.transport.store import StoreComm
    store, long_problem = dist.HashStore(), "x" * 600
    mine = [settings(), settings(problem=long_problem), settings(algo="ring")]
    raised = {}

    def rank_main(r):
        try:
            agreement.exchange(StoreComm(store, [0, 1, 2], r, 30.0, name="settings").allgather, mine[r])
        except UsageError as err:
            raised[r] = str(err)
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert sorted(raised) == [0, 1, 2] and len(set(raised.values())) == 1, raised
    assert raised[0] == f"init: rank 1: {long_problem}"


@pytest.mark.mpi
@pytest.mark.parametrize("variable,words", [
    ("RINGCOMM_ALGO=ring", "RINGCOMM_ALGO: 'ring' on rank 0; '(unset)' on ranks 1, 2"),
    ("RINGCOMM_CHECK_FINITE=1", "pre-flight check"),
    ("RINGCOMM_SHM_POOL=garbage", "init: rank 0: RINGCOMM_SHM_POOL='garbage'"),
])
def test_a_variable_set_on_one_rank_only_is_refused_on_every_rank(variable, words):
    one_rank_differs(variable, words)


@pytest.mark.mpi
def test_a_node_with_another_tuning_table_is_refused_on_every_rank(tmp_path):
    from ringcomm.selection.tuning import Tuning, save_tuning
    links = dict(Tuning().links)
    links["shm"] = (links["shm"][0] * 2, *links["shm"][1:])   # another machine's measurement
    save_tuning(Tuning(links=links), tmp_path / "other.json")
    one_rank_differs(f"RINGCOMM_TUNING_FILE={tmp_path / 'other.json'}", "other.json' on rank 0")


def one_rank_differs(variable, words):
    """Launch settings_disagree.py on 3 ranks with ``variable`` set on rank 0 only: every rank
    raises UsageError containing ``words`` within seconds."""
    import subprocess
    job = [sys.executable, str(JOBS / "settings_disagree.py")]
    cmd = [mpirun_path(), "-n", "1", "env", variable, *job, ":", "-n", "2", *job]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=120)
    # one report per rank (mpirun may join the ranks' lines: count them, not lines)
    assert proc.returncode == 0 and proc.stdout.count("UsageError after") == 3, (proc.stdout, proc.stderr)
    assert proc.stdout.count(words) == 3, proc.stdout
    assert all(float(t.split()[0]) < 30 for t in proc.stdout.split("UsageError after ")[1:]), proc.stdout
