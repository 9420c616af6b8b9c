"""`mpirun -n 2 python -m ringcomm.tune` writes a file that a new job loads and selects with."""

import re
import time

import pytest

from mpi_util import run_mpi
from ringcomm import algorithms
from ringcomm.selection.selector import Selector
from ringcomm.selection.tune import SWEPT
from ringcomm.selection.tuning import Sweep, Tuning, load_tuning, save_tuning
from test_shm_transport import cma_denied


@pytest.mark.mpi
def test_tune_writes_a_loadable_file_and_keeps_other_shapes(tmp_path, monkeypatch):
    out = tmp_path / "tuning.json"
    # An older file: a sweep of another job shape (kept) and one of this shape (replaced).
    other = Sweep("broadcast", (4,), ("shm", "shm"), "float32", (8, 64), {"binomial": (1e-5, 2e-5)})
    stale = Sweep("broadcast", (2,), ("shm", "shm"), "float32", (8, 64), {"binomial": (1e-9, 1e-9)})
    save_tuning(Tuning(sweeps=(other, stale)), out)
    env = {"RINGCOMM_TUNING_FILE": str(out), "RINGCOMM_ALGO": "all_reduce=tree"}   # neither steers tune
    proc = run_mpi(2, "selector_tune.py", "--quick", "--max-size", "128K", env=env, timeout=170)
    assert f"wrote {out}" in proc.stdout, proc.stdout
    assert "all_reduce measured crossovers" in proc.stdout
    tuning = load_tuning(out)
    alpha, beta = tuning.links["mpi"]
    assert 0 < alpha < 0.01 and 0 < beta < 1e-6
    assert len(tuning.sweeps) == len(SWEPT) + 1 and stale not in tuning.sweeps, tuning.sweeps
    sweeps = {(s.collective, s.local_sizes): s for s in tuning.sweeps}
    assert sorted(sweeps) == sorted([(c, (2,)) for c in SWEPT] + [("broadcast", (4,))]), sorted(sweeps)
    assert sweeps["broadcast", (4,)] == other
    sweep = sweeps["all_reduce", (2,)]
    assert sweep.local_sizes == (2,) and sweep.sizes[0] == 8 and sweep.sizes[-1] <= 128 << 10
    assert "hierarchical" not in sweep.seconds     # on one node it is a ring: not timed twice
    skipped = {"hierarchical", "hierarchical_tree"} | ({"direct"} if cma_denied() else set())
    for collective in SWEPT:   # every algorithm of every swept collective, at every size
        timed = sweeps[collective, (2,)]
        assert timed.sizes == sweep.sizes, (collective, timed.sizes)
        assert set(timed.seconds) == set(algorithms.names(collective)) - skipped, (collective, timed.seconds)
        assert all(0 < t < 1 for ts in timed.seconds.values() for t in ts), timed.seconds
    # The job ran over shared memory, so one-shot was timed and the window link fitted from it.
    assert "one_shot" in sweep.seconds
    alpha_w, beta_w = tuning.links[f"{sweep.routes[0]}-window"]
    assert 0 < alpha_w < 0.01 and 0 < beta_w < 1e-6   # a sane fit; a loaded machine stretches rounds to ms
    monkeypatch.setenv("RINGCOMM_TUNING_FILE", str(out))
    monkeypatch.delenv("RINGCOMM_ALGO", raising=False)
    for collective in SWEPT:   # as tune ran it (shm here): each collective by its own sweep
        choice = Selector.from_env().explain(collective, 1024, 2, routes=sweep.routes)
        assert choice.measured and choice.algorithm == min(choice.measured, key=choice.measured.get), choice
    # The CMA floor was measured (staged against direct reads, 1 and 2 MiB in --quick) and a new
    # job's shared-memory transport reads directly from it, unless RINGCOMM_SHM_CMA_MIN says otherwise.
    assert "direct reads (CMA) against staging" in proc.stdout, proc.stdout
    assert tuning.cma_min in (1 << 20, 2 << 20, 4 << 20)
    # The same for sends (128 KiB to 2 MiB in --quick).
    assert "direct reads (CMA) against staging, sendrecv" in proc.stdout, proc.stdout
    assert tuning.cma_p2p_min in [128 << 10 << k for k in range(6)]
    # --check times auto (run as forced: the same road as the others) against every algorithm.
    checked = run_mpi(2, "selector_tune.py", "--check", "--quick", "--max-size", "4K",
                      env={"RINGCOMM_TUNING_FILE": str(out)}, timeout=120)
    assert all(f"{c}\n" in checked.stdout for c in SWEPT), checked.stdout   # 8 B, 64 B, 512 B, 4 KiB each
    assert re.search(rf"best forced algorithm at \d+ of {4 * len(SWEPT)} points", checked.stdout), checked.stdout
    # Ranks that outnumber their cores leave the links alone: the model crowds them itself.
    crowded = run_mpi(2, "selector_tune.py", "--quick", "--max-size", "4K",
                      env={"RINGCOMM_TUNING_FILE": str(out), "TUNE_ON_ONE_CORE": "1"}, timeout=120)
    assert "ranks outnumber cores (2 ranks, 1 cores here)" in crowded.stdout, crowded.stdout
    again = load_tuning(out)
    assert again.links == tuning.links and again.sweeps != tuning.sweeps
    assert (again.cma_min, again.cma_p2p_min) == (tuning.cma_min, tuning.cma_p2p_min)
    shown = run_mpi(2, "show_cma_floor.py", env={"RINGCOMM_TUNING_FILE": str(out)}, timeout=60)
    assert floors(shown.stdout) == {"cma_min_bytes": [tuning.cma_min] * 2,
                                    "cma_p2p_min_bytes": [tuning.cma_p2p_min] * 2}, shown.stdout
    shown = run_mpi(2, "show_cma_floor.py", env={"RINGCOMM_TUNING_FILE": str(out), "RINGCOMM_SHM_CMA_MIN": "3M",
                                                 "RINGCOMM_SHM_CMA_P2P_MIN": "5M"}, timeout=60)
    assert floors(shown.stdout) == {"cma_min_bytes": [3 << 20] * 2, "cma_p2p_min_bytes": [5 << 20] * 2}, shown.stdout


