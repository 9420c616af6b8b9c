"""benchmarks/allreduce_perf.py: its arithmetic, its correctness check, and one tiny real sweep."""
from __future__ import annotations

import csv
import json
import os
import sys

import numpy as np
import pytest

from mpi_util import ROOT, run_mpi
from ringcomm.core import copying

sys.path.insert(0, str(ROOT / "benchmarks"))
import allreduce_perf as perf  # noqa: E402

TOOL = ROOT / "benchmarks" / "allreduce_perf.py"


@pytest.mark.parametrize("n, all_reduce, gather", [(1, 0.0, 0.0), (2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_bus_factor_is_the_nccl_tests_factor(n, all_reduce, gather):
    assert perf.bus_factor("all_reduce", n) == all_reduce
    assert perf.bus_factor("all_gather", n) == gather
    assert perf.bus_factor("reduce_scatter", n) == gather
    assert perf.bus_factor("broadcast", n) == 1.0


def test_bus_factor_rejects_unknown_collective():
    with pytest.raises(ValueError, match="collective"):
        perf.bus_factor("alltoall", 2)


@pytest.mark.parametrize("text, nbytes", [("8", 8), ("1K", 1024), ("64M", 64 << 20), ("1G", 1 << 30),
                                          ("256MiB", 256 << 20), ("1.5K", 1536)])
def test_parse_size(text, nbytes):
    assert perf.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "abc", "0", "1.3"])
def test_parse_size_rejects(text):
    with pytest.raises(Exception, match="expected"):
        perf.parse_size(text)


def test_sweep_multiplies_or_steps():
    assert perf.sweep(8, 64, 2) == [8, 16, 32, 64]
    assert perf.sweep(100, 400, 1, 100) == [100, 200, 300, 400]
    with pytest.raises(ValueError):
        perf.sweep(8, 64, 1)


def test_split_collectives_round_down_to_a_multiple_of_ranks():
    assert perf.elements("all_gather", 1024, 4, 3) == 255
    assert perf.elements("all_reduce", 1024, 4, 3) == 256


@pytest.mark.parametrize("collective", perf.COLLECTIVES)
def test_the_check_counts_unfinished_results_as_wrong(collective):
    """Without any communication, a rank's buffers are not the expected result: the check must say
    so (gather checks only its root, which holds the result)."""
    case = perf.Case(collective, 12, np.dtype(np.float32), rank=0 if collective == "gather" else 1, n=2)
    case.fill()
    assert case.wrong() > 0


@pytest.mark.parametrize("collective", ["all_reduce", "all_to_all"])
def test_torch_rows_run_on_memory_torch_allocated(collective):
    """The torch rows time tensors as torch users have them: allocated by torch, whose large
    buffers may sit on other pages than numpy's, not views of numpy's memory."""
    torch = pytest.importorskip("torch")
    case = perf.Case(collective, 1 << 20, np.dtype(np.float32), rank=1, n=2, torch_owned=True)
    for array in (case.x, case.out) if case.out is not None else (case.x,):
        assert isinstance(array.base, torch.Tensor)   # .numpy() of a tensor: the tensor owns the memory
    tensors = case.as_torch()
    assert tensors.x.data_ptr() == case.x.ctypes.data
    case.fill()
    assert case.wrong() > 0
    assert perf.Case(collective, 12, np.dtype(np.float32), rank=1, n=2).x.base is None


def _rows_by_label(rows):
    return {(r["collective"], int(r["size"]), r["backend"], r["algorithm"]): r for r in rows}


@pytest.mark.mpi
def test_tiny_sweep_under_mpirun(tmp_path):
    out_csv, out_json = tmp_path / "r.csv", tmp_path / "r.json"
    proc = run_mpi(2, TOOL, "-b", "1K", "-e", "64K", "-f", "8", "-w", "1", "-n", "2",
                   "--backend", "ringcomm,mpi4py,nccl",
                   "--collective", ",".join(perf.COLLECTIVES), "--tensor", "numpy,torch",
                   "--transport-buffers", "--empty-buffers", "--csv", out_csv, "--json", out_json, timeout=120)
    # A backend that cannot start here (no GPU) is a row saying why; the others still run.
    assert "backend nccl unavailable:" in proc.stdout or "nccl/" in proc.stdout
    assert "ringcomm+empty/auto" in proc.stdout
    assert "out of bounds values: 0 OK" in proc.stdout
    data = json.loads(out_json.read_text())
    rows = data["rows"]
    with open(out_csv) as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows)
    assert _rows_by_label(csv_rows).keys() == _rows_by_label(rows).keys()
    sizes = {1024, 8192, 65536}
    for collective in perf.COLLECTIVES:
        mine = [r for r in rows if r["collective"] == collective]
        # all_gather and reduce_scatter round each size down to a multiple of the 2 ranks: same sizes
        assert {r["size"] for r in mine} == sizes, collective
        labels = {(r["backend"], r["algorithm"]) for r in mine}
        assert {("floor", "x+=y"), ("floor", "copy"), ("ringcomm", "auto"), ("ringcomm[torch]", "auto"),
                ("mpi4py", "native"), ("mpi4py[torch]", "native")} <= labels
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["ranks"] == 2 and r["time_us"] > 0
        assert r["algbw_gbs"] == pytest.approx(r["size"] / r["time_us"] / 1e3)
        if r["backend"] == "floor":
            assert r["busbw_gbs"] is None
        else:
            factor = perf.bus_factor(r["collective"], 2)
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * factor)
    # Shared-memory buffers run (and were checked above) where the transport can allocate them.
    assert any(r["backend"] == "ringcomm+tbuf" for r in rows) or "has no allocate()" in proc.stdout
    auto = [r for r in rows if r["algorithm"] == "auto"]
    assert all(r["chosen"] for r in auto)
    assert data["meta"]["ranks"] == 2


