"""Fault injection on in-process ranks: mismatches and missing ranks fail loudly, fast, everywhere.

The same scenarios run under real mpirun in test_faults_mpi.py."""
import os
import re
import time

import numpy as np
import pytest

from ringcomm import CommError, CommTimeoutError, MismatchError, PeerAbortedError
from ringcomm.errors import NonFiniteError
from ringcomm.testing import run_threads
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
from ringcomm import Communicator

import threading


def run_each(size, fn, timeout=10, env=None):
    """Like run_threads, but collect every rank's outcome (result or exception) instead of raising."""
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        world = ThreadsWorld(size)
        outcome = [None] * size
        elapsed = [None] * size

        def main(rank):
            comm = Communicator(ThreadsTransport(world, rank), timeout=timeout)
            start = time.monotonic()
            try:
                outcome[rank] = fn(comm)
            except BaseException as err:
                outcome[rank] = err
            elapsed[rank] = time.monotonic() - start
        threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        return outcome, elapsed
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner"])
def test_one_element_more_raises_mismatch_on_every_rank(algorithm):
    def fn(comm):
        comm.all_reduce(np.ones(100 + (comm.rank == 1), np.float32), algorithm=algorithm)
    outcome, elapsed = run_each(3, fn)
    for rank, err in enumerate(outcome):
        assert isinstance(err, (MismatchError, PeerAbortedError)), (rank, err)
        assert "all_reduce #0" in str(err)
    assert any(isinstance(e, MismatchError) and "count" in str(e) for e in outcome)
    assert max(elapsed) < 5


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "gather",
                                  "empty_vs_barrier"])
@pytest.mark.parametrize("count", [1000, 1024, 3 << 20])
def test_an_empty_call_where_peers_have_data_raises_on_every_rank_at_once(call, count):
    """A rank whose call moves nothing once returned normally at once, and its peers timed out
    waiting for it (300 s by default); an empty all_reduce against a barrier did the same. Now
    the empty call meets its peers in a barrier that carries its envelope."""
    def fn(comm):
        n = 0 if comm.rank == 1 else count
        x = np.ones(n * (comm.size if call == "reduce_scatter" else 1), np.float32)
        if call == "all_reduce":
            comm.all_reduce(x)
        elif call == "broadcast":
            comm.broadcast(x)
        elif call == "all_gather":
            comm.all_gather(np.empty(n * comm.size, np.float32), x)
        elif call == "reduce_scatter":
            comm.reduce_scatter(np.empty(n, np.float32), x)
        elif call == "gather":
            comm.gather(np.empty(n * comm.size, np.float32) if comm.rank == 0 else None, x)
        else:
            comm.barrier() if comm.rank == 1 else comm.all_reduce(np.ones(0, np.float32))
    outcome, elapsed = run_each(3, fn, timeout=20)
    for rank, err in enumerate(outcome):
        assert isinstance(err, (MismatchError, PeerAbortedError)), (rank, err)
    assert any(isinstance(e, MismatchError) for e in outcome)
    assert max(elapsed) < 5


def test_empty_calls_on_every_rank_still_complete_in_order():
    def fn(comm):
        empty = np.ones(0, np.float32)
        for _ in range(3):
            comm.all_reduce(empty)
            comm.broadcast(empty, root=1)
            comm.all_gather(np.empty(0, np.int64), np.empty(0, np.int64))
        x = np.full(5, comm.rank, np.int64)
        comm.all_reduce(x)
        return x.tolist()
    for result in run_threads(4, fn):
        assert result == [6] * 5


