"""Two pretend nodes of two ranks: report the link names the selector sees."""
import os

os.environ["RINGCOMM_NODE_ID"] = f"node{int(os.environ.get('PMI_RANK', 0)) // 2}"

import ringcomm  # noqa: E402
from ringcomm.selector import routes_of  # noqa: E402

comm = ringcomm.init()
assert routes_of(comm.transport) == ("shm", "mpi"), routes_of(comm.transport)
print(f"rank {comm.rank} link_names {comm.transport.link_names}", flush=True)
