"""Fault injection for tests: RINGCOMM_FAULT=phase:rank:signal sends ``signal`` to rank ``rank``
when it reaches ``phase``. Testing only: it kills or stops the process on purpose.

Phases (where the hook fires):
  setup       shm transport setup, after this rank created its control segment file and before
              the node-wide handshake that lets peers map it (the window in which a file exists)
  segment     ``allocate``, after this rank created its segment file, before the handshake
  ring        the third non-empty message this rank sends over shared memory (mid-collective)
  one_shot    after this rank posted its second one-shot window round
  direct      the first time this rank reaches into a peer's memory in a direct algorithm (its
              reads or writes under way, the call's addresses traded)
  cma         after this rank published its first message for a peer to read by CMA
  pool_full   the first time a send of this rank waits for room in its staging pool
  ddp_bucket  left to the job script: ``fire("ddp_bucket", rank)`` where a DDP bucket launches
Signals: KILL, TERM, STOP (SIGSTOP: the test harness kills the stopped rank afterwards).

The transports look the variable up once (``armed``) and keep None when it is unset, so the hooks
cost one attribute test where they sit.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import NamedTuple, Optional

PHASES = ("setup", "segment", "ring", "one_shot", "direct", "cma", "pool_full", "ddp_bucket")
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP}


class Fault(NamedTuple):
    phase: str
    rank: int
    signal: str


def parse(text: str) -> Fault:
    """"ring:1:KILL" -> Fault; ValueError naming what is accepted otherwise."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in PHASES or not parts[1].isdigit() or parts[2].upper() not in SIGNALS:
        raise ValueError(f"expected phase:rank:signal with phase one of {', '.join(PHASES)}, "
                         f"rank a world rank and signal one of {', '.join(SIGNALS)}")
    return Fault(parts[0], int(parts[1]), parts[2].upper())


def armed(rank: int) -> Optional[Fault]:
    """The fault RINGCOMM_FAULT sets for world rank ``rank``, or None."""
    from .. import env
    fault = env.get("RINGCOMM_FAULT")
    return fault if fault is not None and fault.rank == rank else None


def fire(phase: str, rank: int, fault: Optional[Fault] = None) -> None:
    """Deliver the armed fault if it is for ``phase`` on this ``rank`` (once: it ends the process)."""
    fault = fault if fault is not None else armed(rank)
    if fault is None or fault.phase != phase or fault.rank != rank:
        return
    print(f"ringcomm fault: rank {rank} pid {os.getpid()} SIG{fault.signal} at {phase} time {time.time():.3f}",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), SIGNALS[fault.signal])
