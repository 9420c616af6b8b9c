"""A call from a second thread: how the tests try the thread rule."""
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
