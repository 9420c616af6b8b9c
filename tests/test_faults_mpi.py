"""Fault injection under real mpirun: what every rank raised, and how fast."""
import re
import time
from pathlib import Path

import pytest

from mpi_util import run_mpi, survivors_kept

pytestmark = pytest.mark.mpi
LINE = re.compile(r"^rank (\d+) after ([\d.]+)s: (\w+)(?::(.*))?$", re.M)


def outcomes(out_dir):
    text = "".join(p.read_text() for p in sorted(Path(out_dir).glob("rank*.txt")))
    return {int(r): (float(t), kind, msg or "") for r, t, kind, msg in LINE.findall(text)}


def shm_entries():
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.iterdir() if "ringcomm" in p.name) if shm.exists() else []


@pytest.fixture(autouse=True)
def no_shm_leaks():
    before = shm_entries()
    yield
    assert shm_entries() == before, "shared-memory segments left behind in /dev/shm"


# 100,000 float32 go through the ring (messages with envelopes); 100 through the one-shot window
# (no messages: the slots' stamps, and peers reading them, must catch the same faults).
COUNTS = pytest.mark.parametrize("count", [100_000, 100], ids=["ring", "one-shot"])


@COUNTS
@pytest.mark.parametrize("detail", [False, True], ids=["default", "debug-detail"])
@pytest.mark.parametrize("scenario,field", [("extra", "count"), ("dtype", "dtype"), ("skip", "collective")])
def test_mismatch_raises_on_every_rank_within_seconds(scenario, field, detail, count, tmp_path):
    env = {"RINGCOMM_TIMEOUT": "20", "FAULTS_OUT": str(tmp_path)}
    if detail:
        env["RINGCOMM_DEBUG"] = "detail"
    run_mpi(3, "faults.py", scenario, count, env=env)
    seen = outcomes(tmp_path)
    assert sorted(seen) == [0, 1, 2]
    for rank, (took, kind, msg) in seen.items():
        assert kind in ("MismatchError", "PeerAbortedError"), (rank, kind, msg)
        assert took < 5.0, (rank, took)   # detection itself takes ~0.1 s; slack for a loaded CI box
    mismatches = [msg for _, kind, msg in seen.values() if kind == "MismatchError"]
    assert mismatches and all(field in m for m in mismatches), mismatches
    if detail:   # every rank names the odd rank itself
        assert all(kind == "MismatchError" and "ranks [1]" in msg for _, kind, msg in seen.values())


@COUNTS
def test_absent_rank_makes_the_others_time_out_naming_it(count, tmp_path):
    proc = run_mpi(3, "faults.py", "absent", count, env={"RINGCOMM_TIMEOUT": "2", "FAULTS_OUT": str(tmp_path)})
    seen = outcomes(tmp_path)
    assert seen[1][1] == "ok"
    for rank in (0, 2):
        took, kind, msg = seen[rank]
        assert kind == "CommTimeoutError" and 2.0 <= took < 4.0, seen[rank]
        assert "all_reduce #1" in msg and "waiting to" in msg
    assert re.search(r"waiting to (send to|receive from) rank 1 ", seen[0][2]), seen[0]
    assert proc.stderr.count("ringcomm flight recorder") == 2


@pytest.mark.parametrize("backend", ["ringcomm", "mpi"])
def test_a_receive_nobody_answers_times_out_and_the_flight_recorder_names_it(backend, tmp_path):
    proc = run_mpi(2, "faults.py", "recv-absent", 100, env={"RINGCOMM_TIMEOUT": "2", "RINGCOMM_BACKEND": backend,
                                                             "FAULTS_OUT": str(tmp_path)})
    seen = outcomes(tmp_path)
    assert seen[0][1] == "ok"
    took, kind, msg = seen[1]
    assert kind == "CommTimeoutError" and 2.0 <= took < 4.0, seen[1]
    assert "recv p2p#1 from rank 0 (tag 11) on rank 1: timed out" in msg
    assert proc.stderr.count("ringcomm flight recorder, rank 1: recv p2p#1 from rank 0 (tag 11)") == 1, proc.stderr
    assert re.search(r"p2p#1 +recv +100 x float32 +from rank 0 tag 11 +failed: CommTimeoutError", proc.stderr)


