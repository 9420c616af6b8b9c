"""Threads in the tests: a call from a second thread (how the tests try the thread rule), and
ranks in threads whose every outcome, result or exception, is kept."""
import threading


def in_thread(fn, name: str = "intruder", timeout: float = 60):
    """Run ``fn()`` in a new thread named ``name`` and wait for it: (its result, its error or None)."""
    box = {"result": None, "error": None}

    def run():
        try:
            box["result"] = fn()
        except BaseException as err:   # noqa: BLE001 - handed back to the test
            box["error"] = err
    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(timeout)
    return box["result"], box["error"]


def outcomes(size: int, fn, timeout: float = 10) -> list:
    """``fn(comm)`` on ``size`` thread ranks: every rank's result or exception, in rank order
    (``run_threads`` raises the first exception instead)."""
    from ringcomm import Communicator
    from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld
    world = ThreadsWorld(size)
    out = [None] * size

    def main(rank):
        try:
            out[rank] = fn(Communicator(ThreadsTransport(world, rank), timeout=timeout))
        except BaseException as err:   # noqa: BLE001 - collected, then asserted on
            out[rank] = err
    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return out
