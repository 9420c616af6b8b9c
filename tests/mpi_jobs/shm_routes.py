"""Two pretend nodes of two ranks: report the link names the selector reads off the routed transport."""
import os

os.environ["RINGCOMM_NODE_ID"] = f"node{int(os.environ.get('PMI_RANK', 0)) // 2}"

import ringcomm  # noqa: E402
from ringcomm.selection.selector import routes_of  # noqa: E402

comm = ringcomm.init()
print(f"rank {comm.rank} routes {routes_of(comm.transport, comm.topology.node_of)}", flush=True)
