"""Every dtype x op: ringcomm's all_reduce against torch's own gloo process group, same inputs.

    mpirun -n N python ops_vs_gloo.py REPORT.json

For each pair both run (or refuse); rank 0 writes REPORT.json: {"pairs": {"dtype op": {"gloo":
"ok"|"refused: ...", "ringcomm": "ok"|"refused: ...", "equal": "bitwise"|"close"|"differ"|None}}}.
Inputs are small integers (exact in every dtype), so sums agree bitwise wherever both reduce
pairwise in the same order (two ranks), and within rounding otherwise.
"""
import datetime
import json
import sys

import torch
import torch.distributed as dist

import ringcomm
from ringcomm.backends import c10d

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
       "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR, "premul_sum": None}


def inputs(rank, dtype):
    if dtype == torch.bool:
        return torch.tensor([rank % 2 == 0, True, False, rank == 1, True, rank > 0])
    return (torch.tensor([1, 2, 3, 5, 7, 11]) + rank).to(dtype)


def main():
    comm = ringcomm.init("ringcomm", timeout=30)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    store, host = c10d.rendezvous(world, 30, "gloo")
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=30)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    pg = dist.ProcessGroupGloo(store, comm.rank, comm.size, options)
    pairs = {}
    for dtype in DTYPES:
        for name, op in OPS.items():
            entry = {}
            theirs = inputs(comm.rank, dtype)
            try:
                if op is None:
                    raise RuntimeError("gloo has no premul_sum (torch makes it for NCCL only)")
                opts = dist.AllreduceOptions()
                opts.reduceOp = op
                pg.allreduce([theirs], opts).wait()
                entry["gloo"] = "ok"
            except Exception as err:   # gloo refuses the pair (every rank alike)
                entry["gloo"] = f"refused: {str(err).splitlines()[0][:80]}"
                theirs = None
            mine = inputs(comm.rank, dtype)
            try:
                comm.all_reduce(mine, ringcomm.premul_sum(0.5) if name == "premul_sum" else name)
                entry["ringcomm"] = "ok"
            except ringcomm.UsageError as err:
                entry["ringcomm"] = f"refused: {str(err)[:120]}"
                mine = None
            if theirs is not None and mine is not None:
                a, b = theirs.view(torch.uint8), mine.view(torch.uint8)
                if torch.equal(a, b):
                    entry["equal"] = "bitwise"
                elif torch.allclose(theirs.double(), mine.double(), rtol=2 ** -7):
                    entry["equal"] = "close"
                else:
                    entry["equal"] = f"differ: gloo {theirs.tolist()} ringcomm {mine.tolist()}"
            pairs[f"{str(dtype).replace('torch.', '')} {name}"] = entry
    everyone = world.gather(pairs)
    if comm.rank == 0:
        agree = all(p == everyone[0] for p in everyone)
        with open(sys.argv[1], "w") as fh:
            json.dump({"pairs": everyone[0], "ranks_agree": agree}, fh, indent=1)
    pg = None
    world.Barrier()


main()