def floors(stdout: str) -> dict:
    """What show_cma_floor.py printed: each floor's value on every rank (the ranks' lines may
    interleave mid-line)."""
    return {name: [int(v) for v in re.findall(rf"\b{name}=(\d+)", stdout)]
            for name in ("cma_min_bytes", "cma_p2p_min_bytes")}


@pytest.mark.mpi
def test_tune_that_cannot_write_its_file_says_so_on_every_rank_before_measuring(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "tuning.json"   # under a regular file: no directory can be made there
    started = time.monotonic()
    proc = run_mpi(2, "selector_tune.py", "--quick", "--out", str(out), timeout=60, check=False)
    assert proc.returncode != 0
    assert f"ringcomm.tune: cannot write the tuning file {out}" in proc.stderr, proc.stderr
    assert "ringcomm.tune: rank 0 could not write the tuning file" in proc.stderr, proc.stderr
    assert "measured crossovers" not in proc.stdout and time.monotonic() - started < 30


@pytest.mark.parametrize("field", ["cma_min", "cma_p2p_min"])
def test_a_tuning_file_with_a_bad_cma_floor_is_refused_naming_the_field(tmp_path, field):
    from ringcomm.errors import UsageError
    from ringcomm.selection.tuning import Tuning, save_tuning
    path = save_tuning(Tuning(**{field: 5 << 20}), tmp_path / "t.json")
    assert getattr(load_tuning(path), field) == 5 << 20
    path.write_text(path.read_text().replace(str(5 << 20), "-1"))
    with pytest.raises(UsageError, match=f'"{field}"'):
        load_tuning(path)


def test_fit_window_recovers_the_window_link_from_one_shot_times():
    from ringcomm.selection.tune import fit_window
    alpha, beta, gamma, n, capacity = 3e-6, 1 / 7e9, 1 / 5e9, 4, 64 << 10
    sizes = [8 << k for k in range(20)]
    times = [alpha * -(-s // capacity) + s * beta + (n - 1) * s * (beta + gamma) for s in sizes]
    got_alpha, got_beta = fit_window(sizes, times, gamma, n, capacity)
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_beta == pytest.approx(beta, rel=1e-6)
    assert fit_window(sizes[:2], times[:2], gamma, n, capacity) is None   # too few points to say