def test_other_dtype_of_the_same_width_raises_instead_of_reducing_garbage():
    def fn(comm):
        dtype = np.int32 if comm.rank == 0 else np.float32
        comm.all_reduce(np.ones(64, dtype))
    outcome, elapsed = run_each(2, fn)
    assert all(isinstance(e, CommError) for e in outcome), outcome
    assert any(isinstance(e, MismatchError) and "dtype: expected" in str(e) for e in outcome)
    assert max(elapsed) < 5


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner", "one_shot", "direct"])
def test_ranks_that_disagree_on_the_op_raise_instead_of_returning_different_results(algorithm):
    # Rank 1 takes the maximum where the others sum: without the op in the envelope each rank
    # returned normally, with another result (replicas that drift).
    def fn(comm):
        comm.all_reduce(np.ones(100, np.float32), "max" if comm.rank == 1 else "sum", algorithm=algorithm)
    outcome, elapsed = run_each(3, fn)
    for rank, err in enumerate(outcome):
        assert isinstance(err, (MismatchError, PeerAbortedError)), (rank, err)
    assert any(isinstance(e, MismatchError) and "op: expected" in str(e) for e in outcome), outcome
    assert max(elapsed) < 5


@pytest.mark.parametrize("collective", ["reduce_scatter", "reduce"])
def test_avg_against_sum_raises_in_the_other_reductions_too(collective):
    def fn(comm):
        op = "avg" if comm.rank == 0 else "sum"
        if collective == "reduce":
            comm.reduce(np.ones(30, np.float32), 0, op)
        else:
            comm.reduce_scatter(np.empty(10, np.float32), np.ones(30, np.float32), op)
    outcome, elapsed = run_each(3, fn)
    assert all(isinstance(e, (MismatchError, PeerAbortedError)) for e in outcome), outcome
    assert any(isinstance(e, MismatchError) and "op: expected" in str(e) for e in outcome), outcome
    assert max(elapsed) < 5


def test_skipped_collective_raises_mismatch_naming_the_collectives():
    def fn(comm):
        if comm.rank != 2:
            comm.all_reduce(np.ones(10))
        comm.broadcast(np.ones(10))
    outcome, elapsed = run_each(4, fn)
    assert all(isinstance(e, CommError) for e in outcome), outcome
    # Rank 2's first call is the broadcast: sequence numbers agree, the collectives do not.
    assert any(isinstance(e, MismatchError) and "collective: expected broadcast, received all_reduce" in str(e)
               for e in outcome)
    assert max(elapsed) < 5


def test_rank_that_never_joins_makes_the_others_time_out_naming_the_peer(capsys):
    def fn(comm):
        if comm.rank != 1:
            comm.all_reduce(np.ones(10), algorithm="ring")
    outcome, elapsed = run_each(3, fn, timeout=1.0)
    assert outcome[1] is None
    for rank in (0, 2):
        assert isinstance(outcome[rank], (CommTimeoutError, PeerAbortedError)), outcome[rank]
        assert elapsed[rank] < 1.0 + 2.0
    assert any(isinstance(e, CommTimeoutError) and "rank 1" in str(e) for e in outcome)
    assert "flight recorder" in capsys.readouterr().err


@pytest.mark.parametrize("calls_before", [0, 3])   # 3: the failing call takes the fast road
def test_a_failed_direct_gather_keeps_the_roots_output_alive(calls_before):
    # Its writers may still write into the root's output after the root gave up (a writer stopped
    # between round 1 and its write): that memory must stay the output's, not be handed on.
    def fn(comm):
        x, out = np.full(4, comm.rank, np.float32), np.zeros(12, np.float32) if comm.rank == 0 else None
        for _ in range(calls_before):
            comm.gather(out, x, 0)
        if comm.rank != 2:
            try:
                comm.gather(out, x, 0)
            except CommError:
                held = comm._failed_call
                return held is not None and held.collective.name == "gather" and \
                    (comm.rank != 0 or held.out.obj is out)
    outcome, _ = run_each(3, fn, timeout=1.0, env={"RINGCOMM_ALGO": "gather=direct"})
    assert outcome == [True, True, None], outcome


def test_after_a_failure_the_communicator_is_broken_with_the_original_cause():
    def fn(comm):
        try:
            comm.all_reduce(np.ones(8 + comm.rank))
        except CommError:
            pass
        start = time.monotonic()
        with pytest.raises(CommError, match="earlier failure") as info:
            comm.all_reduce(np.ones(8))
        assert time.monotonic() - start < 0.5
        return info.value.__cause__
    outcome, _ = run_each(2, fn)
    assert all(isinstance(c, CommError) for c in outcome), outcome


