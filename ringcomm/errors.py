"""One small hierarchy: misuse (raised before any byte moves) versus communication failure.

Misuse errors subclass ValueError/TypeError so that callers who already catch those keep working;
communication errors all derive from CommError so that a training loop can catch one type.
"""
from __future__ import annotations

from typing import Optional


class RingcommError(Exception):
    """Base of every error ringcomm raises on purpose."""


class UsageError(RingcommError, ValueError):
    """An argument has the right type but a bad value (unknown op, root out of range, wrong size)."""


class ArgumentTypeError(RingcommError, TypeError):
    """An argument has the wrong type (numpy where torch was given, unsupported dtype, ...)."""


class CommError(RingcommError):
    """A collective could not complete: timeout, mismatch across ranks, lost peer."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait ran past its deadline; the message names the operation, sequence number and peer."""


class MismatchError(CommError):
    """Ranks entered the same collective with different arguments (count, dtype, op, root)."""


class NonFiniteError(CommError, ValueError):
    """RINGCOMM_CHECK_FINITE=1 found NaN or Inf in some rank's input (the message names the ranks)."""


class PeerAbortedError(CommError):
    """Another rank failed or aborted the job; this rank was released instead of hanging."""


# In a PeerAbortedError's reason: the peer's process ended (killed, or gone without closing), which
# a transport saw for itself (transport/shm). Nobody else was told, so the rank that saw it tells
# the others (Communicator._fail), as a rank that gives up does.
PEER_ENDED = "is no longer running"


def rank_name(rank: int, job_rank: Optional[int] = None, pid: Optional[int] = None) -> str:
    """A peer as an error names it: ``rank`` in the communicator that waited for it, beside it its
    rank in the job where that differs (``job_rank``: a sub-communicator's member) and its pid."""
    other = job_rank is not None and job_rank != rank
    more = ([f"rank {job_rank} of the job"] if other else []) + ([f"pid {pid}"] if pid is not None else [])
    return f"rank {rank}" + (" of this communicator" if other else "") + (f" ({', '.join(more)})" if more else "")


def peer_ended(rank: int, pid: int, job_rank: Optional[int] = None) -> str:
    return f"{rank_name(rank, job_rank, pid)} {PEER_ENDED}: it was killed, or ended without closing its communicator"


class CommunicatorLimitError(CommError):
    """MPI would make no more communicators (split, dup): every member got the same refusal, so
    the communicator that was split stays usable; close sub-communicators to free some."""


def bad_value(collective: str, argument: str, expected: str, got) -> UsageError:
    return UsageError(
        f'{collective} got unexpected value for argument "{argument}" (expected {expected}, got {got!r})'
    )


def bad_type(collective: str, argument: str, expected: str, got) -> ArgumentTypeError:
    return ArgumentTypeError(
        f'{collective} got unexpected type for argument "{argument}" (expected {expected}, got {got})'
    )
