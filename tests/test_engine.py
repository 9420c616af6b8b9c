"""The engine's inline claim (core/progress.py): a blocking call run in its caller's thread holds
the communicator exactly like a queued one for the thread rule, and ends with no lock taken."""
import threading

from ringcomm.core.progress import Engine
from ringcomm.errors import UsageError
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
