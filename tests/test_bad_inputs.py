"""Every bad input raises a clear error (argument, expected, got) on the calling rank, before any
communication: the peer rank never enters the collective, and no message is ever posted."""
import numpy as np
import pytest
import torch

import ringcomm
from ringcomm import ArgumentTypeError, Communicator, UsageError, algorithms
from ringcomm.testing import run_threads
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
i32 = np.zeros(8, np.int32)
CASES = [
    # (call, error type, words the message must contain)
    (lambda c: c.all_reduce(torch.ones(4, 4).t()), UsageError, ['"x"', "contiguous", "strides"]),
    (lambda c: c.all_reduce(torch.ones(4).to_sparse()), UsageError, ['"x"', "dense", "sparse_coo"]),
    (lambda c: c.broadcast(torch.ones(4, 4).to_sparse_csr()), UsageError, ['"x"', "dense", "sparse_csr"]),
    (lambda c: c.all_reduce(np.ones((4, 4))[:, ::2]), UsageError, ['"x"', "contiguous"]),
    (lambda c: c.all_reduce(np.ones(4, np.uint16)), ArgumentTypeError, ['"x"', "uint16"]),
    (lambda c: c.all_reduce(torch.ones(4, dtype=torch.complex64)), ArgumentTypeError, ['"x"', "complex64"]),
    (lambda c: c.all_reduce(np.ones(4, np.complex128)), ArgumentTypeError, ['"x"', "complex128"]),
    (lambda c: c.all_reduce(np.ones(4, ">f4")), ArgumentTypeError, ['"x"', "big-endian dtype >f4", "byte order",
                                                                     "newbyteorder('=')"]),
    (lambda c: c.send(np.ones(4, ">i8"), 1), ArgumentTypeError, ['"x"', "big-endian dtype >i8"]),
    (lambda c: c.all_reduce([1.0, 2.0]), ArgumentTypeError, ['"x"', "torch.Tensor or numpy.ndarray", "list"]),
    (lambda c: c.all_reduce(i32, op="avg"), UsageError, ['"op"', "int32", "avg"]),
    (lambda c: c.all_reduce(f32, op="mean"), UsageError, ['"op"', "sum, avg, prod, min, max", "mean"]),
    (lambda c: c.all_reduce(f32, op="band"), UsageError, ['"op"', "float32", "band"]),
    (lambda c: c.all_reduce(np.ones(4, bool), op="avg"), UsageError, ['"op"', "bool", "avg"]),
    (lambda c: c.all_reduce(i32, op=ringcomm.premul_sum(2.0)), UsageError, ['"op"', "int32", "premul_sum"]),
    (lambda c: c.all_reduce(f32, op=ringcomm.ReduceOp.PREMUL_SUM), UsageError, ['"op"', "premul_sum(factor)"]),
    (lambda c: ringcomm.premul_sum(float("nan")), UsageError, ['"factor"', "finite", "nan"]),
    (lambda c: ringcomm.premul_sum("2"), ArgumentTypeError, ['"factor"', "real number", "str"]),
    (lambda c: c.all_reduce(f32, algorithm="butterfly"), UsageError,
     ['"algorithm"', "ring", "tree", "recursive_doubling", "rabenseifner", "butterfly"]),
    (lambda c: c.all_reduce(f32, algorithm=3), ArgumentTypeError, ['"algorithm"', "str", "int"]),
    (lambda c: c.all_reduce(f32, out=np.zeros(7, np.float32)), UsageError, ['"out"', "8 elements", "7"]),
    (lambda c: c.all_reduce(f32, out=np.zeros(8, np.float64)), ArgumentTypeError, ['"out"', "float32", "float64"]),
    (lambda c: c.all_reduce(f32, out=torch.zeros(8)), ArgumentTypeError, ['"out"', "numpy", "torch"]),
    (lambda c: c.all_reduce(f32[:4], out=f32[2:6]), UsageError, ['"out"', "overlap"]),
    (lambda c: c.broadcast(f32, algorithm="rabenseifner"), UsageError, ['"algorithm"', "binomial"]),
    (lambda c: c.broadcast(f32, root=2), UsageError, ['"root"', "[0, 1]", "2"]),
    (lambda c: c.reduce(f32, root=-1), UsageError, ['"root"', "-1"]),
    (lambda c: c.reduce(f32, root=1.0), ArgumentTypeError, ['"root"', "int", "float"]),
    (lambda c: c.reduce(f32, root=1, out=np.zeros(8, np.float32)), UsageError, ['"out"', "None", "root 1"]),
    (lambda c: c.all_gather(np.zeros(15, np.float32), f32), UsageError, ['"out"', "16 elements", "15"]),
    (lambda c: c.all_gather(torch.zeros(16), f32), ArgumentTypeError, ['"out"', "numpy", "torch"]),
    (lambda c: c.all_gather(np.zeros(16, np.float64), f32), ArgumentTypeError, ['"out"', "float32", "float64"]),
    (lambda c: c.all_gather(np.zeros(9, np.float32), f32, counts=[8]), UsageError, ['"counts"', "2 counts", "1"]),
    (lambda c: c.all_gather(np.zeros(9, np.float32), f32, counts=[8, -1]), UsageError, ['"counts"', "non-negative"]),
    (lambda c: c.all_gather(np.zeros(9, np.float32), f32, counts=[7, 2]), UsageError, ['"x"', "7 elements", "8"]),
    (lambda c: c.all_gather(np.zeros(9, np.float32), f32, counts=[8, 2]), UsageError, ['"out"', "10 elements", "9"]),
    (lambda c: c.all_gather(np.zeros(9, np.float32), f32, counts="88"), ArgumentTypeError, ['"counts"', "str"]),
    (lambda c: c.reduce_scatter(np.zeros(4, np.float32), np.zeros(9, np.float32)), UsageError, ['"x"', "multiple of 2"]),
    (lambda c: c.reduce_scatter(np.zeros(5, np.float32), f32), UsageError, ['"out"', "4 elements", "5"]),
    (lambda c: c.reduce_scatter(np.zeros(4, np.float32), torch.zeros(8)), ArgumentTypeError, ['"out"']),
    (lambda c: c.reduce_scatter(np.zeros(3, np.float32), f32, counts=[3, 4]), UsageError, ['"x"', "7 elements"]),
    (lambda c: c.reduce_scatter(f32[1:4], f32, counts=[3, 5]), UsageError, ['"out"', "overlapping"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), np.zeros(7, np.float32)), UsageError, ['"x"', "multiple of 2"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), f32, in_splits=[4]), UsageError, ['"in_splits"', "2 counts"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), f32, in_splits=[4, 5]), UsageError, ['"x"', "9 elements", "8"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), f32, out_splits=[4, 3]), UsageError, ['"out"', "7 elements"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), f32, out_splits=[4.0, 4]), UsageError, ['"out_splits"']),
    (lambda c: c.all_to_all(np.zeros(8, np.int32), f32), ArgumentTypeError, ['"out"', "float32", "int32"]),
    (lambda c: c.all_to_all(np.zeros(6, np.float32), f32), UsageError, ['"out"', "8 elements", "as many as x", "6"]),
    (lambda c: c.all_to_all(np.zeros(8, np.float32), f32, out_splits=[5, 3], in_splits=[5, 3], algorithm="bruck"),
     UsageError, ['"algorithm"', "uneven", "bruck"]),
    (lambda c: c.gather(np.zeros(16, np.float32), f32, root=1), UsageError, ['"out"', "None", "root 1"]),
    (lambda c: c.gather(None, f32, root=0), UsageError, ['"out"', "16 elements"]),
    (lambda c: c.gather(np.zeros(15, np.float32), f32, root=0), UsageError, ['"out"', "16 elements", "15"]),
    (lambda c: c.scatter(f32, np.zeros(16, np.float32), root=1), UsageError, ['"x"', "None", "root 1"]),
    (lambda c: c.scatter(f32, np.zeros(15, np.float32), root=0), UsageError, ['"x"', "16 elements", "15"]),
    (lambda c: c.scatter(f32, None, root=0), UsageError, ['"x"', "16 elements"]),
    (lambda c: c.send(f32, 0), UsageError, ['"dst"', "other than this one"]),
    (lambda c: c.send(f32, 2), UsageError, ['"dst"', "[0, 1]", "2"]),
    (lambda c: c.send(f32, 1, tag=-1), UsageError, ['"tag"', "-1"]),
    (lambda c: c.send(f32, 1, tag=1 << 23), UsageError, ['"tag"', str((1 << 23) - 1)]),
    (lambda c: c.send(f32, 1, tag=1.0), ArgumentTypeError, ['"tag"', "int", "float"]),
    (lambda c: c.recv(f32, 5), UsageError, ['"src"', "5"]),
    (lambda c: c.recv([0.0], 1), ArgumentTypeError, ['"out"', "list"]),
    (lambda c: c.split(-1), UsageError, ['"color"', "-1"]),
    (lambda c: c.split("a"), UsageError, ['"color"', "'a'"]),
    (lambda c: c.split(0, key=1.5), ArgumentTypeError, ['"key"', "int", "float"]),
    (lambda c: c.split(2 ** 31), UsageError, ['"color"', "2**31", str(2 ** 31)]),   # MPI_Comm_split's int
    (lambda c: c.split(0, key=-2 ** 31 - 1), UsageError, ['"key"', str(-2 ** 31 - 1)]),
    (lambda c: c.all_reduce(np.frombuffer(b"\0" * 16, np.float32)), UsageError, ['"x"', "writable"]),
    # its views keep the mask: the reshape to bytes failed in the middle of the collective
    (lambda c: c.all_reduce(np.ma.masked_array(f32, mask=[0, 1] * 4)), UsageError, ['"x"', "mask", "MaskedArray"]),
    (lambda c: c.send(np.ma.masked_array(f32), 1), UsageError, ['"x"', "MaskedArray"]),
]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
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


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


