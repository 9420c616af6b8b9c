"""Print the size from which this rank's shared-memory transport reads peers directly (CMA)."""
import ringcomm

comm = ringcomm.init()
floors = {t.cma_min_bytes for t in comm.transport.routes.values() if hasattr(t, "cma_min_bytes")}
print(f"rank {comm.rank} cma_min_bytes={','.join(map(str, sorted(floors)))}", flush=True)
comm.close()
