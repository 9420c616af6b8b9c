"""Read-only numpy inputs, taken where the call only reads them (MPI takes const send buffers):
out-of-place all_reduce, all_gather, reduce_scatter, all_to_all, gather, scatter and send, at
3 elements (staged), 1,000 and 1 Mi (read in place by CMA on shm), each result byte-equal to the
same call on a writable copy, on every backend given.

    mpirun -n N python read_only_inputs.py BACKEND [BACKEND ...]

Prints "read-only inputs: BACKEND ok" per backend on rank 0; exits 1 on any difference.
"""
import sys

import numpy as np

import ringcomm


def read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def check(c) -> list:
    n, r, wrong = c.size, c.rank, []
    calls = {
        "all_reduce": lambda x: c.all_reduce(x, out=np.empty_like(x)),
        "all_gather": lambda x: c.all_gather(np.empty(n * x.size, x.dtype), x),
        "reduce_scatter": lambda x: c.reduce_scatter(np.empty(x.size // n, x.dtype), x),
        "all_to_all": lambda x: c.all_to_all(np.empty_like(x), x),
        "gather": lambda x: c.gather(np.empty(n * x.size, x.dtype) if r == 0 else None, x, 0),
        "scatter": lambda x: c.scatter(np.empty(x.size // n, x.dtype), x if r == 0 else None, 0),
    }
    for count in (3, 1000, 1 << 20):
        x = np.arange(count * n, dtype=np.float32) + r
        for name, call in calls.items():
            for _ in range(3):   # the third call on the same buffers takes the memo's road
                got, want = call(read_only(x)), call(x)
                if (got is None) != (want is None) or (got is not None and got.tobytes() != want.tobytes()):
                    wrong.append(f"{name} x{count}")
        if n > 1:
            work = c.send(read_only(x), (r + 1) % n, async_op=True)
            got = np.empty_like(x)
            c.recv(got, (r - 1) % n)
            work.wait()
            if not np.array_equal(got, np.arange(count * n, dtype=np.float32) + (r - 1) % n):
                wrong.append(f"send x{count}")
    return wrong


failed = False
for backend in sys.argv[1:]:
    comm = ringcomm.init(backend)
    wrong = check(comm)
    for line in wrong[:5]:
        print(f"rank {comm.rank} ({backend}): {line} differs", flush=True)
    total = np.array([len(wrong)], np.int64)
    comm.all_reduce(total)
    failed |= bool(total[0])
    if comm.rank == 0 and not total[0]:
        print(f"read-only inputs: {backend} ok", flush=True)
sys.exit(1 if failed else 0)
