"""Ranks in separate processes, some running the compiled window round and some the Python
round (RINGCOMM_COMPILED set per rank by an MPMD launch): every result must be the same bits on
every rank and equal the rank-order fold computed here with numpy.

    mpirun -n 1 -env RINGCOMM_COMPILED 0 python compiled_round.py : -n 2 python compiled_round.py

Prints "rank R ok CHECKS compiled=BOOL" per rank; an assertion names the first wrong case.
"""
import os
import sys
import zlib

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.core.ops import DTYPES, check_op, round_code

world = MPI.COMM_WORLD
comm = ringcomm.init()
rank, size = comm.rank, comm.size
window = comm.transport.window
assert window is not None, "no shared window: the job must run on one node over shm"
wants = os.environ.get("RINGCOMM_COMPILED", "1") != "0"
assert (window.core is not None) == wants, f"rank {rank}: RINGCOMM_COMPILED={wants} but core={window.core}"

checks = 0
for op in ringcomm.ReduceOp:
    for name, dtype in DTYPES.items():
        if op is ringcomm.ReduceOp.PREMUL_SUM or round_code(op, dtype) < 0:
            continue
        try:
            check_op("all_reduce", op, dtype)
        except ringcomm.UsageError:
            continue
        for count in (1, 255, 4097, 16384):
            def inputs(r):
                rng = np.random.default_rng(r * 131 + count)
                if dtype.is_float:
                    return (rng.standard_normal(count) * 1e3).astype(dtype.storage)
                info = np.iinfo(dtype.storage)
                return rng.integers(info.min, info.max, count, dtype=dtype.storage, endpoint=True)
            x = inputs(rank)
            with np.errstate(all="ignore"):
                comm.all_reduce(x, op=op.value, algorithm="one_shot")
                expected = inputs(0)
                ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                         "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op.value]
                for r in range(1, size):
                    expected = ufunc(expected, inputs(r))
                if op is ringcomm.ReduceOp.AVG:
                    expected = expected / expected.dtype.type(size)
            crcs = world.allgather(zlib.crc32(x.view(np.uint8)))
            assert len(set(crcs)) == 1, f"{op.value} {name} x {count}: ranks differ {crcs}"
            assert x.tobytes() == expected.tobytes(), f"{op.value} {name} x {count}: not the rank-order fold"
            checks += 1
print(f"rank {rank} ok {checks} compiled={window.core is not None}", flush=True)
comm.close()
sys.exit(0)
