"""The selector: the model's minimum, forcing, the tuning file, explain/simulate, debug logs."""
import json
import logging

import numpy as np
import pytest

from ringcomm import UsageError, algorithms
from ringcomm.selection.cost import Link, Network
from ringcomm.selection.selector import Selector, parse_forced, predict
from ringcomm.testing import run_threads
from ringcomm.selection.tuning import DEFAULT_TUNING, Sweep, Tuning, load_tuning, parse_size, save_tuning

SIZES = [8 << (2 * k) for k in range(13)]       # 8 B .. 128 MiB
SHAPES = [(2, None), (4, None), (16, None), (7, None), (8, (0, 0, 0, 0, 1, 1, 1, 1)),
          (12, tuple(r // 3 for r in range(12))), (5, (0, 0, 0, 1, 1))]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("RINGCOMM_ALGO", raising=False)
    monkeypatch.delenv("RINGCOMM_DEBUG", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # no tuning file of the user's
    monkeypatch.delenv("RINGCOMM_TUNING_FILE", raising=False)


@pytest.mark.parametrize("collective", algorithms.COLLECTIVES)
@pytest.mark.parametrize("size,nodes", SHAPES)
def test_choice_is_the_models_minimum(collective, size, nodes):
    sel = Selector(tuning=Tuning(links={"mpi": (20e-6, 1 / 2e9), "shm": (2e-6, 1 / 10e9)}))
    for nbytes in SIZES:
        for routes in (("mpi", "mpi"), ("shm", "mpi")):
            choice = sel.explain(collective, nbytes, size, nodes=nodes, routes=routes)
            assert set(choice.predicted) == set(algorithms.names(collective))
            assert choice.predicted[choice.algorithm] == min(choice.predicted.values())
            table = dict(predict(collective, nbytes, sel.network(size, nodes, "float32", routes)))
            picked = sel.choose(collective, nbytes, size, nodes=nodes, transport=_Routes(*routes))
            assert table[picked] == min(table.values())


class _Routes:
    name = "composite"

    def __init__(self, intra, inter):
        self.link_names = {"intra": intra, "inter": inter}


class _Named:
    def __init__(self, name):
        self.name = name


class _Routed:
    """Shaped like a routed transport: peer -> the transport that serves it."""
    name = "routed"

    def __init__(self, rank, routes):
        self.rank, self.routes = rank, routes


def test_routes_are_read_from_a_routed_transport_peer_by_peer():
    from ringcomm.selection.selector import routes_of
    shm, mpi = _Named("shm"), _Named("mpi")
    nodes = (0, 0, 1, 1)
    routed = _Routed(0, {1: shm, 2: mpi, 3: mpi})
    assert routes_of(routed, nodes) == ("shm", "mpi")
    assert routes_of(_Routed(0, {1: shm, 2: shm}), (0, 0, 0)) == ("shm", "shm")     # one node
    assert routes_of(_Routed(0, {1: mpi}), (0, 1)) == ("mpi", "mpi")                # one rank per node
    assert routes_of(_Routes("shm", "mpi")) == ("shm", "mpi")
    assert routes_of(_Named("threads")) == ("threads", "threads")
    sel = Selector(tuning=Tuning(links={"mpi": (20e-6, 1 / 1e9), "shm": (2e-6, 1 / 20e9)}))
    big = sel.choose("all_reduce", 256 << 20, 4, nodes=nodes, transport=routed)
    assert big == min(sel.explain("all_reduce", 256 << 20, 4, nodes=nodes, routes=("shm", "mpi")).predicted.items(),
                      key=lambda kv: kv[1])[0]


def test_the_choice_moves_with_size_and_topology():
    sel = Selector(tuning=Tuning(links={"mpi": (20e-6, 1 / 1e9), "shm": (2e-6, 1 / 20e9)}))
    assert sel.choose("all_reduce", 8, 16) == "recursive_doubling"
    assert sel.choose("all_reduce", 256 << 20, 16) in ("ring", "rabenseifner")
    two_nodes = tuple(r // 8 for r in range(16))
    big = sel.choose("all_reduce", 256 << 20, 16, nodes=two_nodes, transport=_Routes("shm", "mpi"))
    assert big.startswith("hierarchical")


def test_dtype_changes_the_reduction_cost():
    sel = Selector()
    f32 = sel.network(4, None, "float32")
    bf16 = sel.network(4, None, "bfloat16")
    assert bf16.intra.gamma > f32.intra.gamma
    assert dict(predict("all_reduce", 1 << 20, bf16))["ring"] > dict(predict("all_reduce", 1 << 20, f32))["ring"]


def test_forcing_globally_and_per_collective():
    assert parse_forced("ring") == {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring"}
    assert parse_forced(" all_reduce=tree , broadcast=pipeline ") == {"all_reduce": "tree", "broadcast": "pipeline"}
    assert parse_forced("") == {}
    sel = Selector(forced=parse_forced("all_reduce=tree"))
    assert sel.choose("all_reduce", 8, 64) == "tree"
    assert sel.explain("all_reduce", 8, 64).reason.startswith("forced")


@pytest.mark.parametrize("spec,fragment", [
    ("rign", "unknown algorithm 'rign'"),
    ("all_reduce=bogus", "unknown all_reduce algorithm 'bogus' (expected one of ring, tree"),
    ("allreduce=ring", "unknown collective 'allreduce' (expected one of all_reduce"),
    ("broadcast=ring", "unknown broadcast algorithm 'ring' (expected one of binomial, pipeline, one_shot, direct)"),
])
def test_unknown_names_are_a_clear_error_listing_valid_ones(spec, fragment):
    with pytest.raises(UsageError) as info:
        parse_forced(spec)
    assert fragment in str(info.value) and "RINGCOMM_ALGO" in str(info.value)


def test_ringcomm_algo_reaches_every_communicator_and_is_logged(monkeypatch, caplog):
    monkeypatch.setenv("RINGCOMM_ALGO", "all_reduce=tree")

    def body(comm):
        x = np.full(10, comm.rank + 1.0)
        comm.all_reduce(x)
        return x
    with caplog.at_level(logging.INFO, logger="ringcomm"):
        results = run_threads(3, body)
    assert all((x == 6).all() for x in results)
    lines = [r.getMessage() for r in caplog.records if r.name == "ringcomm.selector"]
    assert len(lines) == 3 and all("all_reduce #0: tree" in m and "RINGCOMM_ALGO" in m for m in lines)


def new_communicator():
    from ringcomm import Communicator
    from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
    return Communicator(ThreadsTransport(ThreadsWorld(1), 0))


def test_an_algorithm_for_equal_counts_forced_by_ringcomm_algo_leaves_uneven_calls_to_the_cost_model(
        monkeypatch, caplog):
    """RINGCOMM_ALGO=all_to_all=bruck ran bruck's equal blocks on uneven splits: a false
    MismatchError, or an output with elements never written (tests/test_mpi_collectives.py has
    the mpirun case)."""
    monkeypatch.setenv("RINGCOMM_ALGO", "all_to_all=bruck")
    splits = [[1, 2, 3], [2, 0, 1], [1, 1, 2]]   # [i][j]: what rank i sends rank j

    def body(comm):
        r = comm.rank
        x = np.concatenate([np.full(splits[r][j], 10.0 * r + j) for j in range(3)])
        out = np.zeros(sum(row[r] for row in splits))
        comm.all_to_all(out, x, [row[r] for row in splits], splits[r])
        even = np.zeros(6)
        comm.all_to_all(even, np.arange(6.0) + 10 * r)
        return out, even
    with caplog.at_level(logging.INFO, logger="ringcomm"):
        results = run_threads(3, body)
    for r, (out, even) in enumerate(results):
        assert list(out) == [10.0 * i + r for i in range(3) for _ in range(splits[i][r])]
        assert list(even) == [10.0 * i + 2 * r + k for i in range(3) for k in range(2)]
    lines = [m.getMessage() for m in caplog.records if m.name == "ringcomm.selector"]
    assert sum("all_to_all #0" in m and "bruck" not in m.split("(")[0] and "needs equal counts" in m
               for m in lines) == 3, lines
    assert sum("all_to_all #1: bruck" in m and "(RINGCOMM_ALGO)" in m for m in lines) == 3, lines
    assert Selector(forced={"all_to_all": "bruck"}).choose("all_to_all", 0, 3, uneven=True) != "bruck"
    assert Selector(forced={"all_to_all": "bruck"}).choose("all_to_all", 96, 3) == "bruck"


def test_bad_ringcomm_algo_fails_when_the_communicator_is_made(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", "all_reduce=nope")
    with pytest.raises(UsageError, match="nope"):
        new_communicator()


def test_debug_env_logs_to_stderr(tmp_path):
    import subprocess
    import sys
    code = ("import numpy as np; from ringcomm.testing import run_threads; "
            "run_threads(2, lambda c: c.all_reduce(np.ones(4)))")
    env = {"RINGCOMM_DEBUG": "info", "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1]),
           "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("all_reduce #0: recursive_doubling") == 2, proc.stderr


def sample_tuning():
    # recursive doubling twice as fast up to 4 KiB, ring twice as fast from 32 KiB
    sizes = (8, 64, 512, 4096, 32768, 262144, 1 << 20)
    sweep = Sweep("all_reduce", (2,), ("mpi", "mpi"), "float32", sizes,
                  {"ring": (40e-6, 40e-6, 50e-6, 80e-6, 100e-6, 400e-6, 900e-6),
                   "recursive_doubling": (20e-6, 20e-6, 25e-6, 40e-6, 200e-6, 800e-6, 1.8e-3)})
    return Tuning(links={"mpi": (7e-6, 1 / 2.5e9), "shm": (1e-6, 1 / 9e9)},
                  gammas={"float32": 1 / 6e9, "bfloat16": 1 / 0.3e9}, sweeps=(sweep,), source="test")


def test_tuning_file_round_trips(tmp_path):
    path = save_tuning(sample_tuning(), tmp_path / "t.json", host="h")
    loaded = load_tuning(path)
    assert loaded.links["mpi"] == (7e-6, 1 / 2.5e9) and loaded.links["shm"] == (1e-6, 1 / 9e9)
    assert loaded.gammas["bfloat16"] == 1 / 0.3e9
    assert loaded.sweeps == sample_tuning().sweeps
    assert loaded.link("mpi", "float32") == Link(7e-6, 1 / 2.5e9, 1 / 6e9)
    assert loaded.source == str(path)


def test_init_loads_the_tuning_file_from_the_environment(tmp_path, monkeypatch):
    path = save_tuning(sample_tuning(), tmp_path / "t.json")
    monkeypatch.setenv("RINGCOMM_TUNING_FILE", str(path))
    sel = Selector.from_env()
    assert sel.tuning.links["mpi"] == (7e-6, 1 / 2.5e9)
    # Measured sweep for this shape overrules the model where they disagree by more than 10%.
    model = Selector(tuning=Tuning(links=sel.tuning.links, gammas=sel.tuning.gammas))
    for nbytes in (8, 1024, 1 << 20):
        measured = sel.explain("all_reduce", nbytes, 2).measured
        fastest = min(measured, key=measured.get)
        modelled = model.choose("all_reduce", nbytes, 2)
        expected = modelled if measured[modelled] <= 1.10 * measured[fastest] else fastest
        assert sel.choose("all_reduce", nbytes, 2, transport=_Routes("mpi", "mpi")) == expected
    assert sel.choose("all_reduce", 1 << 20, 2) == "ring"            # 0.9 ms against 1.8 ms measured
    assert sel.choose("all_reduce", 64, 2) == "recursive_doubling"
    assert sel.explain("all_reduce", 1024, 4).reason == "lowest predicted time"   # other shape: model
    assert sel.explain("all_reduce", 1024, 2, dtype="float64").measured             # reduces alike
    assert not sel.explain("all_reduce", 1024, 2, dtype="bfloat16").measured        # 20x slower


def test_one_spoiled_size_cannot_flip_the_measured_choice():
    from ringcomm.selection.tuning import running_median
    sizes = tuple(8 << k for k in range(7))
    spike = Sweep("all_reduce", (2,), ("mpi", "mpi"), "float32", sizes,
                  {"ring": (9.0,) * 7, "recursive_doubling": (1.0, 1.0, 1.0, 50.0, 1.0, 1.0, 1.0)})
    assert spike.at(sizes[3])["recursive_doubling"] == 1.0
    assert running_median((5, 1, 2, 3, 100, 4, 5)) == (2, 3, 3, 3, 4, 5, 5)


def test_a_measurement_overrules_the_model_only_by_a_clear_margin():
    from ringcomm.selection.selector import decide
    predicted = {"ring": 1.0, "tree": 2.0}
    assert decide(predicted, {})[0] == "ring"
    assert decide(predicted, {"ring": 1.05, "tree": 1.0})[0] == "ring"     # within 10%: noise
    assert decide(predicted, {"ring": 1.5, "tree": 1.0})[0] == "tree"


def test_default_location_and_no_file_means_defaults(tmp_path, monkeypatch):
    assert load_tuning() is DEFAULT_TUNING
    path = save_tuning(sample_tuning(), tmp_path / "cache" / "ringcomm" / "tuning.json")
    assert load_tuning().links["mpi"] == (7e-6, 1 / 2.5e9)
    path.unlink()
    assert load_tuning() is DEFAULT_TUNING


@pytest.mark.parametrize("text,fragment", [
    ("{not json", "not readable JSON"),
    ("[]", "expected a JSON object"),
    ('{"format": 99}', '"format" is 99'),
    ('{"format": 1, "links": {"mpi": {"alpha": -1, "beta": 1e-9}}}', "links.mpi.alpha must be a positive number"),
    ('{"format": 1, "gamma": {"float32": "fast"}}', "gamma.float32 must be a positive number"),
    ('{"format": 1, "sweeps": [{"collective": "all_reduce"}]}', "sweeps[0] is malformed"),
    ('{"format": 1, "sweeps": [{"collective": "all_reduce", "local_sizes": [2], "routes": ["mpi", "mpi"],'
     ' "sizes": [8], "seconds": {"warp": [1e-5]}}]}', "unknown all_reduce algorithms ['warp']"),
])
def test_corrupt_tuning_file_is_a_clear_error_naming_the_file(tmp_path, monkeypatch, text, fragment):
    path = tmp_path / "bad.json"
    path.write_text(text)
    monkeypatch.setenv("RINGCOMM_TUNING_FILE", str(path))
    with pytest.raises(UsageError) as info:
        new_communicator()
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_missing_explicit_tuning_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGCOMM_TUNING_FILE", str(tmp_path / "nope.json"))
    with pytest.raises(UsageError, match="nope.json does not exist"):
        Selector.from_env()


def test_parse_size():
    assert [parse_size(s) for s in ("8", "64K", "1M", "32MiB", "2G", "1.5K")] == [8, 65536, 1 << 20, 32 << 20, 2 << 30, 1536]
    with pytest.raises(UsageError, match="expected bytes"):
        parse_size("lots")


def test_flat_algorithms_see_the_slowest_link_and_shared_nics():
    intra, inter = Link(1e-6, 1e-11, 1e-10), Link(1e-5, 1e-10, 1e-10)
    assert Network(intra, inter, (4,)).link == intra
    assert Network(intra, inter, (4, 4)).link == inter
    assert Network(intra, inter, (4, 4), nics=1).link.beta == pytest.approx(4e-10)


def test_explain_cli_prints_every_candidate_and_the_choice(capsys):
    from ringcomm.selection.explain import main
    assert main(["--collective", "all_reduce", "--size", "1M", "--ranks", "16", "--ranks-per-node", "8"]) == 0
    out = capsys.readouterr().out
    for name in algorithms.names("all_reduce"):
        assert name in out
    assert "<- chosen" in out and "choice:" in out and "2 node(s)" in out
    assert main(["--size", "huge"]) == 2
    assert main(["--collective", "broadcast", "--intra", "shm", "--fast-reads"]) == 0
    out = capsys.readouterr().out
    assert "a host whose reads are fast" in out and "direct" in out.split("<- chosen")[0].splitlines()[-1]


def test_simulate_cli_prints_crossovers_up_to_4096_ranks(capsys, tmp_path):
    from ringcomm.selection.simulate import main
    assert main(["--sizes", "1K,64M"]) == 0
    out = capsys.readouterr().out
    assert "4096 ranks" in out and "crossovers" in out and "hierarchical" in out
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"tiny": {"ranks_per_node": 2, "intra": {"alpha_us": 1, "GBps": 10},
                                           "inter": {"alpha_us": 10, "GBps": 1}, "reduce_GBps": 5}}))
    assert main(["--config", str(config), "--max-ranks", "8"]) == 0
    assert "== tiny" in capsys.readouterr().out
    config.write_text('{"broken": {"ranks_per_node": 2}}')
    assert main(["--config", str(config)]) == 2
    assert "malformed" in capsys.readouterr().err


@pytest.mark.parametrize("collective", algorithms.COLLECTIVES)
def test_on_one_node_the_inter_node_link_never_matters(collective):
    link, other = Link(3e-6, 1 / 4e9, 1 / 7e9), Link(1.0, 1.0, 1.0)
    for name in algorithms.names(collective):
        algo = algorithms.get(collective, name)
        for n in (2, 5, 8):
            assert algo.cost(1 << 16, Network(link, other, (n,))) == pytest.approx(
                algo.cost(1 << 16, Network(link, link, (n,))))


def test_oversubscribed_ranks_are_priced_per_step_and_keep_few_step_algorithms_longer():
    # 4 ranks sharing 2 cores: each byte gets half a core and each step waits for a peer to be
    # scheduled, so the one-round window and few-step schedules win to larger sizes than with a
    # core per rank (the case: rabenseifner at 64 KiB, 6.6x slower than one_shot).
    from ringcomm.selection.cost import HANDOFF, crowded
    link = Link(10e-6, 1 / 4e9, 1 / 5e9)
    busy = crowded(link, 2.0)
    assert busy.alpha == pytest.approx(link.alpha + HANDOFF) and busy.beta == 2 * link.beta
    assert crowded(link, 1.0) is link and crowded(None, 2.0) is None
    dedicated, shared = Selector(), Selector()
    shared.set_host(4, 2)
    kw = dict(routes=("shm", "shm"), window_bytes=64 << 10)
    # Every step of a ring pays a hand-off; the one-shot round pays one: the ring falls further behind.
    ded, crowd = (s.explain("all_reduce", 16 << 10, 4, **kw).predicted for s in (dedicated, shared))
    assert crowd["ring"] - ded["ring"] >= 6 * HANDOFF > crowd["one_shot"] - ded["one_shot"] >= HANDOFF
    assert shared.explain("all_reduce", 64 << 10, 4, **kw).algorithm == "one_shot"
    choice = shared.explain("all_reduce", 64 << 10, 4, **kw)
    assert choice.network.crowding == 2.0
    from ringcomm.selection.selector import describe
    assert "oversubscribed: 2 ranks per core" in describe(choice)
    shared.set_host(2, 2)   # a core each again: the dedicated model
    assert shared.explain("all_reduce", 64 << 10, 4, **kw).predicted == \
        dedicated.explain("all_reduce", 64 << 10, 4, **kw).predicted


def test_oversubscribed_direct_reads_pay_a_share_of_a_core_but_no_hand_off():
    # A CMA read waits for no peer: pricing it like a message step (alpha + HANDOFF) ran
    # Rabenseifner at 1 MiB on 4 ranks / 2 cores, 1.9-2.1x slower than the window algorithms.
    from ringcomm.selection.cost import HANDOFF, crowded_reads
    link = Link(30e-6, 1 / 8.5e9, 1 / 5e9)
    busy = crowded_reads(link, 2.0)
    assert busy.alpha == pytest.approx(2 * link.alpha) and busy.alpha < link.alpha + HANDOFF
    assert busy.beta == 2 * link.beta
    assert crowded_reads(link, 1.0) is link and crowded_reads(None, 2.0) is None
    shared = Selector()
    shared.set_host(4, 2)
    choice = shared.explain("all_reduce", 1 << 20, 4, routes=("shm", "shm"), window_bytes=512 << 10, direct=True)
    assert choice.algorithm in ("direct", "one_shot"), choice.predicted


def test_oversubscribed_compiled_rounds_pay_a_hand_off_per_rank_sharing_a_core():
    # A round waits for every rank of the node, and with 4 ranks on 2 cores two of them are off a
    # core at any moment: one hand-off per round ran one_shot at 1 MiB (two rounds of 512 KiB),
    # measured 1.2-1.8x slower than direct. Dedicated cores: the link as it was.
    from ringcomm.selection.cost import HANDOFF, crowded, crowded_round
    link = Link(1.5e-6, 1 / 8.5e9, 0.0)
    busy = crowded_round(link, 2.0)
    assert busy.alpha == pytest.approx(link.alpha + 2 * HANDOFF) and busy.beta == crowded(link, 2.0).beta
    assert crowded_round(link, 1.5).alpha == pytest.approx(link.alpha + 1.5 * HANDOFF)
    assert crowded_round(link, 1.0) is link and crowded_round(None, 2.0) is None
    shared = Selector()
    shared.set_host(4, 2)
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True, compiled=True)
    picks = {size: shared.explain("all_reduce", size, 4, **kw).algorithm for size in (64 << 10, 512 << 10, 1 << 20)}
    assert picks == {64 << 10: "one_shot", 512 << 10: "one_shot", 1 << 20: "direct"}, picks



def test_in_cache_broadcasts_reduce_scatters_and_all_to_alls_price_the_window_copies_from_cache():
    # A CMA read pins every page whatever the cache holds; the window's copies run from cache
    # while every rank's vector fits in half of it. 2 shm ranks, 32 MiB of cache: one_shot to
    # 8 MiB, direct beyond; with no cache known, the plain window price sends 4 MiB to direct.
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True)
    cached, unknown = Selector(), Selector()
    cached.set_host(2, 2, cache_bytes=32 << 20)
    unknown.set_host(2, 2, cache_bytes=0)
    for collective in ("broadcast", "reduce_scatter", "all_to_all"):
        assert cached.explain(collective, 4 << 20, 2, **kw).algorithm == "one_shot"
        assert unknown.explain(collective, 4 << 20, 2, **kw).algorithm == "direct"
        assert cached.explain(collective, 64 << 20, 2, **kw).algorithm == "direct"
    # all_gather's direct writes each part once: measured no slower than one_shot in cache
    assert cached.explain("all_gather", 4 << 20, 2, **kw).predicted == \
        unknown.explain("all_gather", 4 << 20, 2, **kw).predicted
    net = cached.explain("broadcast", 8 << 20, 2, **kw).network
    assert net.window_beta(8 << 20) == net.window_cached.beta < net.window.beta
    assert net.window_beta((8 << 20) + 1) == net.window.beta
    from ringcomm.selection.selector import describe
    assert "shared window from cache" in describe(cached.explain("broadcast", 1 << 20, 2, **kw))
    # Ranks sharing cores share caches: no cached price.
    crowded = Selector()
    crowded.set_host(4, 2, cache_bytes=32 << 20)
    assert crowded.explain("broadcast", 1 << 20, 4, **kw).network.window_cached is None
    # Threads have no cached window in the tuning: nothing changes for them.
    threads = cached.explain("broadcast", 1 << 20, 2, routes=("threads", "threads"), window_bytes=512 << 10)
    assert threads.network.window_cached is None


def test_in_cache_all_reduces_price_the_compiled_round_from_cache_except_where_direct_reads_are_fast():
    # Measured on 2 ranks of the EPYC host: one_shot 250-371 us at 4 MiB, direct 316-401 (and
    # MPI_Allreduce 343-365 us in the launches where auto ran direct); from 16 MiB direct wins.
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True, compiled=True)
    cached, unknown, fast, crowded = Selector(), Selector(), Selector(), Selector()
    cached.set_host(2, 2, cache_bytes=32 << 20)
    unknown.set_host(2, 2, cache_bytes=0)
    fast.set_host(2, 2, cache_bytes=32 << 20, fast_reads=True)
    crowded.set_host(4, 2, cache_bytes=32 << 20)
    picks = {size: cached.explain("all_reduce", size, 2, **kw).algorithm for size in (1 << 20, 4 << 20, 8 << 20,
                                                                                     16 << 20, 64 << 20)}
    assert picks == {1 << 20: "one_shot", 4 << 20: "one_shot", 8 << 20: "one_shot", 16 << 20: "direct",
                     64 << 20: "direct"}, picks
    assert unknown.explain("all_reduce", 4 << 20, 2, **kw).algorithm == "direct"
    assert fast.explain("all_reduce", 4 << 20, 2, **kw).algorithm == "direct"
    assert fast.explain("all_reduce", 4 << 20, 2, **kw).network.round_cached is None
    assert crowded.explain("all_reduce", 4 << 20, 4, **kw).network.round_cached is None
    net = cached.explain("all_reduce", 8 << 20, 2, **kw).network
    assert net.round_beta(8 << 20) == net.round_cached.beta < net.round.beta
    assert net.round_beta((8 << 20) + 1) == net.round.beta
    assert net.round_cached.gamma == 0.0   # the round reduces as it reads, like the plain one
    from ringcomm.selection.selector import describe
    assert "compiled all-reduce round from cache" in describe(cached.explain("all_reduce", 4 << 20, 2, **kw))
    # Python rounds (no compiled round) keep their price: no cached round to speak of.
    assert cached.explain("all_reduce", 4 << 20, 2, **dict(kw, compiled=False)).network.round_cached is None


def test_a_tuning_file_that_measured_the_round_is_not_second_guessed_from_cache(tmp_path):
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True, compiled=True)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "links": {"shm-round": {"alpha": 2e-6, "beta": 1 / 9e9}}}))
    tuned = Selector(tuning=load_tuning(path))
    tuned.set_host(2, 2, cache_bytes=32 << 20)
    net = tuned.explain("all_reduce", 4 << 20, 2, **kw).network
    assert net.round_cached is None and net.round_beta(4 << 20) == pytest.approx(1 / 9e9)