@pytest.mark.parametrize("fault,field", [("count", "count"), ("dtype", "dtype"), ("op", "op"),
                                         ("root", "root"), ("skip", "collective")])
def test_debug_detail_names_the_ranks_and_the_field(fault, field):
    def fn(comm):
        odd = comm.rank == 2
        count = 11 if fault == "count" and odd else 10
        dtype = np.float64 if fault == "dtype" and odd else np.float32
        if fault == "skip" and odd:
            comm.barrier()
            return
        if fault == "root":
            comm.broadcast(np.ones(count, dtype), root=1 if odd else 0)
        else:
            comm.all_reduce(np.ones(count, dtype), op="max" if fault == "op" and odd else "sum")
    outcome, elapsed = run_each(4, fn, env={"RINGCOMM_DEBUG": "detail"})
    for rank, err in enumerate(outcome):
        assert isinstance(err, MismatchError), (rank, err)
        assert field in str(err) and "ranks [2]" in str(err), str(err)
    assert max(elapsed) < 5


def test_check_finite_names_the_rank_on_every_rank():
    def fn(comm):
        x = np.ones(10, np.float32)
        if comm.rank == 1:
            x[3] = np.nan
        comm.all_reduce(x)
    outcome, _ = run_each(3, fn, env={"RINGCOMM_CHECK_FINITE": "1"})
    for err in outcome:
        assert isinstance(err, NonFiniteError) and "ranks [1]" in str(err), err


def test_work_wait_timeout_raises_instead_of_hanging():
    def fn(comm):
        if comm.rank == 0:
            work = comm.all_reduce(np.ones(4), async_op=True)
            with pytest.raises(CommTimeoutError, match="all_reduce #0"):
                work.wait(timeout=0.2)
            comm.barrier()   # let rank 1 join now
            return work.wait(timeout=10)
        time.sleep(0.5)
        comm.all_reduce(np.ones(4))
        comm.barrier()
    out = run_threads(2, fn, timeout=10)
    assert (out[0] == 2).all()


def test_any_call_after_close_raises_at_once_async_or_not():
    """close() and then an async call used to leave work that never ran and a next blocking call
    that hung past its timeout; now every call after close raises CommError at once."""
    def body(comm):
        x = np.ones(4)
        comm.all_reduce(x)
        comm.all_reduce(x)   # remembered: the next one would take the fast road
        persistent = comm.all_reduce_init(np.ones(4))
        comm.close()
        seen = []
        for call in (lambda: comm.all_reduce(np.ones(4), async_op=True), lambda: comm.all_reduce(x),
                     lambda: comm.broadcast(np.ones(4), async_op=True), lambda: comm.barrier(),
                     persistent, persistent.start):
            started = time.monotonic()
            with pytest.raises(CommError, match="closed"):
                call()
            seen.append(time.monotonic() - started)
        return max(seen)
    for took in run_threads(2, body, timeout=30):
        assert took < 1.0


def test_close_from_another_thread_waits_for_the_call_in_flight():
    """close() let the thread with a blocking call in flight run on while it tore the transport
    down (over shared memory that thread then failed on emptied peer headers, mpi_jobs/
    close_in_flight.py). Now close waits for that call, which completes with the right sum."""
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.5)   # rank 0's call is in flight, waiting for this rank, when rank 0 closes
            x = np.full(1000, 2.0)
            comm.all_reduce(x)
            return ("sum", x[0]), ("close", None)
        x, ended = np.full(1000, 1.0), {}

        def call():
            comm.all_reduce(x)
            ended["call"] = time.monotonic()
        started = time.monotonic()
        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.1)
        comm.close()
        closed = time.monotonic() - started
        thread.join(10)
        return ("sum", x[0]), ("close", closed)
    out, _ = run_each(2, body)
    assert out[0][0] == ("sum", 3.0) and out[1][0] == ("sum", 3.0), out
    assert out[0][1][1] >= 0.45, f"close returned {out[0][1][1]:.2f} s in, before the call in flight ended"