READ_ONLY_CALLS = {   # (collective, call on read-only inputs): every call here only reads them
    "all_reduce": lambda c, x, n: c.all_reduce(x, out=np.empty_like(x)),
    "all_gather": lambda c, x, n: c.all_gather(np.empty(n * x.size, x.dtype), x),
    "reduce_scatter": lambda c, x, n: c.reduce_scatter(np.empty(x.size // n, x.dtype), x),
    "all_to_all": lambda c, x, n: c.all_to_all(np.empty_like(x), x),
    "gather": lambda c, x, n: c.gather(np.empty(n * x.size, x.dtype) if c.rank == 0 else None, x, 0),
    "scatter": lambda c, x, n: c.scatter(np.empty(x.size // n, x.dtype), x if c.rank == 0 else None, 0),
}


@pytest.mark.parametrize("collective", sorted(READ_ONLY_CALLS))
@pytest.mark.parametrize("size", [1, 2, 3])
def test_read_only_inputs_are_taken_where_the_call_only_reads_them(collective, size):
    """MPI takes a const send buffer: so does every call here that never writes its input, on
    every algorithm, with the writable input's result; a read-only input that would be written
    (in place, a broadcast's buffer) is still refused before any message moves."""
    call = READ_ONLY_CALLS[collective]

    def body(comm):
        results = {}
        for algorithm in [None] + algorithms.names(collective):
            x = np.arange(12 * size, dtype=np.float64) + 100 * comm.rank
            ro = _read_only(x)
            got, want = call(comm, ro, size), call(comm, x, size)
            results[algorithm] = (None if got is None else got.tobytes(), None if want is None else want.tobytes())
            assert np.array_equal(ro, x)
        return results
    for results in run_threads(size, body, timeout=60):
        for algorithm, (got, want) in results.items():
            assert got == want, f"{collective} {algorithm}"


def test_a_read_only_input_the_call_would_write_is_refused():
    def body(comm):
        with pytest.raises(UsageError, match='"x".*writable'):
            comm.all_reduce(_read_only(np.ones(4)))       # in place
        with pytest.raises(UsageError, match='"x".*writable'):
            comm.broadcast(_read_only(np.ones(4)), 0)   # in and out, as MPI_Bcast's buffer (not const)
        return True
    assert run_threads(2, body, timeout=20) == [True, True]
