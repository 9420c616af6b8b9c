"""The engine's inline claim (core/progress.py): a blocking call run in its caller's thread holds
the communicator exactly like a queued one for the thread rule, and ends with no lock taken."""
import threading

import pytest

from ringcomm.core.progress import Engine
from ringcomm.errors import CommTimeoutError, UsageError
from ringcomm.work import Work
from thread_util import in_thread


def test_an_inline_call_refuses_a_second_thread_and_frees_the_engine_when_released():
    engine = Engine("rank 0", fail=lambda err: None)
    me = threading.current_thread()
    with engine.state:
        assert engine.claim_inline(me)
        assert not engine.idle()
    _, err = in_thread(lambda: engine.admit("all_reduce on rank 0"))
    assert isinstance(err, UsageError) and "MainThread" in str(err)
    with engine.state:
        assert not engine.claim_inline(me), "a second inline claim while one runs"
    engine.release_inline()
    assert not engine.exec.locked()
    result, err = in_thread(lambda: engine.admit("all_reduce on rank 0"))
    assert result is not None and err is None
    with engine.state:
        assert engine.idle()


def test_no_inline_claim_while_work_is_queued_or_exec_is_held():
    engine = Engine("rank 0", fail=lambda err: None)
    me = threading.current_thread()
    engine.outstanding = 1   # a queued call: the inline road must not overtake it
    with engine.state:
        assert not engine.claim_inline(me)
    engine.outstanding = 0
    engine.exec.acquire()    # a job finishing on the progress thread still holds exec
    try:
        with engine.state:
            assert not engine.claim_inline(me)
            assert engine.inline is None
    finally:
        engine.exec.release()


def test_work_queued_by_a_delegate_during_an_inline_call_keeps_its_count():
    """The inline end is a plain store: a count of queued work that changed meanwhile stays."""
    engine = Engine("rank 0", fail=lambda err: None)
    me = threading.current_thread()
    with engine.state:
        assert engine.claim_inline(me)
    box = {}

    def delegate():
        engine.delegates.add(threading.current_thread())
        engine.admit("all_reduce on rank 0")   # a delegate may call while the owner's call runs
        with engine.state:
            engine.outstanding += 1   # what enqueue does, without starting a thread
        box["queued"] = True
    assert in_thread(delegate)[1] is None and box
    engine.release_inline()
    assert engine.outstanding == 1 and engine.inline is None


def _idle_engine():
    """An engine whose progress thread has started and gone idle (waiting for work)."""
    import time
    engine = Engine("rank 0", fail=lambda err: None)
    with engine.state:
        engine._start()
    deadline = time.monotonic() + 5
    while not engine.idle_wait:
        assert time.monotonic() < deadline, "the progress thread never went idle"
        time.sleep(1e-3)
    return engine


def test_a_passive_send_does_not_wake_the_idle_thread_and_completes_when_asked():
    """watch(wake=False) (Request.passive): nobody tests it until its Work is asked, and then
    asking is enough: is_completed() tests it once, as wait() does."""
    from ringcomm.core.progress import Pending
    from ringcomm.work import Work
    engine = _idle_engine()
    tests, acked = [], threading.Event()

    def test():
        tests.append(threading.current_thread().name)
        return acked.is_set()
    work = Work("send p2p#1 to rank 1 (tag 0) on rank 0")
    with engine.state:
        engine.outstanding += 1
        engine.watch(Pending(test, lambda: None, work, _Entry()), wake=False)
    threading.Event().wait(0.05)
    assert tests == [] and engine.idle_wait, "an idle progress thread was woken for a passive send"
    assert not work.is_completed()
    acked.set()
    assert work.is_completed() and work.wait(1) is None
    assert set(tests) == {threading.current_thread().name}
    with engine.state:
        assert engine.outstanding == 0 and not engine.pending
    engine.close(1)


def test_close_completes_a_passive_send_acknowledged_unobserved_and_cancels_the_rest():
    from ringcomm.core.progress import Pending
    from ringcomm.errors import CommError
    from ringcomm.work import Work
    engine = _idle_engine()
    acked, unmatched = Work("send p2p#1"), Work("send p2p#2")
    cancelled = []
    with engine.state:
        engine.outstanding += 2
        engine.watch(Pending(lambda: True, lambda: None, acked, _Entry()), wake=False)
        engine.watch(Pending(lambda: False, lambda: cancelled.append(2), unmatched, _Entry()), wake=False)
    engine.close(5)
    assert acked.wait(0) is None
    assert cancelled == [2] and isinstance(unmatched.exception(), CommError)
    assert "cancelled" in str(unmatched.exception())


def test_close_still_withdraws_an_operation_whose_last_test_raises():
    """A receive past its deadline at close raises in its last test; it must still be withdrawn,
    or the transport could write into its buffer after close."""
    from ringcomm.core.progress import Pending
    from ringcomm.errors import CommError, CommTimeoutError
    from ringcomm.work import Work
    engine = _idle_engine()
    late = Work("recv p2p#1")
    cancelled = []

    def test():
        raise CommTimeoutError("recv p2p#1: timed out")
    with engine.state:
        engine.outstanding += 1
        engine.watch(Pending(test, lambda: cancelled.append(1), late, _Entry()), wake=False)
    engine.close(5)
    assert cancelled == [1]
    assert isinstance(late.exception(), CommError) and "cancelled" in str(late.exception())


def test_an_active_operation_wakes_the_idle_thread_which_completes_it():
    from ringcomm.core.progress import Pending
    from ringcomm.work import Work
    engine = _idle_engine()
    work = Work("recv p2p#1 from rank 1 (tag 0) on rank 0")
    with engine.state:
        engine.outstanding += 1
        engine.watch(Pending(lambda: True, lambda: None, work, _Entry()))
    assert work._block(5), "the progress thread did not complete it"
    engine.close(1)


class _Entry:
    """A flight-recorder entry's fields that settle() writes."""
    peer = 1
    state = ended = source = None


def test_many_threads_waiting_on_one_work_all_wake_when_it_finishes():
    """A Work makes its Event only when a thread has to sleep on it: threads that start waiting
    before, during and after the finish all return its result, none sleeps through it."""
    for trial in range(20):
        work = Work(lambda: f"trial {trial}")
        got, start = [], threading.Barrier(9)

        def waiter():
            start.wait()
            got.append(work.wait(5))
        threads = [threading.Thread(target=waiter) for _ in range(8)]
        for t in threads:
            t.start()
        start.wait()
        work._finish(trial, None)
        late = work.wait(0)
        for t in threads:
            t.join(10)
        assert got == [trial] * 8 and late == trial


def test_a_work_nobody_finishes_times_out_naming_its_lazy_description():
    work = Work(lambda: "recv p2p#7 from rank 1 (tag 0) on rank 0")
    with pytest.raises(CommTimeoutError, match=r"recv p2p#7 from rank 1 .*not complete after waiting 0.05 s"):
        work.wait(0.05)
    assert not work.is_completed() and work.exception() is None
