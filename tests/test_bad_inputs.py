"""Every bad input raises a clear error (argument, expected, got) on the calling rank, before any
communication: the peer rank never enters the collective, and no message is ever posted."""
import numpy as np
import pytest
import torch

import ringcomm
from ringcomm import ArgumentTypeError, Communicator, UsageError
from ringcomm.transport.threads import ThreadsTransport, ThreadsWorld


@pytest.fixture
def lone():
    """Rank 0 of a 2-rank world whose rank 1 never shows up: any communication would time out."""
    world = ThreadsWorld(2)
    comm = Communicator(ThreadsTransport(world, 0), timeout=5)
    yield comm
    for box in world.boxes:   # nothing was sent, nothing is waiting
        assert not any(box.arrived.values()) and not any(box.posted.values())


f32 = np.zeros(8, np.float32)
CASES = [
    # (call, error type, words the message must contain)
    (lambda c: c.all_reduce(torch.ones(4, 4).t()), UsageError, ['"x"', "contiguous", "strides"]),
    (lambda c: c.all_reduce(np.ones((4, 4))[:, ::2]), UsageError, ['"x"', "contiguous"]),
    (lambda c: c.all_reduce(np.ones(4, np.int16)), ArgumentTypeError, ['"x"', "int16"]),
    (lambda c: c.all_reduce(torch.ones(4, dtype=torch.complex64)), ArgumentTypeError, ['"x"', "complex64"]),
    (lambda c: c.all_reduce(np.ones(4, bool)), ArgumentTypeError, ['"x"', "bool"]),
    (lambda c: c.all_reduce([1.0, 2.0]), ArgumentTypeError, ['"x"', "torch.Tensor or numpy.ndarray", "list"]),
    (lambda c: c.all_reduce(np.ones(4, np.int32), op="avg"), UsageError, ['"op"', "int32", "avg"]),
    (lambda c: c.all_reduce(f32, op="mean"), UsageError, ['"op"', "sum, avg, prod, min, max", "mean"]),
    (lambda c: c.all_reduce(f32, algorithm="butterfly"), UsageError,
     ['"algorithm"', "ring", "tree", "recursive_doubling", "rabenseifner", "butterfly"]),
    (lambda c: c.all_reduce(f32, algorithm=3), ArgumentTypeError, ['"algorithm"', "str", "int"]),
    (lambda c: c.broadcast(f32, algorithm="rabenseifner"), UsageError, ['"algorithm"', "binomial"]),
    (lambda c: c.broadcast(f32, root=2), UsageError, ['"root"', "[0, 1]", "2"]),
    (lambda c: c.reduce(f32, root=-1), UsageError, ['"root"', "-1"]),
    (lambda c: c.reduce(f32, root=1.0), ArgumentTypeError, ['"root"', "int", "float"]),
    (lambda c: c.all_gather(np.zeros(15, np.float32), f32), UsageError, ['"out"', "16 elements", "15"]),
    (lambda c: c.all_gather(torch.zeros(16), f32), ArgumentTypeError, ['"out"', "numpy", "torch"]),
    (lambda c: c.all_gather(np.zeros(16, np.float64), f32), ArgumentTypeError, ['"out"', "float32", "float64"]),
    (lambda c: c.reduce_scatter(np.zeros(4, np.float32), np.zeros(9, np.float32)), UsageError, ['"out"']),
    (lambda c: c.reduce_scatter(np.zeros(5, np.float32), f32), UsageError, ['"out"', "4 elements", "5"]),
    (lambda c: c.reduce_scatter(np.zeros(4, np.float32), torch.zeros(8)), ArgumentTypeError, ['"out"']),
    (lambda c: c.all_reduce(np.frombuffer(b"\0" * 16, np.float32)), UsageError, ['"x"', "writable"]),
]


@pytest.mark.parametrize("call,error,words", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_input_raises_before_communicating(lone, call, error, words):
    with pytest.raises(error) as info:
        call(lone)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert "expected" in message and "got" in message


def test_bad_input_on_async_call_raises_at_the_call_not_at_wait(lone):
    with pytest.raises(UsageError):
        lone.all_reduce(f32, op="median", async_op=True)


def test_errors_are_also_the_builtin_types_callers_already_catch():
    assert issubclass(UsageError, ValueError) and issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ringcomm.CommTimeoutError, ringcomm.CommError)


def test_names_of_unknown_collective():
    with pytest.raises(UsageError, match="all_reduce"):
        ringcomm.algorithms.names("allreduce")
    assert "ring" in ringcomm.algorithms.names("all_reduce")
