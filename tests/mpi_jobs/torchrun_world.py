"""Started by torchrun, not mpirun: ringcomm must refuse, on every rank, instead of giving each
process a world of its own.

    python -m torch.distributed.run --nproc_per_node=2 --master-port PORT torchrun_world.py
"""
import ringcomm

comm = ringcomm.init_process_group()
print(f"world size {comm.size} on rank {comm.rank}", flush=True)   # a silent world of one
