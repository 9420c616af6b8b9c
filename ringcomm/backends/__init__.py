"""Reference backends: the Communicator API over a library's own collectives.

Each backend is a Communicator subclass that replaces only ``_collective`` (where the bytes
move) and ``_check_algorithm`` (the library picks its own algorithms). Validation, avg, async
Work and sequence numbers stay shared with the "ringcomm" backend, so semantics cannot drift
between backends and a training script can be compared across them by name alone.

Backends import their library lazily: ``import ringcomm`` never needs torch.distributed or CUDA.
"""
from __future__ import annotations

import importlib

# name -> (module, class); "ringcomm" itself is built in ringcomm.init from the transports.
REFERENCE = {
    "mpi": ("ringcomm.backends.mpi_native", "MPINativeCommunicator"),
    "gloo": ("ringcomm.backends.gloo", "GlooCommunicator"),
    "nccl": ("ringcomm.backends.nccl", "NCCLCommunicator"),
}
NAMES = ("ringcomm", *REFERENCE)


def communicator_class(name: str):
    module, cls = REFERENCE[name]
    return getattr(importlib.import_module(module), cls)