def test_the_last_level_cache_is_read_from_sysfs_and_unknown_is_zero(tmp_path):
    from ringcomm.topology import last_level_cache
    for index, size in enumerate(["48K", "32K", "2048K", "32768K"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")
    assert last_level_cache(str(tmp_path)) == 32 << 20
    assert last_level_cache(str(tmp_path / "absent")) == 0
    (tmp_path / "index3" / "size").write_text("lots\n")
    assert last_level_cache(str(tmp_path)) == 0


def test_the_compiled_direct_all_to_all_is_priced_where_every_rank_runs_it():
    # Measured on 2 ranks of the fast-read host: direct 6.3 us from 1 KiB to 32 KiB, one_shot
    # 3.5 at 1 KiB, 5.7 at 16 KiB, 6.7 at 32 KiB, 9.8 at 64 KiB (tuning.py, "shm-direct-round").
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True)
    fast = Selector()
    fast.set_host(2, 2, cache_bytes=480 << 20, fast_reads=True)
    chosen = {size: fast.explain("all_to_all", size, 2, compiled=True, **kw).algorithm
              for size in (1 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 64 << 20)}
    assert chosen == {1 << 10: "one_shot", 16 << 10: "one_shot", 32 << 10: "direct", 64 << 10: "direct",
                      256 << 10: "direct", 1 << 20: "direct", 64 << 20: "direct"}, chosen
    net = fast.explain("all_to_all", 1 << 20, 2, compiled=True, **kw).network
    assert net.direct_round == DEFAULT_TUNING.link("shm-direct-round").with_gamma(0.0)
    from ringcomm.selection.selector import describe
    assert "compiled direct all-to-all" in describe(fast.explain("all_to_all", 1 << 20, 2, compiled=True, **kw))
    # Python rounds somewhere in the job, or a host that reads through a detour: the Python price.
    assert fast.explain("all_to_all", 256 << 10, 2, compiled=False, **kw).algorithm == "one_shot"
    assert fast.explain("all_to_all", 1 << 20, 2, compiled=False, **kw).network.direct_round is None
    slow = Selector()
    slow.set_host(2, 2, cache_bytes=480 << 20)
    assert slow.explain("all_to_all", 1 << 20, 2, compiled=True, **kw).network.direct_round is None


def test_hosts_whose_reads_are_fast_price_direct_reads_with_their_own_link_unless_a_file_measured_them(tmp_path):
    # The two hosts this VM lands on: forced direct beat one_shot from 1 MiB on the fast-read one
    # (broadcast 40 us against 74), and lost there on the other; the job agrees which it is.
    kw = dict(routes=("shm", "shm"), window_bytes=512 << 10, direct=True, compiled=True)
    fast, slow = Selector(), Selector()
    fast.set_host(2, 2, cache_bytes=480 << 20, fast_reads=True)
    slow.set_host(2, 2, cache_bytes=480 << 20)
    for collective in ("broadcast", "all_reduce", "all_gather", "gather", "scatter", "all_to_all"):
        assert fast.explain(collective, 1 << 20, 2, **kw).algorithm == "direct", collective
        assert slow.explain(collective, 1 << 20, 2, **kw).algorithm == "one_shot", collective
        if collective != "all_to_all":   # compiled there: next test
            assert fast.explain(collective, 256 << 10, 2, **kw).algorithm == "one_shot", collective
    # all_to_all's one_shot loses its cached price there (both ranks copy both ways at once):
    # priced as all_gather's one_shot, which moves the same bytes.
    a2a = fast.explain("all_to_all", 1 << 20, 2, **kw).predicted["one_shot"]
    assert a2a == fast.explain("all_gather", 1 << 20, 2, **kw).predicted["one_shot"]
    assert a2a > slow.explain("all_to_all", 1 << 20, 2, **kw).predicted["one_shot"]
    net = fast.explain("broadcast", 1 << 20, 2, **kw).network
    assert net.fast_reads and net.direct == DEFAULT_TUNING.link("shm-direct-fast")
    from ringcomm.selection.selector import describe
    assert "a host whose reads are fast" in describe(fast.explain("broadcast", 1 << 20, 2, **kw))
    assert "a host whose reads are fast" not in describe(slow.explain("broadcast", 1 << 20, 2, **kw))
    # Threads have no fast variant: their link is unchanged.
    threads = fast.explain("broadcast", 1 << 20, 2, routes=("threads", "threads"), window_bytes=512 << 10,
                           direct=True)
    assert threads.network.direct == DEFAULT_TUNING.link("threads-direct") and not threads.network.fast_reads
    # A tuning file that measured "shm-direct" is this host's own answer: the fast guess steps aside.
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "links": {"shm-direct": {"alpha": 40e-6, "beta": 1 / 4e9}}}))
    tuned = Selector(tuning=load_tuning(path))
    tuned.set_host(2, 2, cache_bytes=480 << 20, fast_reads=True)
    net = tuned.explain("broadcast", 1 << 20, 2, **kw).network
    assert net.direct == Link(40e-6, 1 / 4e9, net.direct.gamma) and not net.fast_reads


@pytest.mark.parametrize("tool,argv,argument", [
    ("explain", ["--dtype", "nonsense"], "--dtype"), ("explain", ["--intra", "carrier-pigeon"], "--intra"),
    ("explain", ["--inter", "smoke"], "--inter"), ("explain", ["--window", "garbage"], "--window"),
    ("simulate", ["--max-ranks", "-5"], "--max-ranks"), ("simulate", ["--max-ranks", "1"], "--max-ranks"),
    ("tune", ["--max-size", "garbage"], "--max-size"), ("tune", ["--rounds", "0"], "--rounds")])
def test_the_tools_refuse_garbage_arguments_naming_them(tool, argv, argument, capsys):
    """They once priced unknown dtypes and transports as the defaults, printed empty tables, or
    (tune) died in a traceback from deep inside; tune refuses before any rank meets another."""
    import importlib
    main = importlib.import_module(f"ringcomm.selection.{tool}").main
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert argument in capsys.readouterr().err
