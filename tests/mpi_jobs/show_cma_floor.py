"""Print the size from which this rank's shared-memory transport reads peers directly (CMA), and
whether its reads between buffers a few bytes apart take the detour (cma.PeerMemory.bounce)."""
import ringcomm

comm = ringcomm.init()
for attr in ("cma_min_bytes", "cma_p2p_min_bytes"):
    floors = {getattr(t, attr) for t in comm.transport.routes.values() if hasattr(t, attr)}
    print(f"rank {comm.rank} {attr}={','.join(map(str, sorted(floors)))}", flush=True)
bounce = {t._memory.bounce for t in comm.transport.routes.values() if hasattr(t, "_memory")}
print(f"rank {comm.rank} bounce={','.join(map(str, sorted(bounce)))}", flush=True)
comm.close()
