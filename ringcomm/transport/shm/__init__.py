"""Host shared-memory transport: ranks of one node read (and reduce) straight out of each
other's memory. One module per role:

- ``transport.py``  ShmTransport: setup, segments and ``allocate``, windows, abort and close
- ``messages.py``   its point-to-point half: isend/irecv/irecv_reduce/stage/probe, the progress loop
- ``rings.py``      descriptor rings: publish, discover, acknowledge; memory-ordering argument
- ``staging.py``    the fixed staging pool and its shares; when a send waits, when it overflows
- ``segments.py``   /dev/shm files: create (fallocate), map, unlink, sweep files of dead owners
- ``cma.py``        process_vm_readv/writev: reading and writing a peer's private memory, the probe
- ``pipe.py``       large sends through a ring of cells where CMA is off (_pipe.c, compiled)
- ``node.py``       the bounded node-wide handshakes of setup and ``allocate``

docs/transports.md describes the protocol, docs/reliability.md what it promises and how that is
tested.
"""
from .cma import read_process, write_process
from .segments import PREFIX, SHM_DIR, Segment
from .transport import WINDOW_SLOTS, ShmTransport

__all__ = ["ShmTransport", "Segment", "read_process", "write_process", "PREFIX", "SHM_DIR", "WINDOW_SLOTS"]
