"""How every wait in ringcomm waits: poll, then sleep, never past its deadline.

A wait first polls (a message is often there within microseconds), then sleeps with backoff so
that ranks sharing cores let the peer they wait for run. How long to poll depends on that
sharing. A sleep on this kind of machine lasts ~80 us however short it is asked to be (timer
slack plus wake-up), so a rank that gives up polling early pays ~80 us for a peer that was a
few microseconds late; and MPI's nonblocking collectives progress only while someone tests
them, so a sleeping waiter stalls them outright (the `mpi` backend's 256 KiB all-reduce took
1.08 ms with 50 us of polling, 72 us with 2 ms). Ranks with cores of their own therefore poll for
2 ms; ranks that outnumber the cores poll for 50 us, or they would take the CPU from the peer.

``set_ranks_here(n)`` (called by ``ringcomm.init`` with the number of ranks on this machine)
sets the budget for the process; transports with their own idea (the shm window, which knows
its node) pass ``spin=`` explicitly, from ``spin_for``, which counts this machine's ranks as well:
nodes named by RINGCOMM_NODE_ID can be several to a machine, and their ranks then share its
cores (4 ranks as 2 pretend nodes of 2 on 2 cores: the one-shot rounds of the two nodes'
splits, polling 2 ms each, averaged 2-4 ms per 1 KiB all-reduce instead of 4 us).

Polling with sched_yield instead of sleeping was tried: on an idle machine it cut a 1 KiB ring
all-reduce from 277 to 124 us (2 ranks), but with the machine loaded by other jobs it was 2-3x
slower than sleeping (a yielding process stays runnable and takes the CPU its peer needs, while a
sleeper leaves the run queue), so waits sleep.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from ..errors import PeerAbortedError

SPIN_SHARED = 50e-6     # ranks outnumber cores
SPIN_DEDICATED = 2e-3   # every rank has a core
MAX_SLEEP = 1e-3

_spin = SPIN_SHARED   # until init says how many ranks share this machine
_ranks_here = 1


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1


def spin_for(ranks_here: int) -> float:
    """The polling budget for ``ranks_here`` ranks (and the job's others on this machine, as
    ``set_ranks_here`` last said) sharing this machine's cores."""
    return SPIN_DEDICATED if max(ranks_here, _ranks_here) <= cores() else SPIN_SHARED


def set_ranks_here(ranks_here: int) -> float:
    """Set this process's polling budget from the number of ranks on its machine; returns it."""
    global _spin, _ranks_here
    _ranks_here = max(1, ranks_here)
    _spin = spin_for(ranks_here)
    return _spin


def wait_polling(test, timeout: Optional[float], aborted=lambda: None, spin: Optional[float] = None) -> bool:
    """Poll ``test()`` until True (-> True) or ``timeout`` passes (-> False): poll for ``spin``
    seconds (default: the process's budget), then sleep with backoff, checking ``aborted()``."""
    if test():
        return True
    start = time.monotonic()
    spin_until = start + (_spin if spin is None else spin)
    deadline = None if timeout is None else start + timeout
    nap = 10e-6
    while True:
        now = time.monotonic()
        if now >= spin_until:
            reason = aborted()
            if reason is not None:
                if test():   # what it waits for came before the peer left (a peer's last post, then its close)
                    return True
                raise PeerAbortedError(reason)
            if deadline is not None and now >= deadline:
                return False
            time.sleep(nap)
            nap = min(nap * 2, MAX_SLEEP)
        if test():
            return True


def join_threads(threads, timeout: float) -> list:
    """Join ``threads`` within ``timeout`` seconds in all (not each), skipping the calling thread
    (a callback may close what runs it); returns those still alive. For threads that hold torch
    objects, which must end before the interpreter's exit does (integrations/torch_engine.py,
    backends/c10d.py)."""
    me, deadline = threading.current_thread(), time.monotonic() + timeout
    for thread in threads:
        if thread is not me:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]
