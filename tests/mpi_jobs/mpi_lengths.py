"""The MPI transport refuses messages of the wrong length instead of half-filling a receive."""
import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.transport.mpi import MPITransport

t = MPITransport(MPI.COMM_WORLD.Dup())
peer = 1 - t.rank
outcomes = []
for sent, posted in ((8, 16), (16, 8), (8, 8)):
    if t.rank == 0:
        t.isend(np.zeros(sent, np.uint8), peer, 7).wait(10)
    else:
        try:
            outcomes.append(f"{sent}->{posted}: ok={t.irecv(np.zeros(posted, np.uint8), peer, 7).wait(10)}")
        except ringcomm.MismatchError as err:
            outcomes.append(f"{sent}->{posted}: MismatchError: {err}")
    t.comm.Barrier()
if t.rank == 1:
    print("\n".join(outcomes), flush=True)
