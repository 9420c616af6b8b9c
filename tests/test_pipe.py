"""The pipe's ring of cells (transport/shm/_pipe.c, pipe.py) between two threads of one process:
every byte arrives whatever the size, the receiver fills its own sends while it waits, a
retired send is never filled again, and malformed descriptors are refused. Over real processes:
tests/mpi_jobs/shm_p2p.py (section 3d) under RINGCOMM_SHM_CMA=0."""
import shutil
import threading
import time

import numpy as np
import pytest

from ringcomm.transport.shm import pipe

needs_pipe = pytest.mark.skipif(pipe._pipe is None, reason="the compiled pipe (_pipe.c) is not built")

SIZES = [1, pipe.CELL - 1, pipe.CELL, pipe.CELL + 1, pipe.CELLS * pipe.CELL + 5, 5 * pipe.CELLS * pipe.CELL + 3]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_an_install_with_a_compiler_built_it():
    assert pipe._pipe is not None, "pip install -e . ran with a C compiler on PATH but _pipe.c is not built"


def ring():
    """A zeroed ring, 64-byte aligned like the staging pool's blocks."""
    raw = np.zeros(pipe.RING_BYTES + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at:at + pipe.RING_BYTES]


def message(nbytes, seed):
    return (np.arange(nbytes, dtype=np.int64) * (seed * 2 + 1) % 251).astype(np.uint8)


def fill_until_in(desc, errors):
    try:
        deadline = time.monotonic() + 30
        while not pipe.push(desc):
            assert time.monotonic() < deadline, "the receiver stopped emptying cells"
            time.sleep(0)
    except BaseException as err:   # noqa: BLE001 (reported by the test)
        errors.append(err)


@needs_pipe
@pytest.mark.parametrize("python_receiver", [False, True])
@pytest.mark.parametrize("nbytes", SIZES)
def test_every_byte_arrives(nbytes, python_receiver, monkeypatch):
    r, src, dst = ring(), message(nbytes, 1), np.zeros(nbytes, np.uint8)
    pipe.reset(r)
    errors = []
    sender = threading.Thread(target=fill_until_in, args=(pipe.descriptor(r, src), errors))
    sender.start()
    if python_receiver:
        monkeypatch.setattr(pipe, "enabled", lambda: False)
    desc = pipe.descriptor(r, dst)
    deadline = time.monotonic() + 30
    while not pipe.pull(desc, r, dst, (), 0.001):
        assert time.monotonic() < deadline
    sender.join()
    assert not errors, errors
    assert np.array_equal(dst, src)


@needs_pipe
def test_a_receiver_fills_its_own_sends_while_it_waits():
    """Two ranks exchanging large messages: each one's receive is the only thing filling its
    send, so pull must do both (a thread stands in for the peer)."""
    nbytes = 3 * pipe.CELLS * pipe.CELL + 17
    inbound, outbound = ring(), ring()
    pipe.reset(inbound)
    pipe.reset(outbound)
    mine, theirs = message(nbytes, 2), message(nbytes, 3)
    got_here, got_there = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    errors = []

    def peer():   # fills inbound and empties outbound, like the other rank's own pull
        try:
            send, recv = pipe.descriptor(inbound, theirs), pipe.descriptor(outbound, got_there)
            deadline = time.monotonic() + 30
            while not pipe.pull(recv, outbound, got_there, (send,), 0.001) or not pipe.push(send):
                assert time.monotonic() < deadline
        except BaseException as err:   # noqa: BLE001
            errors.append(err)

    other = threading.Thread(target=peer)
    other.start()
    send = pipe.descriptor(outbound, mine)
    pipe.push(send)
    recv = pipe.descriptor(inbound, got_here)
    deadline = time.monotonic() + 30
    while not pipe.pull(recv, inbound, got_here, (send,), 0.001) or not pipe.push(send):
        assert time.monotonic() < deadline
    other.join()
    assert not errors, errors
    assert np.array_equal(got_here, theirs) and np.array_equal(got_there, mine)


@needs_pipe
def test_a_retired_send_is_never_filled_again():
    r = ring()
    pipe.reset(r)
    src = message(4 * pipe.CELLS * pipe.CELL, 4)
    desc = pipe.descriptor(r, src)
    assert not pipe.push(desc)   # the ring holds CELLS cells of the message
    counters = r[:pipe.HEADER].view(np.int64)
    assert counters[pipe.WRITTEN] == pipe.CELLS
    pipe.retire(desc)
    counters[pipe.TAKEN] = pipe.CELLS   # the receiver emptied them: cells are free again
    assert not pipe.push(desc) and counters[pipe.WRITTEN] == pipe.CELLS
    pipe.retire(desc)   # twice is fine


@needs_pipe
@pytest.mark.parametrize("bad", ["short", "misaligned", "no cells", "negative"])
def test_malformed_descriptors_are_refused(bad):
    r, src = ring(), message(1000, 5)
    desc = pipe.descriptor(r, src)
    if bad == "short":
        desc = desc[:4].copy()
    elif bad == "misaligned":
        desc[pipe.RING] += 8
    elif bad == "no cells":
        desc[pipe.NCELLS] = 0
    else:
        desc[pipe.NBYTES] = -1
    with pytest.raises(ValueError, match="pipe: "):
        pipe.push(desc)
    with pytest.raises(ValueError, match="pipe: "):
        pipe._pipe.pull(pipe.descriptor(r, src), (desc,), 0.0)