def test_sigkilled_rank_ends_the_job_nonzero_within_seconds(tmp_path):
    start = time.monotonic()
    proc = run_mpi(3, "faults.py", "kill", env={"RINGCOMM_TIMEOUT": "60", "FAULTS_OUT": str(tmp_path)},
                   check=False, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("mode,count,nodes", [("p2p", 100, 1), ("p2p", 1 << 18, 1), ("all_reduce", 100, 1),
                                              ("all_reduce", 1 << 18, 1), ("all_reduce", 1 << 18, 2)])
def test_the_peers_of_a_killed_rank_raise_within_a_second_naming_its_death(mode, count, nodes, tmp_path):
    """With the launcher's clean-up off, a dead rank's peers live on. Those on its node see that
    its process ended (transport/shm) and say so within a second, not at the 60 s timeout; in a
    collective, those on other nodes hear it from them (Communicator._fail; a send or receive
    there waits out its timeout: docs/reliability.md). Before round fifty-two every survivor
    waited out its timeout, and a send then blamed a recv the program had not posted."""
    n = 2 * nodes if nodes > 1 else 3
    job, died, reports = _rank_1_killed(n, nodes, mode, count, tmp_path)
    assert sorted(reports) == [p for p in range(n) if p != 1], job.stdout + job.stderr
    for rank, (when, what) in reports.items():   # or a CMA read of the dead rank's memory saw it first
        assert re.match(r"(PeerAbortedError|CommError): ", what) and \
            re.search(r"rank 1 \(pid \d+\)(?: is no longer running|: ESRCH \(the process is gone\))", what), \
            (rank, what)
        assert when - died < 2.0, (rank, when - died, what)


def _rank_1_killed(n: int, nodes: int, mode: str, count: int, tmp_path) -> tuple:
    """Run mpi_jobs/peer_killed.py on ``n`` ranks as ``nodes`` pretend nodes with the survivors
    kept alive; (the job, when rank 1 died, {rank: (when it reported, what it reported)})."""
    node_id = f'RINGCOMM_NODE_ID=n$((PMI_RANK * {nodes} / {n})) exec "$0" "$@"'
    job = run_mpi(n, "peer_killed.py", mode, count, tmp_path, env={"RINGCOMM_TIMEOUT": "60"}, check=False,
                  timeout=120, **survivors_kept("sh", "-c", node_id))
    died = float((tmp_path / "died.txt").read_text())
    reports = {int(m[0]): (float(m[1]), m[2])
               for path in tmp_path.glob("rank*.txt")
               for m in re.findall(r"^rank (\d+) at ([\d.]+): (.*)$", path.read_text(), re.M)}
    return job, died, reports


@pytest.mark.parametrize("mode,count", [("pairs", 100), ("pairs", 1 << 18), ("split", 100), ("split", 1 << 18),
                                        ("split_ring", 100), ("split_ring", 1 << 18)])
def test_a_killed_ranks_partner_raises_within_a_second_off_the_window_and_names_it_as_its_communicator_does(
        mode, count, tmp_path):
    """pairs: 4 ranks on 2 pretend nodes, each exchanging with its partner r ^ 1 alone. No window
    spans a communicator that reaches another node, and a send or receive watched its peer's
    process only through one, so rank 0 waited out the 60 s timeout for rank 1 of its own node;
    now it asks the route's transport (Transport.peer_gone). split: 4 ranks on one node, where
    rank 1 is rank 0 of the odd ranks' sub-communicator; its partner said "rank 1 (pid N)", a
    rank its communicator of two does not have, from the window's waits and (split_ring, an
    all-reduce forced to the ring) from the transport's. Ranks 2 and 3 (pairs) or 0 and 2
    (split) never meet rank 1 and stop on their own."""
    job, died, reports = _rank_1_killed(4, 2 if mode == "pairs" else 1, mode, count, tmp_path)
    partner = 0 if mode == "pairs" else 3
    assert sorted(reports) == [0, 2, 3], job.stdout + job.stderr
    for rank, (when, what) in reports.items():
        if rank != partner:
            assert what == "untouched", (rank, what)
    when, what = reports[partner]
    if mode == "pairs":
        named = r"rank 1 \(pid \d+\) is no longer running"
    else:
        named = r"rank 0 of this communicator \(rank 1 of the job, pid \d+\) is no longer running"
    if count > 1000:   # or a CMA read of the dead rank's memory saw it first, in the job's numbering
        named += r"|of rank 1 \(pid \d+\): ESRCH \(the process is gone\)"
    assert re.match(r"(PeerAbortedError|CommError): ", what) and re.search(named, what), what
    assert when - died < 2.0, (when - died, what)


def test_mpi_transport_refuses_a_message_of_the_wrong_length():
    out = run_mpi(2, "mpi_lengths.py").stdout
    assert "8->16: MismatchError: rank 1: the message from rank 0 has 8 bytes, the receive expected 16" in out
    assert "16->8: MismatchError: rank 1: a message from rank 0 does not fit the receive of 8 bytes" in out
    assert "8->8: ok=True" in out


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("collective", ["broadcast", "reduce", "gather", "scatter"])
def test_a_rooted_collective_mismatch_raises_on_every_rank_not_only_the_odd_ones_neighbours(collective, n,
                                                                                               tmp_path):
    """The last rank passes 3 more elements: ranks whose own messages all matched (the root and the
    other leaves) must not return normally either (the confirmation barrier)."""
    env = {"RINGCOMM_TIMEOUT": "20", "FAULTS_OUT": str(tmp_path)}
    started = time.monotonic()
    run_mpi(n, "faults.py", f"rooted-{collective}", 10, env=env, timeout=60, check=False)
    got = outcomes(tmp_path)
    assert sorted(got) == list(range(n)), got
    for rank, (took, kind, msg) in got.items():
        assert kind in ("MismatchError", "PeerAbortedError"), (rank, kind, msg)
        assert took < 5, (rank, took, msg)
    assert time.monotonic() - started < 45


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("count", [1, 100_000])
def test_a_reduce_whose_ranks_name_different_roots_raises_on_every_rank_at_once(n, count, tmp_path):
    """Rank 0 names root 1, the others root 0: each rank waits for its send to the root it
    believes in, none for a receive, so only a message its schedule never takes shows the
    disagreement (it was a timeout). Over shared memory a send waits for its receiver; where sends
    complete eagerly (MPI, threads) such ranks return without a result, as MPI's would."""
    env = {"RINGCOMM_TIMEOUT": "20", "FAULTS_OUT": str(tmp_path)}
    run_mpi(n, "faults.py", "root", count, env=env, timeout=60, check=False)
    got = outcomes(tmp_path)
    assert sorted(got) == list(range(n)), got
    for rank, (took, kind, msg) in got.items():
        assert kind in ("MismatchError", "PeerAbortedError"), (rank, kind, msg)
        assert took < 5, (rank, took, msg)
    assert any(kind == "MismatchError" and "disagree on the root" in msg for _, kind, msg in got.values()), got


@COUNTS
def test_abort_reason_reaches_every_peer(count, tmp_path):
    env = {"RINGCOMM_TIMEOUT": "20", "FAULTS_OUT": str(tmp_path)}
    run_mpi(3, "faults.py", "abort", count, env=env, timeout=60, check=False)
    got = outcomes(tmp_path)
    for rank in (0, 2):
        took, kind, msg = got[rank]
        assert kind == "PeerAbortedError" and "the data loader of rank 1 ran dry" in msg, (rank, kind, msg)
        assert took < 5


@pytest.mark.parametrize("scenario", ["extra", "dtype", "skip", "abort", "absent"])
def test_faults_are_caught_on_the_fast_road_of_repeated_small_calls(scenario, tmp_path):
    """After a few calls on one small array the ordinary all_reduce takes the fast road: the same
    faults must give the same errors there (mismatch, peer's reason, timeout naming the peer)."""
    env = {"RINGCOMM_TIMEOUT": "2" if scenario == "absent" else "20", "FAULTS_OUT": str(tmp_path),
           "FAULTS_WARM": "1"}
    run_mpi(3, "faults.py", scenario, 100, env=env, timeout=60, check=False)
    got = outcomes(tmp_path)
    for rank in (0, 2):
        took, kind, msg = got[rank]
        if scenario == "absent":
            assert kind == "CommTimeoutError" and "rank 1" in msg and took < 4.5, (rank, kind, msg)
        elif scenario == "abort":
            assert kind == "PeerAbortedError" and "the data loader of rank 1 ran dry" in msg, (rank, kind, msg)
        else:
            assert kind in ("MismatchError", "PeerAbortedError") and took < 5, (rank, kind, msg)
    if scenario in ("extra", "dtype", "skip"):
        assert any(kind == "MismatchError" for _, kind, _ in got.values()), got


@pytest.mark.parametrize("case", ["all_reduce", "all_reduce_empty", "reduce_scatter", "all_gather"])
def test_a_stopped_rank_resumed_after_its_peers_timed_out_raises_and_leaves_their_buffers_alone(case):
    """SIGSTOP inside a large direct collective, SIGCONT after the peers' deadline and their reuse
    of their buffers: the resumed rank once returned normally with values read out of the reused
    buffers and went on writing into them (mpi_jobs/resumed_rank.py)."""
    # Rank 0 prints after a barrier that every rank reaches only past its own checks, so the line
    # is the verdict. The exit status is not: the ranks leave by os._exit without MPI_Finalize
    # (their communicators are broken), and MPICH's launcher then kills whichever rank has not
    # left yet (exit 9, once in some twenty suite runs, after the line was out).
    proc = run_mpi(3, "resumed_rank.py", case, timeout=120, check=False)
    assert "resumed-rank ok" in proc.stdout, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"


def late_init_outcomes(tmp_path) -> dict:
    """rank -> (seconds its init took, its outcome), as late_init.py's ranks wrote them."""
    seen = {}
    for path in tmp_path.glob("rank*.txt"):
        rank, took, outcome = re.match(r"rank (\d+) after ([\d.]+) s: (.*)", path.read_text()).groups()
        seen[int(rank)] = (float(took), outcome)
    return seen


@pytest.mark.parametrize("scenario", ["late", "stopped"])
def test_a_rank_that_does_not_reach_init_in_time_fails_init_on_the_others(scenario, tmp_path):
    """Rank 1 of 3 calls ringcomm.init 4.5 s late, or stops 4.5 s inside it before its first
    exchange; the others' init(timeout=2) raises CommTimeoutError within the timeout, naming rank
    1 where it can (bootstrap.py). Before, MPI's blocking Comm_dup and allgather waited for it
    however long it took: forever for a rank that never came."""
    run_mpi(3, "late_init.py", tmp_path, scenario, timeout=120)
    seen = late_init_outcomes(tmp_path)
    assert sorted(seen) == [0, 1, 2], seen
    for rank in (0, 2):
        took, outcome = seen[rank]
        assert 2.0 <= took < 4.0, (rank, took, outcome)
        if scenario == "late":
            assert outcome.startswith(f"CommTimeoutError: init on rank {rank}: timed out after 2 s waiting for every "
                                      "one of the job's 3 ranks to call ringcomm.init"), outcome
        else:   # its own timeout, or the other's notice of it, whichever came first
            assert outcome.startswith((f"CommTimeoutError: init on rank {rank}: timed out after 2 s in exchange #1 "
                                       "(launchers) waiting for ranks [1]",
                                       f"PeerAbortedError: init on rank {rank}: in exchange #1 (launchers): rank "
                                       f"{2 - rank} gave up")), outcome
            assert "waiting for ranks [1]" in outcome, outcome
    # The late rank finds the others gone: its own init gives up too, within its timeout (after
    # its 4.5 s inside init where it stopped there), or at their notices.
    took, outcome = seen[1]
    assert outcome.startswith(("CommTimeoutError: init", "PeerAbortedError: init")), outcome
    assert took < (4.0 if scenario == "late" else 10.0), (took, outcome)
    if scenario == "stopped":
        assert "waiting for ranks [0, 2]" in outcome or "gave up" in outcome, outcome


def test_a_rank_that_never_reaches_init_ends_the_job_at_mpi_inits_deadline(tmp_path):
    """Rank 1 of 3 sleeps 600 s before ringcomm.init, which starts MPI. MPI_Init waits for every
    process of the job holding the GIL, so ranks 0 and 2 waited there forever, with no word. Now
    a native thread ends them at the deadline (RINGCOMM_MPI_INIT_TIMEOUT here) with the reason on
    stderr, and mpirun ends rank 1 (bootstrap.mpi_init_deadline)."""
    started = time.monotonic()
    proc = run_mpi(3, "late_mpi_init.py", tmp_path, "never", timeout=120, check=False,
                   env={"RINGCOMM_MPI_INIT_TIMEOUT": "2"})
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert re.search(r"ringcomm: init on rank [02]: MPI_Init has not returned after 2 s "
                     r"\(RINGCOMM_MPI_INIT_TIMEOUT\)", proc.stderr), proc.stderr[-3000:]
    assert "init returned" not in proc.stderr + proc.stdout
    assert took < 30, took


def test_mpi_inits_deadline_is_disarmed_once_mpi_init_returns(tmp_path):
    """Ranks whose MPI_Init may take 1 s, and which work on past it, are not ended by the deadline."""
    run_mpi(3, "late_mpi_init.py", tmp_path, "on_time", timeout=120, env={"RINGCOMM_MPI_INIT_TIMEOUT": "1"})
    for rank in range(3):
        assert (tmp_path / f"rank{rank}.txt").read_text() == f"rank {rank}: ok 6\n"


def test_a_rank_late_to_a_reference_backends_set_up_fails_init_on_the_others(tmp_path):
    """Rank 1 of 3 stops for 4.5 s where backend gloo's set-up begins, after init's exchanges. Its
    rendezvous over MPI was a blocking allgather and bcast: the others waited for it however
    long it took, forever for a rank that never came. Now each exchange is bounded
    (bootstrap.allgather_within): the others raise CommTimeoutError at their timeout (2 s)."""
    run_mpi(3, "late_init.py", tmp_path, "backend", timeout=120)
    seen = late_init_outcomes(tmp_path)
    for rank in (0, 2):
        took, outcome = seen[rank]
        assert 2.0 <= took < 5.0, (rank, took, outcome)
        assert outcome.startswith(f"CommTimeoutError: init(backend='gloo'): hosts on rank {rank}: MPI did not "
                                  "complete it within 2 s"), outcome


def test_a_rank_late_to_inits_last_exchange_ends_the_job_instead_of_waiting_alone_in_the_split(tmp_path):
    """Rank 1 of 3 is 4.5 s late to init's last exchange (settings); the others give up at 2 s. Their
    messages were sent before they did, so rank 1 found the exchange complete and waited forever
    in the node split (MPI_Comm_split), which nothing can poll. Now the others' abort notices stop
    it (PeerAbortedError), or where they come too late, the split's watchdog ends the job at the
    timeout with the reason on stderr (bootstrap.py)."""
    started = time.monotonic()
    proc = run_mpi(3, "late_init.py", tmp_path, "last", timeout=120, check=False)
    took = time.monotonic() - started
    seen = late_init_outcomes(tmp_path)
    for rank in (0, 2):
        t, outcome = seen[rank]
        assert 2.0 <= t < 4.0 and "exchange #3 (settings)" in outcome, (rank, t, outcome)
        assert outcome.startswith(("CommTimeoutError", "PeerAbortedError")), outcome
    if 1 in seen:
        assert seen[1][1].startswith("PeerAbortedError: init on rank 1: in exchange #3 (settings)"), seen[1]
    else:
        assert "ringcomm: init on rank 1: the node split (MPI_Comm_split) has not returned after 2 s" in proc.stderr, \
            proc.stderr[-3000:]
        assert proc.returncode != 0
    assert took < 30, took


@pytest.mark.mpi
def test_a_rank_that_closes_while_its_peer_still_calls_fails_that_call_fast_naming_the_close():
    """Each rank's worker thread loops over all_reduce while its main thread closes the world
    (rank 0 first): close waits for the call in flight, and rank 1's next call raises within
    seconds naming rank 0's close, on every backend (mpi_jobs/close_in_flight.py)."""
    proc = run_mpi(2, "close_in_flight.py", "ringcomm", "mpi", "gloo", timeout=120)
    assert "close-in-flight ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
def test_sends_and_receives_nobody_matched_are_cancelled_at_close_and_every_rank_exits_cleanly():
    """On gloo, ringcomm's thread waiting in torch's Work for an unmatched send made torch abort
    the process at exit (SIGABRT, 'terminate called without an active exception') in most runs
    (mpi_jobs/unreceived_at_close.py)."""
    proc = run_mpi(2, "unreceived_at_close.py", "ringcomm", "mpi", "gloo", "gloo", timeout=120)
    assert "unreceived-at-close ok" in proc.stdout, proc.stdout + proc.stderr
    assert "terminate called" not in proc.stderr, proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("backend,call", [("ringcomm", "window"), ("ringcomm", "ring"), ("ringcomm", "recv"),
                                          ("mpi", "window"), ("gloo", "window")])
def test_a_rank_that_closed_a_split_fails_its_peers_call_on_it_at_once(backend, call):
    """Rank 0 closes a split; rank 1's call on it (a 1 KiB all_reduce, a 1 MiB ring all_reduce, a
    recv) raises naming the close. On ringcomm each waited out its 30 s timeout: the window's
    road until round forty-two (a closed region read like one not opened yet), the ring's and
    the recv's until forty-three (only the window's own wait read the close)
    (mpi_jobs/split_closed.py)."""
    proc = run_mpi(2, "split_closed.py", backend, call, timeout=60)
    assert "split-closed ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
def test_a_send_withdrawn_by_its_senders_close_is_received_exact_or_fails_naming_the_close():
    """Rank 0 closes and exits with an 8 MiB send unreceived; rank 1's receive a second later
    named neither itself nor the close (mpi_jobs/withdrawn_send.py)."""
    proc = run_mpi(2, "withdrawn_send.py", timeout=60)
    assert "withdrawn-send ok" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", ["ringcomm", "mpi", "gloo"])
def test_a_rank_interrupted_mid_call_breaks_the_communicator_loudly_on_every_rank(backend):
    """Ctrl-C (a KeyboardInterrupt from a signal handler) in a blocking recv, a remembered
    all_reduce, a persistent one and a ring: a recv retried after it once took the sender's next
    message, the first landing later in the abandoned buffer; peers waited out their timeout.
    Now the interrupted rank's later calls raise and its peers hear why within seconds
    (mpi_jobs/interrupted.py)."""
    out = run_mpi(2, "interrupted.py", backend, timeout=120).stdout
    cases = ["recv", "recv_both", "all_reduce", "persistent"] + (["ring"] if backend == "ringcomm" else [])
    for name in cases:
        assert out.count(f"check {name} ok") == 2, out
    assert out.count(" done") == 2, out