def test_a_sweep_on_both_halves_of_a_parity_split_checks_each_halfs_result(tmp_path):
    """--split parity: 4 ranks run every collective on two sub-communicators of 2 at once; each
    rank's result is checked against its half's (a check against the world's would count wrong)."""
    out_json = tmp_path / "r.json"
    proc = run_mpi(4, TOOL, "-b", "1K", "-e", "8K", "-f", "8", "-w", "1", "-n", "2", "--split", "parity",
                   "--backend", "ringcomm,mpi4py", "--collective", "all_reduce,all_gather,broadcast,sendrecv",
                   "--json", out_json, timeout=120)
    assert "both halves of a split by rank parity at once, 2 ranks each" in proc.stdout
    assert "out of bounds values: 0 OK" in proc.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["backend"], r["algorithm"]) for r in rows} >= {("ringcomm", "auto"), ("mpi4py", "native")}
    assert all(r["wrong"] == 0 and r["ranks"] == 2 for r in rows), rows


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    import plot
    rows = [{"collective": "all_reduce", "size": s, "backend": b, "algorithm": a, "time_us": 10.0 * s,
             "busbw_gbs": None if b == "floor" else 0.1 * k}
            for k, s in enumerate((1024, 4096), 1) for b, a in (("floor", "x+=y"), ("ringcomm", "auto"))]
    png = tmp_path / "busbw.png"
    plot.plot_rows(rows, str(png), title="test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- benchmarks/ddp_scaling.py ---------------------------------------------------------------
import ddp_scaling  # noqa: E402


@pytest.mark.parametrize("step, compute, comm, exposed, hidden", [
    (10.0, 10.0, 4.0, 0.0, 1.0),     # communication entirely behind backward
    (14.0, 10.0, 4.0, 4.0, 0.0),     # entirely exposed
    (11.0, 10.0, 4.0, 1.0, 0.75),
    (9.0, 10.0, 4.0, 0.0, 1.0),      # noise: a step faster than compute alone counts as fully hidden
    (20.0, 10.0, 4.0, 10.0, 0.0),    # sync slower than comm alone (contention): nothing hidden
])
def test_overlap(step, compute, comm, exposed, hidden):
    assert ddp_scaling.overlap(step, compute, comm) == pytest.approx((exposed, hidden))


def test_table_marks_unavailable_and_efficiency():
    rows = [{"impl": "local", "ranks": 1, "samples_per_s": 100.0, "step_s": 0.32},
            {"impl": "torch", "ranks": 2, "samples_per_s": 150.0, "step_s": 0.43, "compute_s": 0.4,
             "comm_s": 0.1, "exposed_s": 0.03, "hidden": 0.7},
            {"impl": "ringcomm", "ranks": 2, "error": "ImportError: no ddp"}]
    lines = ddp_scaling.table(rows)
    assert "75%" in lines[2] and "70%" in lines[2]
    assert "unavailable: ImportError: no ddp" in lines[3]


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_ddp_scaling_runs_both_implementations(tmp_path, model):
    import subprocess

    import ddp
    out = tmp_path / "ddp.json"
    env = {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_scaling.py"), "--ranks", "2",
                           "--impl", "ringcomm,torch", "--model", model,
                           "--width", "64" if model == "mlp" else "32", "--depth", "2", "--steps", "2",
                           "--warmup", "1", "--no-local", "--json", str(out)]
                          # the transformer with both DDPs' gradients as views into their buckets
                          + (["--bucket-view"] if model == "transformer" else []), capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env={**__import__("os").environ, **env})
    assert proc.returncode == 0, proc.stderr
    results = {(r["impl"], r["ranks"]): r for r in json.loads(out.read_text())["results"]}
    for key in [("torch", 2)] + ([("ringcomm", 2)] if hasattr(ddp, "DistributedDataParallel") else []):
        r = results[key]
        assert "error" not in r, r
        assert r["samples_per_s"] > 0 and r["step_s"] > 0
    if hasattr(ddp, "DistributedDataParallel"):
        assert 0.0 <= results[("ringcomm", 2)]["hidden"] <= 1.0
    else:   # until the ddp package lands the row must say why it is missing, not vanish
        assert "DistributedDataParallel" in results[("ringcomm", 2)]["error"]


