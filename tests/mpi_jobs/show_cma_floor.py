"""Print the size from which this rank's shared-memory transport reads peers directly (CMA)."""
import ringcomm

comm = ringcomm.init()
for attr in ("cma_min_bytes", "cma_p2p_min_bytes"):
    floors = {getattr(t, attr) for t in comm.transport.routes.values() if hasattr(t, attr)}
    print(f"rank {comm.rank} {attr}={','.join(map(str, sorted(floors)))}", flush=True)
comm.close()
