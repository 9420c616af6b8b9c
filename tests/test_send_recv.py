"""send/recv: messages between a pair under one tag arrive in order; tags keep streams apart; a
receive of another dtype or length raises MismatchError on the receiver (never a truncated or
reinterpreted buffer); any-source receives name their sender; nothing waits forever."""
import time

import numpy as np
import pytest
import torch

from ringcomm import CommError, CommTimeoutError, MismatchError
from ringcomm.core import executor
from ringcomm.testing import run_threads
from thread_util import in_thread


def test_messages_of_one_tag_arrive_in_order_and_tags_are_separate_streams():
    def body(comm):
        if comm.rank == 0:
            for i in range(20):
                comm.send(np.full(3, float(i)), 1, tag=i % 2, async_op=True)
            return comm.send(np.array([99.0]), 1, tag=7)
        got = {0: [], 1: []}
        late = comm.recv(np.zeros(1), 0, tag=7)          # tag 7 was sent last but is received first
        for i in range(20):
            t = 1 - i % 2 if i < 10 else i % 2           # receive the two tags in another interleaving
            got[t].append(float(comm.recv(np.zeros(3), 0, tag=t)[0]))
        return late[0], got
    late, got = run_threads(2, body)[1]
    assert late == 99.0
    assert got[0] == [float(i) for i in range(0, 20, 2)] and got[1] == [float(i) for i in range(1, 20, 2)]


def test_pipeline_pattern_send_right_receive_left_does_not_deadlock():
    """Every rank sends to its right neighbour before it receives from its left one: receives
    are posted as they are issued, so nothing waits on the order of posting."""
    def body(comm):
        n = comm.size
        w = comm.send(np.full(1 << 18, float(comm.rank)), (comm.rank + 1) % n, async_op=True)
        got = comm.recv(np.zeros(1 << 18), (comm.rank - 1) % n)
        w.wait(30)
        return got[0]
    assert run_threads(4, body) == [3.0, 0.0, 1.0, 2.0]


def test_torch_tensors_and_every_dtype_travel_exactly():
    def body(comm):
        dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int16, torch.int64, torch.bool]
        if comm.rank == 0:
            for dt in dtypes:
                comm.send((torch.arange(7) % 3).to(dt), 1)
            return None
        return [comm.recv(torch.zeros(7, dtype=dt), 0) for dt in dtypes]
    for t in run_threads(2, body)[1]:
        assert t.tolist() == (torch.arange(7) % 3).to(t.dtype).tolist()


def test_any_source_receive_names_its_sender():
    def body(comm):
        if comm.rank:
            comm.send(np.full(2, 10.0 * comm.rank), 0, tag=4)
            return None
        seen = {}
        for _ in range(comm.size - 1):
            out, src = comm.recv(np.zeros(2), None, tag=4)
            seen[src] = out[0]
        w = comm.recv(np.zeros(2), None, tag=5, async_op=True)
        return seen, w
    seen, pending = run_threads(4, body)[0]
    assert seen == {1: 10.0, 2: 20.0, 3: 30.0}
    # Nobody sent under tag 5: closing the communicator withdrew the receive, and says so.
    with pytest.raises(CommError, match="cancelled.*closed"):
        pending.wait(5)
    assert pending.source is None


def test_receives_from_any_rank_take_messages_in_posting_order_whatever_order_they_are_waited():
    """MPI matches receives in the order they were posted: waiting on the last one first must
    not hand it the first message (it did: the waits in reverse got the messages in reverse)."""
    def body(comm):
        if comm.rank:
            for k in range(6):
                comm.send(np.full(3, 100.0 * comm.rank + k), 0, tag=2, async_op=True)
            return None
        pending = [(np.zeros(3), None) for _ in range(6 * (comm.size - 1))]
        pending = [(buf, comm.recv(buf, None, tag=2, async_op=True)) for buf, _ in pending]
        for _, work in reversed(pending):
            work.wait(30)
        return [(work.source, buf[0]) for buf, work in pending]
    got = run_threads(3, body)[0]
    for sender in (1, 2):
        assert [v for s, v in got if s == sender] == [100.0 * sender + k for k in range(6)], got


