"""Large sends through a ring of cells: the sender fills cells while its receiver empties them.

On a node that cannot read by CMA (where it can, one CMA copy beats two: messages.py), a
``comm.send`` of at least ``cma.P2P_MIN_BYTES`` (a rendezvous send: it completes when its
receiver has the bytes, like MPI's above its eager limit) takes a ring of CELLS cells of CELL
bytes from its staging-pool share and goes through it chunk by chunk (_pipe.c says why and
how). Both copies overlap and the cells stay in cache, where CMA's one copy pins every page and
a whole-message stage makes two full passes one after the other (docs/transports.md has the
figures).

The sender fills what it can when it publishes, then whenever its transport makes progress (its
caller's waits, the progress thread); a receiver empties cells in its receive's wait and, while
it waits for more, fills its own process's pipe sends, so two ranks exchanging large messages
keep each other going. The compiled piece does both; a receiving process without it (no
compiler at install, RINGCOMM_COMPILED=0) empties the cells in Python, more slowly, so sender
and receiver need not agree. A process without it sends no pipes.
"""
from __future__ import annotations

import time

import numpy as np

from ... import env
from ...core.compiled import array_address

try:
    from . import _pipe
except ImportError:   # not built: sends take CMA or the pool, receives empty rings in Python
    _pipe = None

CELL = 64 << 10          # bytes per cell: a chunk copied in and out while it stays in cache
CELLS = 8                # cells per ring (16 KiB-1 MiB cells x 2-32 measured alike at 4 and 64 MiB)
HEADER = 128             # the written and taken counters, a cache line each
RING_BYTES = HEADER + CELL * CELLS
RING, BUF, NBYTES, CELL_BYTES, NCELLS, BUSY = range(6)   # descriptor words (_pipe.c)
WRITTEN, TAKEN = 0, 8    # the counters, as int64 indexes into the ring


def enabled() -> bool:
    """This process sends pipes: the compiled piece is built and RINGCOMM_COMPILED allows it."""
    return _pipe is not None and env.get("RINGCOMM_COMPILED")


def reset(ring: np.ndarray) -> None:
    """Zero a ring's counters before its descriptor is published (its owner, under the lock)."""
    counters = ring[:HEADER].view(np.int64)
    counters[WRITTEN] = counters[TAKEN] = 0


def descriptor(ring: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """The int64 descriptor _pipe.c reads: where the ring and the (contiguous) buffer lie."""
    return np.array([array_address(ring), array_address(buf) if buf.nbytes else 0, buf.nbytes,
                     CELL, CELLS, 0], np.int64)


def push(desc: np.ndarray) -> bool:
    """Fill the free cells of a send's ring; True once every chunk is in."""
    return _pipe.push(desc)


def retire(desc: np.ndarray) -> None:
    """Stop filling a send's ring for good (acknowledged, or its transport closed): waits out a
    fill another thread may be running, so the ring can be given back."""
    _pipe.retire(desc)


def pull(desc: np.ndarray, ring: np.ndarray, buf: np.ndarray, sends: tuple, spin: float) -> bool:
    """Empty the ring into ``buf``, filling ``sends`` meanwhile; True once the message is all
    in, False after ``spin`` seconds without a chunk arriving (the caller checks on the sender
    and calls again)."""
    if enabled():
        return _pipe.pull(desc, sends, spin)
    return _pull_python(ring, buf.reshape(-1).view(np.uint8), spin)


def _pull_python(ring: np.ndarray, dst: np.ndarray, spin: float) -> bool:
    counters = ring[:HEADER].view(np.int64)
    chunks = -(-dst.size // CELL)
    i = int(counters[TAKEN])
    idle_since = None
    while i < chunks:
        if counters[WRITTEN] > i:   # ordered as rings.py's descriptors are (TSO: check_ordering)
            at = HEADER + (i % CELLS) * CELL
            n = min(CELL, dst.size - i * CELL)
            dst[i * CELL:i * CELL + n] = ring[at:at + n]
            i += 1
            counters[TAKEN] = i
            idle_since = None
            continue
        now = time.monotonic()
        if idle_since is None:
            idle_since = now
        elif now - idle_since >= spin:
            return False
    return True
