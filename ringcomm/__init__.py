"""ringcomm: hand-written collective communication for data-parallel training."""
from .core import hugepages as _hugepages

_hugepages.prefer_for_torch()   # before torch's first allocation, which reads it (core/hugepages.py)

from . import algorithms, collectives
from .communicator import Communicator
from .core.ops import ReduceOp, premul_sum
from .errors import (ArgumentTypeError, CommError, CommTimeoutError, CommunicatorLimitError, MismatchError, NonFiniteError, PeerAbortedError,
                     RingcommError, UsageError)
from .init import init, init_from_store
from .memory import empty
from .integrations.autoregister import install as _install_torch_backend
from .work import Work

_install_torch_backend()   # torch.distributed's backend "ringcomm", once torch is imported

__all__ = [
    "init", "init_from_store", "init_process_group", "empty", "Communicator", "ReduceOp", "premul_sum", "Work", "algorithms", "collectives",
    "RingcommError", "UsageError", "ArgumentTypeError", "CommError", "CommTimeoutError",
    "MismatchError", "NonFiniteError", "PeerAbortedError", "CommunicatorLimitError",
]
__version__ = "0.2.0"


def __getattr__(name):
    # torch.distributed is imported only by those who ask for it: numpy-only jobs skip its seconds.
    if name == "init_process_group":
        from .integrations.torch_groups import init_process_group
        return init_process_group
    raise AttributeError(f"module 'ringcomm' has no attribute {name!r}")