def test_ddp_scaling_on_cuda_stops_at_once_where_torch_has_no_cuda():
    """--device cuda (the H200 run of docs/gpu.md) refuses a CPU-only torch before any job."""
    import subprocess

    import torch
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: the refusal cannot happen here")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_scaling.py"), "--device", "cuda"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert f"--device cuda: this torch ({torch.__version__}) sees no CUDA device" in proc.stderr


def _row(size, backend, algorithm, time_us, factor=1.0):
    bw = size / time_us / 1e3
    return perf.Row("all_reduce", size, size // 4, "float32", 2, backend, algorithm, "", time_us, bw,
                    bw * factor, 0, 1.0)


def test_targets_are_judged_from_the_rows():
    rows = [_row(64 << 20, "floor", "x+=y", 10_000.0), _row(64 << 20, "ringcomm", "auto", 20_000.0),
            _row(64 << 20, "ringcomm", "ring", 20_000.0), _row(64 << 20, "ringcomm", "tree", 30_000.0),
            _row(64 << 20, "mpi4py", "native", 40_000.0), _row(64 << 20, "gloo", "native", 70_000.0),
            _row(64 << 20, "ringcomm[torch]", "auto", 8_000.0),
            _row(1024, "ringcomm", "auto", 30.0), _row(1024, "ringcomm", "ring", 20.0),
            _row(1024, "ringcomm", "tree", 25.0), _row(1024, "mpi4py", "native", 10.0),
            _row(1024, "ringcomm", "persistent", 9.0)]
    text = "\n".join(perf.target_lines(rows))
    line = {k: next(x for x in text.splitlines() if k in x) for k in (
        "1K all_reduce ringcomm/auto time vs mpi4py", "1K all_reduce ringcomm/persistent time vs mpi4py",
        "64M all_reduce ringcomm/auto busbw vs mpi4py", "64M all_reduce ringcomm/auto time vs the x+=y",
        "64M all_reduce ringcomm[torch]/auto time vs the x+=y", "worst size")}
    assert "x  3.00 (target <= 1.0): MISSED" in line["1K all_reduce ringcomm/auto time vs mpi4py"]
    assert "x  0.90 (target <= 1.0): met" in line["1K all_reduce ringcomm/persistent time vs mpi4py"]
    assert "x  2.00 (target >= 1.0): met" in line["64M all_reduce ringcomm/auto busbw vs mpi4py"]
    assert "x  2.00 (target <= 1.0): MISSED" in line["64M all_reduce ringcomm/auto time vs the x+=y"]
    assert "x  0.80 (target <= 1.0): met" in line["64M all_reduce ringcomm[torch]/auto time vs the x+=y"]
    assert "worst size (1K) x  1.20" in line["worst size"] and line["worst size"].endswith("MISSED")
    assert "gloo" not in text   # the targets are against MPI and the floor


