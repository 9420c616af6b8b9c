"""ringcomm: hand-written collective communication for data-parallel training."""
from . import algorithms
from .communicator import Communicator
from .init import init
from .errors import (ArgumentTypeError, CommError, CommTimeoutError, MismatchError, PeerAbortedError,
                     RingcommError, UsageError)
from .ops import ReduceOp
from .work import Work

__all__ = [
    "init", "Communicator", "ReduceOp", "Work", "algorithms",
    "RingcommError", "UsageError", "ArgumentTypeError", "CommError", "CommTimeoutError",
    "MismatchError", "PeerAbortedError",
]
__version__ = "0.1.0"