def test_a_receive_from_one_rank_posted_behind_one_from_any_rank_takes_the_next_message():
    """MPI: of rank 1's two messages, the first goes to the receive from any rank posted first,
    the second to the receive from rank 1 posted after it (before, the latter claimed the first
    at once). Waited in either order; a receive under another tag is not held back."""
    def body(comm):
        if comm.rank == 1:
            comm.send(np.full(2, 7.0), 0, tag=3)
            for _ in range(2):
                for k in range(2):
                    comm.send(np.full(2, float(k)), 0, tag=2)
                comm.barrier()
            return None
        results = []
        for order in (1, -1):
            first, second = np.zeros(2), np.zeros(2)
            any_rank = comm.recv(first, None, tag=2, async_op=True)
            from_one = comm.recv(second, 1, tag=2, async_op=True)
            if order == 1:   # another tag: not held behind tag 2's receive from any rank
                results.append(float(comm.recv(np.zeros(2), 1, tag=3)[0]))
            for work in (any_rank, from_one)[::order]:
                work.wait(30)
            results.append((first[0], second[0], any_rank.source))
            comm.barrier()
        return results
    got = run_threads(2, body)[0]
    assert got == [7.0, (0.0, 1.0, 1), (0.0, 1.0, 1)], got


@pytest.mark.parametrize("theirs,mine,words", [
    (np.zeros(4, np.float32), np.zeros(4, np.int32), ["float32", "int32", "tag 0"]),
    (np.zeros(4, np.float32), np.zeros(5, np.float32), ["bytes", "16", "20"]),
    (np.zeros(6, np.float32), np.zeros(5, np.float32), ["bytes", "24", "20"]),
])
def test_a_receive_that_does_not_fit_the_message_is_a_mismatch(theirs, mine, words):
    def body(comm):
        if comm.rank == 0:
            comm.send(theirs, 1, async_op=True)
            return None
        keep = mine.copy()
        try:
            comm.recv(mine, 0)
        except MismatchError:
            assert np.array_equal(mine, keep), "the receive buffer was written"
            raise
    with pytest.raises(MismatchError) as info:
        run_threads(2, body, timeout=10)
    for w in words:
        assert w in str(info.value)
    assert str(info.value).startswith("recv p2p#1 from rank 0 (tag 0) on rank 1: "), info.value


def test_a_receive_from_any_rank_that_does_not_fit_names_the_call_once():
    def body(comm):
        if comm.rank == 0:
            comm.send(np.zeros(6, np.float32), 1, tag=4, async_op=True)
            return None
        comm.recv(np.zeros(5, np.float32), None, tag=4)
    with pytest.raises(MismatchError) as info:
        run_threads(2, body, timeout=10)
    text = str(info.value)
    assert text.startswith("recv p2p#1 from any rank (tag 4) on rank 1: ") and text.count("p2p#1") == 1, text
    assert "24" in text and "20" in text, text


@pytest.mark.parametrize("algorithm", ["ring", "one_shot"])
def test_a_send_may_wait_for_its_receive_across_collectives(algorithm):
    """MPI's rule: rank 0 sends, then both run collectives, and rank 1 receives afterwards. Rank 1
    waits in the collectives long enough to look for a reason (executor.DIAGNOSE_EVERY) with the
    sends unreceived; they are no sign that the ranks disagree."""
    def body(comm):
        if comm.rank == 0:
            for i in range(3):
                comm.send(np.full(4, float(i)), 1, tag=i)
            time.sleep(6 * executor.DIAGNOSE_EVERY)
        comm.barrier()
        x = np.full(5, comm.rank + 1.0)
        comm.all_reduce(x, algorithm=algorithm)
        got = [comm.recv(np.zeros(4), 0, tag=i)[0] for i in range(3)] if comm.rank == 1 else None
        return x[0], got
    assert run_threads(2, body, timeout=30) == [(3.0, None), (3.0, [0.0, 1.0, 2.0])]


def test_a_stalled_collective_passes_over_unreceived_sends_to_the_message_that_explains_it():
    """Rank 0 sent a point-to-point message, then a broadcast's; rank 1, stalled in an all_reduce,
    names the broadcast (the send ahead of it is no reason: the test above)."""
    from ringcomm import collectives
    from ringcomm.core.envelope import Envelope, p2p_tag
    from ringcomm.core.executor import _Watch
    from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
    world = ThreadsWorld(2)
    sender, receiver = ThreadsTransport(world, 0), ThreadsTransport(world, 1)
    sender.isend(np.zeros(4), 1, p2p_tag("float64", 0))
    theirs = Envelope(5, collectives.get("broadcast").code, "float64", 8)
    sender.isend(np.zeros(8), 1, theirs.base_tag())
    ours = Envelope(5, collectives.get("all_reduce").code, "float64", 8, op=1)
    with pytest.raises(MismatchError, match="expected all_reduce, received broadcast"):
        _Watch(receiver, ours, 60.0, "all_reduce #5").diagnose(0)


def test_a_receive_nobody_sends_times_out_naming_the_peer_and_tag():
    def body(comm):
        if comm.rank == 1:
            return comm.recv(np.zeros(2), 0, tag=11)
        return None
    with pytest.raises(CommTimeoutError, match=r"recv .*from rank 0 \(tag 11\).*timed out"):
        run_threads(2, body, timeout=1.0)


