"""What one small all_reduce costs in Python before (and around) the bytes that move.

    python benchmarks/call_overhead.py                  # in-process, over a transport that moves nothing
    mpirun -n 2 python benchmarks/call_overhead.py      # also: real 2-rank calls, MPI alongside, cProfile

In-process, a Communicator runs over ``NullTransport`` (every send and receive completes at
once, no byte moves), so the time of one ``all_reduce`` is exactly the library's own cost:
argument checks, selection, plan lookup, dispatch, executor. Each phase is then timed alone.
Under mpirun the same call runs over the real transport next to mpi4py's ``Allreduce`` and
rank 0 prints the cProfile of the loop. Every figure is the best of several repeats, since the
machine may be shared.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
import timeit

import numpy as np

from ringcomm import algorithms
from ringcomm.collectives import ALL_REDUCE
from ringcomm.communicator import Communicator
from ringcomm.core import executor
from ringcomm.core.buffers import as_buffer
from ringcomm.core.envelope import Envelope
from ringcomm.core.ops import ReduceOp, reducer
from ringcomm.core.progress import settle
from ringcomm.core.schedule import DEFAULT_SEGMENT_BYTES, Shape
from ringcomm.transport.base import DoneRequest, Transport
from ringcomm.transport.window import Window, region_bytes
from ringcomm.work import Work


class NullTransport(Transport):
    """Every request completes at once and nothing is copied: the library's cost alone."""
    name = "null"

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def isend(self, buf, peer, tag):
        return DoneRequest()

    def irecv(self, buf, peer, tag):
        return DoneRequest()


def mirror_window(size: int) -> Window:
    """A window whose every rank is this one: each round finds all "peers" posted, with this
    rank's own stamp, so a one-shot all-reduce runs its whole path (copy in, flags, stamps,
    n-1 reductions) without waiting for anybody."""
    region = np.zeros(region_bytes(), np.uint8)
    return Window(0, [region] * size)


