"""`mpirun -n 2 python -m ringcomm.tune` writes a file that a new job loads and selects with."""

import re

import pytest

from mpi_util import run_mpi
from ringcomm.selection.selector import Selector
from ringcomm.selection.tuning import load_tuning


@pytest.mark.mpi
def test_tune_writes_a_loadable_file_and_keeps_other_shapes(tmp_path, monkeypatch):
    out = tmp_path / "tuning.json"
    env = {"RINGCOMM_TUNING_FILE": str(out), "RINGCOMM_ALGO": "all_reduce=tree"}   # neither steers tune
    proc = run_mpi(2, "selector_tune.py", "--quick", "--max-size", "128K", env=env, timeout=170)
    assert f"wrote {out}" in proc.stdout, proc.stdout
    assert "measured crossovers" in proc.stdout
    tuning = load_tuning(out)
    alpha, beta = tuning.links["mpi"]
    assert 0 < alpha < 0.01 and 0 < beta < 1e-6
    (sweep,) = tuning.sweeps
    assert sweep.local_sizes == (2,) and sweep.sizes[0] == 8 and sweep.sizes[-1] <= 128 << 10
    assert "hierarchical" not in sweep.seconds     # on one node it is a ring: not timed twice
    # The job ran over shared memory, so one-shot was timed and the window link fitted from it.
    assert "one_shot" in sweep.seconds
    alpha_w, beta_w = tuning.links[f"{sweep.routes[0]}-window"]
    assert 0 < alpha_w < 0.01 and 0 < beta_w < 1e-6   # a sane fit; a loaded machine stretches rounds to ms
    monkeypatch.setenv("RINGCOMM_TUNING_FILE", str(out))
    monkeypatch.delenv("RINGCOMM_ALGO", raising=False)
    choice = Selector.from_env().explain("all_reduce", 1024, 2, routes=sweep.routes)   # as tune ran it (shm here)
    assert choice.measured and choice.algorithm == min(choice.measured, key=choice.measured.get)
    # The CMA floor was measured (staged against direct reads, 1 and 2 MiB in --quick) and a new
    # job's shared-memory transport reads directly from it, unless RINGCOMM_SHM_CMA_MIN says otherwise.
    assert "direct reads (CMA) against staging" in proc.stdout, proc.stdout
    assert tuning.cma_min in (1 << 20, 2 << 20, 4 << 20)
    # The same for sends (128 KiB to 2 MiB in --quick).
    assert "direct reads (CMA) against staging, sendrecv" in proc.stdout, proc.stdout
    assert tuning.cma_p2p_min in [128 << 10 << k for k in range(6)]
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
