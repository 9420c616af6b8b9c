"""What every reference backend shares: MPI for identity and rendezvous, no algorithm names."""
from __future__ import annotations

from typing import Optional

from ..communicator import Communicator
from ..errors import bad_type, bad_value
from ..transport.mpi import MPITransport


class ReferenceCommunicator(Communicator):
    """A Communicator whose collectives run inside a library (MPI, gloo, NCCL).

    An MPI transport over the job's communicator supplies rank, size and the abort flag; the
    communicator itself (``world``) carries the rendezvous. Collective data never touches either.
    """

    backend = "reference"
    library = "the library"   # named in error messages

    def __init__(self, world, topology, *, timeout: Optional[float]):
        super().__init__(MPITransport(world), timeout=timeout, local_rank=topology.local_rank,
                         local_size=topology.local_size, node_count=topology.node_count,
                         topology=topology)
        self.world = world

    def _check_algorithm(self, name: str, algorithm, buf=None) -> Optional[str]:
        if algorithm is None:
            return None
        if not isinstance(algorithm, str):
            raise bad_type(name, "algorithm", "a str or None", type(algorithm).__name__)
        raise bad_value(name, "algorithm",
                        f"None: backend {self.backend!r} runs {self.library}'s own algorithms "
                        f"(algorithm names apply to backend 'ringcomm')", algorithm)

    def _describe(self, name: str, seq: int, work, buf) -> str:
        dtype = buf.dtype.name if buf is not None else "bytes"
        count = work.numel() if hasattr(work, "numel") else work.size   # torch tensor or numpy
        return f"{name} #{seq} ({self.backend}, {count} x {dtype})"