def test_blocking_calls_with_nothing_queued_run_in_the_callers_thread():
    # Two thread hand-offs per message cost more than the message: a blocking ping-pong never
    # starts a progress thread.
    def body(comm):
        x = np.zeros(256, np.float32)
        for _ in range(5):
            if comm.rank == 0:
                comm.send(x + 1, 1)
                comm.recv(x, 1)
            else:
                comm.recv(x, 0)
                comm.send(x + 1, 0)
        return comm.engine.thread, float(x[0])
    (thread0, x0), (thread1, x1) = run_threads(2, body)
    assert thread0 is None and thread1 is None
    assert x0 == 10.0 and x1 == 9.0


def test_an_async_send_posted_inline_stays_ahead_of_a_later_blocking_send_of_the_same_tag():
    def body(comm):
        if comm.rank == 0:
            work = comm.send(np.full(4, 1.0), 1, tag=3, async_op=True)
            comm.send(np.full(4, 2.0), 1, tag=3)
            work.wait(10)
            return None
        return comm.recv(np.zeros(4), 0, tag=3)[0], comm.recv(np.zeros(4), 0, tag=3)[0]
    assert run_threads(2, body)[1] == (1.0, 2.0)


def test_async_calls_nobody_waits_on_complete_on_the_progress_thread():
    # The progress thread leaves a just-posted call to its caller for a moment (progress.GRACE)
    # and is not woken for calls posted while it naps: it must still finish them on its own.
    import time

    def body(comm):
        peer = 1 - comm.rank
        works = []
        for i in range(3):   # posted while the progress thread naps after the first
            works.append(comm.recv(np.zeros(8), peer, tag=i, async_op=True))
            works.append(comm.send(np.full(8, float(comm.rank * 10 + i)), peer, tag=i, async_op=True))
            time.sleep(0.002)
        deadline = time.monotonic() + 5
        while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
            time.sleep(0.001)   # nobody calls wait(): only the progress thread can finish them
        assert all(w.is_completed() for w in works)
        return [float(w.wait()[0]) for w in works[::2]]
    got = run_threads(2, body)
    assert got == [[10.0, 11.0, 12.0], [0.0, 1.0, 2.0]]


def test_a_finished_work_lets_go_of_its_buffer():
    import gc
    import weakref

    def body(comm):
        if comm.rank == 0:
            x = np.ones(1 << 16)
            work = comm.send(x, 1, async_op=True)
            work.wait(10)
            ref = weakref.ref(x)
            del x
            gc.collect()
            return ref() is None, work
        comm.recv(np.zeros(1 << 16), 0)
        return None
    released, work = run_threads(2, body)[0]
    assert released and work.is_completed()


def test_waiting_on_an_async_receive_with_a_timeout_takes_that_long_not_twice_as_long():
    import time

    def body(comm):
        if comm.rank == 1:
            work = comm.recv(np.zeros(4), 0, tag=5, async_op=True)
            start = time.monotonic()
            with pytest.raises(CommTimeoutError, match="not complete after waiting 0.4 s"):
                work.wait(0.4)
            took = time.monotonic() - start
            comm.engine.close(1)   # the receive is still pending: withdraw it before the ranks part
            return took
        return None
    took = run_threads(2, body, timeout=5)[1]
    assert 0.35 < took < 0.7, took


def test_a_second_thread_is_refused_while_a_call_posted_inline_is_in_flight():
    # Posting in the caller's thread keeps the thread rule: a send from another thread while this
    # thread's receive is in flight raises UsageError naming both threads; this thread's calls go
    # on. The receive stays in flight until the intruder has run (a send could complete at once:
    # the threads transport buffers it), so the outcome does not depend on thread scheduling.
    import threading
    intruder_ran = threading.Event()   # the ranks are threads of this process

    def body(comm):
        if comm.rank == 1:
            assert intruder_ran.wait(10)
            comm.send(np.ones(1), 0, tag=2)
            comm.send(np.ones(2), 0, tag=1)
            return None
        work = comm.recv(np.zeros(1), 1, tag=2, async_op=True)   # in flight until rank 1 sends
        _, err = in_thread(lambda: comm.send(np.ones(2), 1, tag=9), timeout=10)
        intruder_ran.set()
        work.wait(10)
        got = comm.recv(np.zeros(2), 1, tag=1)
        return err, got
    err, got = run_threads(2, body, timeout=10)[0]
    from ringcomm import UsageError
    assert isinstance(err, UsageError) and "'intruder'" in str(err) and "in flight" in str(err), err
    assert got.tolist() == [1.0, 1.0]
