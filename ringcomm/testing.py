"""Run N ranks as threads of this process: unit-test any algorithm on a laptop CPU.

    results = run_threads(4, lambda comm: comm.all_reduce(np.ones(8)))

An exception on any rank aborts the in-process job (every other rank is released from its waits
instead of hanging) and is re-raised here, annotated with the rank it came from.
"""
from __future__ import annotations

import threading
from typing import Callable

from .communicator import DEFAULT_TIMEOUT, Communicator
from .errors import PeerAbortedError
from .transport.threads import ThreadsTransport, ThreadsWorld


def run_threads(world_size: int, fn: Callable, *args, timeout: float = DEFAULT_TIMEOUT, **comm_kwargs) -> list:
    """Call ``fn(comm, *args)`` on ``world_size`` ranks in threads; return results in rank order."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f'run_threads got unexpected value for argument "world_size" '
                         f'(expected an int >= 1, got {world_size!r})')
    world = ThreadsWorld(world_size)
    results: list = [None] * world_size
    errors: dict = {}

    def rank_main(rank: int) -> None:
        comm = None
        try:
            comm = Communicator(ThreadsTransport(world, rank), timeout=timeout, **comm_kwargs)
            results[rank] = fn(comm, *args)
        except BaseException as err:
            errors[rank] = err
            world.abort(f"rank {rank} raised {type(err).__name__}: {err}")
        finally:
            if comm is not None:
                comm.close()

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank-{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # The first rank that failed on its own, not one that was merely released by the abort.
        rank = min((r for r, e in errors.items() if not isinstance(e, PeerAbortedError)), default=min(errors))
        err = errors[rank]
        if hasattr(err, "add_note"):
            err.add_note(f"raised on rank {rank} of {world_size} (ringcomm.testing.run_threads)")
            raise err
        raise RuntimeError(f"rank {rank} of {world_size} raised {type(err).__name__}: {err}") from err
    return results