def test_torch_rows_are_judged_against_mpi_on_the_same_memory():
    """With an ``mpi4py[torch]`` row (MPI on the torch rows' memory) the torch subjects are judged
    against it, the numpy ones still against ``mpi4py``; the summary compares auto (numpy's
    memory) with MPI on numpy's memory only."""
    rows = [_row(1 << 20, "ringcomm", "auto", 60.0), _row(1 << 20, "ringcomm[torch]", "auto", 60.0),
            _row(1 << 20, "mpi4py", "native", 80.0), _row(1 << 20, "mpi4py[torch]", "native", 30.0)]
    text = "\n".join(perf.target_lines(rows))
    assert "1M all_reduce ringcomm/auto busbw vs mpi4py " in text and "x  1.33 (target >= 1.0): met" in text
    assert "1M all_reduce ringcomm[torch]/auto busbw vs mpi4py[torch]" in text
    assert "x  0.50 (target >= 1.0): MISSED" in text
    (line,) = perf.summary(rows)
    assert "vs mpi4py," in line and "mpi4py[torch]" not in line


def test_summary_tells_noise_from_a_slower_choice():
    same = _row(1024, "ringcomm", "auto", 41.0)
    same.chosen = "ring"
    (line,) = perf.summary([same, _row(1024, "ringcomm", "ring", 39.0)])
    assert line.endswith("ok (auto ran ring itself; the gap is run-to-run noise)"), line
    other = _row(1024, "ringcomm", "auto", 41.0)
    other.chosen = "tree"
    (line,) = perf.summary([other, _row(1024, "ringcomm", "ring", 39.0)])
    assert line.endswith("SLOWER THAN EVERY FORCED"), line


def test_call_overhead_times_every_phase():
    """benchmarks/call_overhead.py in-process (no mpirun): every phase row, the window call's
    included, is timed; a phase whose call no longer fits the library's signatures fails here."""
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "call_overhead.py"), "--number", "20",
                           "--repeat", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.strip().split(" ")[0].replace(".", "").isdigit()]
    assert len(rows) >= 14, proc.stdout
    assert any("one_shot.run alone" in r for r in rows) and any("mirror window" in r for r in rows)
    assert all(float(r.split()[0]) > 0 for r in rows)


def test_p2p_cold_times_three_roads_warm_and_cold():
    """benchmarks/p2p_cold.py: a row per road and cache state, every receive checked; the bare
    CMA read too where the node reads by CMA (not in a container that refuses it)."""
    proc = run_mpi(2, ROOT / "benchmarks" / "p2p_cold.py", "--calls", "3", "--evict-bytes", "1M", timeout=120)
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[-1:] != ["(us)"]
            and not line.startswith("#")]
    reads_by_cma = "direct reads: cma" in proc.stdout
    roads = ["communicator", "shm", "mpi4py"] + (["bare"] if reads_by_cma else [])
    assert [(r[0], r[-5]) for r in rows] == [(road, state) for road in roads for state in ("warm", "cold")], \
        proc.stdout
    assert all(float(v) > 0 for r in rows for v in r[-4:]), proc.stdout


