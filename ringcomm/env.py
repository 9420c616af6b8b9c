"""Every RINGCOMM_* environment variable, parsed in one place.

Each variable has one entry in ``VARIABLES``: what it accepts, its default and what it does
(docs/reliability.md prints the same table). ``get(name)`` reads the current value and returns
it parsed; a value that does not parse raises ``UsageError`` naming the variable, the value and
what is accepted, never a bare ``ValueError`` from deep inside. An empty value means "unset".
``check_all()`` (called by ``ringcomm.init``) parses every RINGCOMM_* variable that is set and
refuses names it does not know, so a typo (RINGCOMM_TIMOUT=5) fails at start instead of being
ignored for a whole training run.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import UsageError

PREFIX = "RINGCOMM_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_size(text: str) -> int:
    """"4096", "64K", "1M", "32MiB" -> bytes (binary units); ValueError if it is not one."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = -1
    if not 0 <= value < float("inf") or value != int(value):   # inf: int(inf) raises OverflowError
        raise UsageError(f"size {text!r}: expected bytes like 4096, 64K, 1M or 32MiB")
    return int(value)


def _bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.lower()
        if low not in options:
            raise ValueError(text)
        return low
    return parse


def _algo(text: str) -> dict:
    from .selection.selector import parse_forced  # the registry validates the names
    return parse_forced(text)


def _text(text: str) -> str:
    return text


def _fault(text: str):
    from .diagnostics.faults import parse
    return parse(text)


@dataclass(frozen=True)
class Variable:
    name: str
    accepted: str                  # what the error message and the docs say is accepted
    default: str                   # as the docs show it
    meaning: str
    parse: Callable[[str], object]
    fallback: object = None        # what get() returns when the variable is unset or empty


VARIABLES = {v.name: v for v in (
    Variable("RINGCOMM_BACKEND", "one of ringcomm, mpi, gloo, nccl", "ringcomm",
             "backend of ringcomm.init() when the call names none",
             _choice("ringcomm", "mpi", "gloo", "nccl")),
    Variable("RINGCOMM_TIMEOUT", "a finite number of seconds > 0", "300",
             "deadline of every wait (collectives, segment setup, rendezvous) unless init(timeout=) says",
             _seconds),
    Variable("RINGCOMM_MPI_INIT_TIMEOUT", "a finite number of seconds > 0", "the init timeout, at least 30",
             "how long MPI_Init, where ringcomm.init starts MPI, may wait for every process of the job before "
             "this process ends itself; it also waits out the processes' start-up", _seconds),
    Variable("RINGCOMM_TRANSPORT", "one of auto, mpi, shm", "auto",
             "auto: shared memory inside a node, MPI between nodes; mpi: MPI everywhere; "
             "shm: like auto but refuse to start unless every peer shares this node",
             _choice("auto", "mpi", "shm"), "auto"),
    Variable("RINGCOMM_ALGO", "an algorithm name, or collective=algorithm[,collective=algorithm]", "(none)",
             "force the algorithm of some or all collectives", _algo, {}),
    Variable("RINGCOMM_DEBUG", "one of off, info, debug, detail", "off",
             "info/debug: log the algorithm of every call and why; detail: also compare every "
             "collective's fingerprint across ranks before it runs",
             _choice("off", "info", "debug", "detail"), "off"),
    Variable("RINGCOMM_CHECK_FINITE", "a boolean: 1/0, true/false, yes/no, on/off", "0",
             "raise NonFiniteError naming the ranks whose input holds NaN or Inf", _bool, False),
    Variable("RINGCOMM_FLIGHT_RECORDER", "an integer >= 1", "16",
             "calls (collectives, sends, receives) each rank remembers and prints when one times out",
             _positive_int, 16),
    Variable("RINGCOMM_NODE_ID", "any text", "(hostname)",
             "pretend node name: ranks with different ids talk as if on different machines", _text),
    Variable("RINGCOMM_SHM_CMA", "a boolean: 1/0, true/false, yes/no, on/off", "1",
             "peers on a node read each other's private arrays with process_vm_readv (CMA)", _bool, True),
    Variable("RINGCOMM_SHM_CMA_MIN", "bytes >= 0, like 65536, 64K, 32M", "(measured, else 32M)",
             "collectives at least this large read by CMA, smaller ones copy through shared memory",
             parse_size),
    Variable("RINGCOMM_SHM_CMA_P2P_MIN", "bytes >= 0, like 65536, 64K, 1M", "(measured, else 256K or 4M by the host)",
             "sends (comm.send) at least this large read by CMA, smaller ones copy through shared memory",
             parse_size),
    Variable("RINGCOMM_SHM_POOL", "bytes >= 0, like 1M, 4M", "4M (less when /dev/shm is small)",
             "staging pool share per peer on the node: sends from private memory that peers cannot "
             "read in place are copied there; larger messages go over MPI", parse_size),
    Variable("RINGCOMM_SHM_UNSAFE_ORDERING", "a boolean: 1/0, true/false, yes/no, on/off", "0",
             "run the shm transport on a CPU without x86 store ordering (unsupported)", _bool, False),
    Variable("RINGCOMM_COMPILED", "a boolean: 1/0, true/false, yes/no, on/off", "1",
             "run small window collectives (all-reduce, broadcast, all-gather, all-to-all, "
             "reduce-scatter, gather, scatter) through the compiled rounds where they were built (0: the Python "
             "rounds, same results), large sends through pipes where CMA is off (0: the pool or MPI), and copies "
             "between buffers a few bytes apart modulo a page in pieces (0: numpy's copy, slower there)",
             _bool, True),
    Variable("RINGCOMM_TUNING_FILE", "a path", "~/.cache/ringcomm/tuning.json",
             "the tuning file ringcomm.tune writes and the selector reads", _text),
    Variable("RINGCOMM_TIMELINE", "a path", "(none)",
             "write a Chrome trace per rank of DDP's compute and communication", _text),
    Variable("RINGCOMM_FAULT", "phase:rank:signal, e.g. ring:1:KILL (diagnostics/faults.py)", "(none)",
             "testing only: send the signal (KILL, TERM, STOP) to that rank when it reaches the phase",
             _fault),
)}


def raw(name: str) -> Optional[str]:
    """The variable's text, stripped; None when unset or empty."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    return text.strip()


def get(name: str):
    """The parsed value of ``name`` (its fallback when unset); UsageError when it does not parse."""
    var = VARIABLES[name]
    text = raw(name)
    if text is None:
        return var.fallback
    try:
        return var.parse(text)
    except UsageError as err:
        raise UsageError(f"{name}={text!r}: {err}") from None
    except (ValueError, TypeError):
        raise UsageError(f"{name}={text!r}: expected {var.accepted}") from None


def check_all() -> None:
    """Parse every RINGCOMM_* variable that is set; refuse unknown names."""
    for name in sorted(os.environ):
        if not name.startswith(PREFIX):
            continue
        if name not in VARIABLES:
            close = [v for v in VARIABLES if _similar(v, name)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"{name} is not a ringcomm variable{hint}; known: {', '.join(VARIABLES)}")
        get(name)


def _similar(a: str, b: str) -> bool:
    """Within two edits (typos like RINGCOMM_TIMOUT)."""
    if abs(len(a) - len(b)) > 2:
        return False
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] <= 2


def table() -> str:
    """The markdown table of every variable (docs/reliability.md embeds it)."""
    rows = ["| variable | accepted | default | effect |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.accepted} | {v.default} | {v.meaning} |" for v in VARIABLES.values()]
    return "\n".join(rows)