CLOSED_SPLIT_CALLS = {
    "window": lambda sub: sub.all_reduce(np.ones(256, np.float32)),   # the one-shot road
    "ring": lambda sub: sub.all_reduce(np.ones(1 << 16, np.float32), algorithm="ring"),
    "tree": lambda sub: sub.all_reduce(np.ones(1 << 16, np.float32), algorithm="tree"),
    "broadcast": lambda sub: sub.broadcast(np.ones(1 << 16, np.float32), root=0, algorithm="binomial"),
    "recv": lambda sub: sub.recv(np.ones(256, np.float32), 0),
}


@pytest.mark.parametrize("call,closer", [(call, closer) for call in sorted(CLOSED_SPLIT_CALLS) for closer in (0, 2)
                                         if call != "recv" or closer == 0])
def test_a_peer_that_closed_a_split_fails_its_peers_waits_at_once_naming_the_close(call, closer):
    """Rank ``closer`` closes a split of all three ranks; the others' call on it raises
    PeerAbortedError within seconds, not at the communicator's 30 s timeout. A rank that waits
    for the closer names the close, which the closer's window region records (window.py); one
    that waits for a rank that gave up on the close names that rank and the close (before round
    forty-four: that rank alone, "rank 1 gave up"). Before round forty-two every one waited out
    its timeout; before forty-three all but the window's road did (only the window's own wait
    read the region). The recv, from rank 0, runs only where rank 0 closed."""
    run = CLOSED_SPLIT_CALLS[call]

    def body(comm):
        sub = comm.split(0)
        if comm.rank == closer:
            sub.close()
            return "closed"
        time.sleep(0.2)
        run(sub)
    outcome, elapsed = run_each(3, body, timeout=30)
    named = 0
    for rank, got in enumerate(outcome):
        if rank == closer:
            assert got == "closed"
            continue
        assert isinstance(got, PeerAbortedError), (rank, got)
        text = str(got)
        assert ("all_reduce" if call in ("window", "ring", "tree") else call) in text, text
        closed = f"rank {closer} of this communicator (rank {closer} of the job) has closed it (close())"
        assert text.endswith(closed), text
        named += bool(re.search(rf"rank \d gave up; {re.escape(closed)}$", text))
    assert named <= 1, outcome   # at most one waits for the other survivor, not for the closer
    assert max(elapsed) < 5, elapsed


def test_threads_closing_one_communicator_at_once_all_return_and_calls_after_raise():
    """Three threads call close() on one communicator at once: each returns, none raises, and
    a call afterwards raises CommError at once (tried under mpirun too, 1,100 init-split-close
    rounds on ringcomm and mpi: the MPI communicators still went back)."""
    def body(comm):
        x = np.ones(64)
        comm.all_reduce(x)
        errors = []

        def close():
            try:
                comm.close()
            except BaseException as err:
                errors.append(err)
        threads = [threading.Thread(target=close) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        with pytest.raises(CommError, match="closed"):
            comm.all_reduce(x)
        return errors, x[0]
    out, _ = run_each(2, body)
    assert all(r == ([], 2.0) for r in out), out


def test_a_send_recv_thread_stuck_in_the_library_is_joined_once_not_at_every_step_of_a_close():
    """Closing a gloo world joins its send/recv threads twice (its close, then its group's
    release); a thread stuck in gloo made that close take both 5 s bounds."""
    from ringcomm.backends.c10d import C10dBackend
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, daemon=True)
    stuck.start()
    backend = C10dBackend.__new__(C10dBackend)   # join_waiters reads only its threads
    backend._waiters = frozenset({stuck})
    try:
        t0 = time.monotonic()
        backend.join_waiters(0.3)
        t1 = time.monotonic()
        backend.join_waiters(0.3)
        t2 = time.monotonic()
    finally:
        release.set()
    assert t1 - t0 >= 0.3 and t2 - t1 < 0.25
    assert backend._waiters == {stuck}   # still known: the exit aborts the group while it lives
    stuck.join()
    backend.join_waiters(0.3)
    assert backend._waiters == frozenset()