def best_us(fn, number: int, repeat: int) -> float:
    """CPU seconds of this thread per call: nothing here waits, and time the OS hands to other
    processes on a shared machine does not count (wall-clock figures would measure the load)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.thread_time)) / number * 1e6


def recorder_rows(comm, count: int) -> list:
    """The flight-recorder bookkeeping of one call, step by step as the communicator and the
    engine do it: a collective's entry (made, running, done) and a send's (made, posted, settled)."""
    recorder, work = comm.recorder, Work("send p2p#1 to rank 1 (tag 3) on rank 0")

    def collective():
        entry = recorder.record(1, "all_reduce", count, "float32")
        entry.state, entry.started = "running", time.monotonic()
        entry.state, entry.ended = "done", time.monotonic()

    def point_to_point():
        entry = recorder.record_p2p(1, "send", 1, 3, count, "float32")
        entry.started = time.monotonic()
        entry.state = "posted"
        settle(entry, work, "done")
    return [("flight-recorder entry of a collective (record, running, done)", collective),
            ("flight-recorder entry of a send/recv (record, posted, settled)", point_to_point)]


def phases(nbytes: int, size: int, number: int, repeat: int) -> list[tuple[str, float]]:
    comm = Communicator(NullTransport(0, size))
    x = np.zeros(nbytes // 4, np.float32)   # zeros: the null "reductions" never overflow
    buf = as_buffer(x, "all_reduce", "x")
    chosen = comm.selector.choose("all_reduce", x.nbytes, size)
    seg = DEFAULT_SEGMENT_BYTES // 4
    shape = Shape(size, x.size, seg=seg)
    program = algorithms.plan("all_reduce", chosen, 0, shape)
    red = reducer(ReduceOp.SUM, buf.dtype)
    envelope = Envelope(1, ALL_REDUCE.code, "float32", x.size)
    shared = NullTransport(0, size)
    shared.name, shared.window = "shm", mirror_window(size)   # as the shm transport on one node
    on_window = Communicator(shared)
    window_pick = on_window.selector.choose("all_reduce", x.nbytes, size, transport=shared)
    one_shot = algorithms.get("all_reduce", "one_shot")
    window_shape = Shape(size, x.size)
    rows = [
        (f"all_reduce(x), whole call, ranks sharing memory (auto -> {window_pick}, mirror window)",
         lambda: on_window.all_reduce(x)),
        ("  one_shot.run alone (copy in, flags, stamps, reduce)",
         lambda: one_shot.run(shared.window, x, x, window_shape, red, 1, 0, None)),
        (f"all_reduce(x), whole call, no shared window (auto -> {chosen})", lambda: comm.all_reduce(x)),
        (f"all_reduce(x, algorithm={chosen!r})", lambda: comm.all_reduce(x, algorithm=chosen)),
        ("  as_buffer (type, dtype, layout checks)", lambda: as_buffer(x, "all_reduce", "x")),
        ("  ALL_REDUCE.prepare (all argument checks)", lambda: ALL_REDUCE.prepare(comm, x)),
        ("  selector.choose", lambda: comm.selector.choose("all_reduce", x.nbytes, size)),
        ("  algorithms.plan (cached program)", lambda: algorithms.plan("all_reduce", chosen, 0, shape)),
        ("  reducer(op, dtype)", lambda: reducer(ReduceOp.SUM, buf.dtype)),
        ("  Envelope (what peers check the call against)", lambda: Envelope(1, ALL_REDUCE.code, "float32", x.size)),
        ("  executor.run over the null transport", lambda: executor.run(program, comm.transport, (x, x, None), red,
                                                                         envelope=envelope, timeout=300.0,
                                                                         what="w")),
        ("  one reduction kernel np.add(out=)", lambda: red(x, x)),
    ] + recorder_rows(comm, x.size)
    with np.errstate(all="ignore"):   # null receives leave scratch as it was: its sums mean nothing
        return [(label, best_us(fn, number, repeat)) for label, fn in rows]


def real_calls(world, nbytes: int, number: int, repeat: int, top: int) -> None:
    import ringcomm
    from mpi4py import MPI
    comm = ringcomm.init()
    x = np.zeros(nbytes // 4, np.float32)
    mpi = world.Dup()

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(repeat):
            world.Barrier()
            best = min(best, timeit.timeit(fn, number=number) / number * 1e6)
        return world.allreduce(best, op=MPI.MAX)

    fns = {"ringcomm all_reduce (auto)": lambda: comm.all_reduce(x),
           "mpi4py Allreduce(IN_PLACE)": lambda: mpi.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)}
    for fn in fns.values():   # warm caches and connections
        for _ in range(50):
            fn()
    got = {label: timed(fn) for label, fn in fns.items()}
    profile = cProfile.Profile()
    world.Barrier()
    profile.enable()
    for _ in range(number):
        comm.all_reduce(x)
    profile.disable()
    if world.Get_rank() == 0:
        print(f"\n# real calls, {world.Get_size()} ranks, {nbytes} B float32, best of {repeat} x {number}, "
              f"max over ranks")
        for label, us in got.items():
            print(f"{us:9.2f} us  {label}")
        print(f"{got['ringcomm all_reduce (auto)'] / got['mpi4py Allreduce(IN_PLACE)']:9.2f} x   "
              f"ringcomm / MPI")
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
        print(f"\n# cProfile of {number} ringcomm calls on rank 0 (tottime order; profiling inflates "
              f"every Python call)")
        print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))
    comm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--number", type=int, default=5000, help="calls per timing")
    p.add_argument("--repeat", type=int, default=7, help="timings; the best is reported")
    p.add_argument("--top", type=int, default=18, help="cProfile rows")
    args = p.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    size = max(2, world.Get_size())
    if world.Get_rank() != 0:   # idle without spinning, so rank 0 times phases on a quiet core
        give_up = time.monotonic() + 600
        while not world.Iprobe(source=0, tag=77):
            if time.monotonic() > give_up:
                raise SystemExit("rank 0 never finished its in-process phases")
            time.sleep(0.002)
        world.recv(source=0, tag=77)
    else:
        try:
            print_phases(args, size)
        finally:   # release the other ranks even if the phases fail
            for peer in range(1, world.Get_size()):
                world.send(None, dest=peer, tag=77)
    if world.Get_size() > 1:
        real_calls(world, args.bytes, args.number, args.repeat, args.top)


def print_phases(args, size: int) -> None:
    print(f"# library cost of one all_reduce of {args.bytes} B float32 on {size} ranks, no byte moved "
          f"(NullTransport), thread CPU time, best of {args.repeat} x {args.number}")
    for label, us in phases(args.bytes, size, args.number, args.repeat):
        print(f"{us:9.2f} us  {label}")


if __name__ == "__main__":
    main()