def test_cma_copy_times_both_directions_and_a_memcpy():
    """benchmarks/cma_copy.py: one row per size and page kind, the read checked to come from the
    child; a bad --pages is refused."""
    import subprocess
    tool = [sys.executable, str(ROOT / "benchmarks" / "cma_copy.py")]
    proc = subprocess.run(tool + ["--sizes", "4K,64K", "--calls", "3"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("CMA is refused in this container")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [(int(r[0]), r[1]) for r in rows] == [(4096, "4k"), (4096, "huge"), (65536, "4k"), (65536, "huge")]
    assert all(int(r[2]) >= 0 for r in rows)
    assert all(float(v) > 0 for r in rows for v in r[3:]), proc.stdout
    bad = subprocess.run(tool + ["--pages", "2m"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--pages: expected a comma list of 4k, huge, got '2m'" in bad.stderr


def test_copy_distance_times_every_copy_at_both_distances():
    """benchmarks/copy_distance.py: a row per size and distance, every figure a time."""
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "copy_distance.py"), "--sizes", "16K,64K",
                           "-n", "3", "--rounds", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(16384, 0), (16384, 16), (65536, 0), (65536, 16)]
    assert all(len(r) in (4, 6) and all(float(v) > 0 for v in r[2:]) for r in rows), proc.stdout


@pytest.mark.skipif(copying.copy_bytes is None,
                    reason="the compiled copy was not built (no C compiler)")
def test_copy_shared_times_each_copy_in_and_leaves_no_segment():
    """benchmarks/copy_shared.py: a row per copy, every figure a time, the bytes read back checked
    by the benchmark itself; its /dev/shm files are gone when it ends."""
    proc = run_mpi(2, ROOT / "benchmarks" / "copy_shared.py", "--bytes", "1M", "-n", "3", timeout=120)
    rows = [line.rsplit(None, 2) for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["numpy copy (memcpy)", "ringcomm copy", "numpy copy, no reader"], proc.stdout
    assert all(float(v) > 0 for r in rows for v in r[1:]), proc.stdout
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("ringcomm_copy_shared_")]


@pytest.mark.skipif(copying.copy_bytes is None,
                    reason="the compiled copy was not built (no C compiler)")
def test_copy_stream_times_three_copies_per_size_and_puts_the_streaming_length_back():
    """benchmarks/copy_stream.py: a row per size, every figure a time; it names the length from
    which ringcomm streams, and leaves that length as it found it (it runs in this process's
    library only, but says so on its first line)."""
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "copy_stream.py"), "--sizes", "1M,2M", "-r", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"ringcomm streams from {copying.STREAM_FROM >> 20} MiB" in lines[0], proc.stdout
    rows = [line.split() for line in lines[2:]]
    assert [int(r[0]) for r in rows] == [1 << 20, 2 << 20] and all(len(r) == 4 for r in rows), proc.stdout
    assert all(float(v) > 0 for r in rows for v in r[1:]), proc.stdout


@pytest.mark.parametrize("argv,argument", [(["--backend", "bogus"], "--backend"), (["--algorithm", "bogus"], "--algorithm"),
                                           (["-b", "1K", "-e", "8"], "-b")])
def test_allreduce_perf_refuses_what_would_measure_nothing(argv, argument, capsys):
    with pytest.raises(SystemExit) as exit_:
        perf.parse_args(argv)
    assert exit_.value.code == 2 and argument in capsys.readouterr().err


@pytest.mark.parametrize("argv,argument", [(["--ranks", "foo"], "--ranks"), (["--ranks", "0"], "--ranks"),
                                           (["--steps", "0"], "--steps"), (["--width", "0"], "--width"),
                                           (["--depth", "-1"], "--depth"), (["--job-timeout", "-1"], "--job-timeout")])
def test_ddp_scaling_refuses_garbage_arguments_naming_them(argv, argument):
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_scaling.py"), *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and argument in proc.stderr, proc.stderr


def test_round_summary_reads_each_launch_and_states_ratios_against_the_same_launchs_mpi(tmp_path):
    """benchmarks/round.sh's rows become docs/performance.md's figures (round_summary.py):
    ringcomm's time over MPI's from the same launch and command, the floor, DDP's speed-up."""
    import subprocess
    import round_summary

    def row(collective, size, backend, algorithm, us):
        return {"collective": collective, "size": size, "backend": backend, "algorithm": algorithm, "time_us": us}
    for launch, mpi in (("L1", 10.0), ("L2", 20.0)):
        folder = tmp_path / launch
        folder.mkdir()
        rows = [row("all_reduce", 1024, "mpi4py", "native", mpi), row("all_reduce", 1024, "ringcomm", "auto", 7.0),
                row("all_reduce", 1024, "ringcomm[torch]", "auto", 8.0),
                row("all_reduce", 64 << 20, "floor", "x+=y", 1000.0), row("all_reduce", 64 << 20, "ringcomm", "auto", 1300.0),
                row("all_reduce", 64 << 20, "mpi4py", "native", 5000.0)]
        (folder / "allreduce.json").write_text(json.dumps({"meta": {"utc": "2026-12-06T10:00:00Z", "loadavg": [1.5]},
                                                           "rows": rows}))
        (folder / "a2a_sr.json").write_text(json.dumps({"rows": [row("sendrecv", 1 << 20, "mpi4py", "native", 100.0),
                                                                 row("sendrecv", 1 << 20, "ringcomm", "auto", 150.0),
                                                                 row("sendrecv", 1 << 20, "ringcomm[torch]", "auto", 90.0),
                                                                 row("sendrecv", 1 << 20, "mpi4py[torch]", "native", 30.0)]}))
        results = [{"impl": i, "ranks": 2, "step_s": s, "samples_per_s": 64 / s} for i, s in (("ringcomm", 0.04), ("torch", 0.06))]
        (folder / "ddp_mlp.json").write_text(json.dumps({"results": results}))
        n4 = [row("all_reduce", 1 << 20, "ringcomm", "auto", 130.0), row("all_reduce", 1 << 20, "ringcomm", "ring", 100.0),
              row("all_reduce", 1 << 20, "ringcomm", "direct", 120.0), row("all_reduce", 4 << 20, "ringcomm", "auto", 400.0),
              row("all_reduce", 4 << 20, "ringcomm", "direct", 380.0)]
        n4[0]["chosen"] = n4[3]["chosen"] = "direct"
        (folder / "n4.json").write_text(json.dumps({"rows": n4}))
    table = round_summary.figures(round_summary.Launch(tmp_path / "L2"))
    # the worst size, what auto ran there and the best forced: a wrong choice, not noise
    assert table["4 ranks: worst auto / best forced (auto ran; best forced)"] == "1.30x at 1M (direct; ring)"
    assert table["1 KiB all_reduce / MPI (auto), numpy / torch"] == "0.35x / 0.40x"
    assert table["64 MiB all_reduce / x+=y floor, numpy / torch / empty"] == "1.30x / - / -"
    # the torch rows over MPI on their own memory, where the launch measured it
    assert table["1M sendrecv / MPI (its own command), numpy / torch / empty"] == "1.50x / 3.00x / -"
    assert table["1M MPI on torch's memory / on numpy's, all_to_all / sendrecv"] == "- / 0.30x"
    assert table["1 KiB all_reduce / MPI (auto), numpy / torch"] == "0.35x / 0.40x"   # no [torch] MPI row: numpy's
    assert table["DDP MLP: ringcomm / torch-on-gloo samples/s (step ms: ringcomm, torch, torch on 'ringcomm')"] == \
        "1.50x (40.0, 60.0)"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "round_summary.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| 1 KiB all_reduce / MPI (auto), numpy / torch | 0.70x / 0.80x | 0.35x / 0.40x |" in out
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "round.sh")]).returncode == 0
