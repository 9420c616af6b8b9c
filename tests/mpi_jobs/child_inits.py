"""Processes a rank starts, calling ringcomm.init themselves; each is refused with UsageError
saying why, and the parents' job goes on with the right results.

- A spawn child (multiprocessing's spawn, a DataLoader worker or a pool re-importing a script
  whose top level calls init) inherits mpirun's variables but not its connection: MPICH's
  MPI_Init used to end it (exit 15, "PMI_Init returned -1") before Python could say why.
- A fork child (os.fork after init) inherits a copy of its parent's MPI state: its init joined
  the job as its parent, the two children's all_reduces summed each other's data (200 for 100
  each) and rank 0's parent then summed 13 where 3 was due.

    mpirun -n 2 python child_inits.py

Prints, per rank, "spawn child: <what its init raised>", "fork child: ...", "sum S" (the
parents' all_reduce after both) and "rank R done".
"""
import multiprocessing
import os
import sys
import time

import numpy as np


def child(answers) -> None:
    try:
        import ringcomm
        comm = ringcomm.init(timeout=30)
        x = np.full(4, 100, np.float32)
        comm.all_reduce(x)
        answers.put(f"joined as rank {comm.rank} of {comm.size}, summed {x[0]}")
    except BaseException as err:
        answers.put(f"{type(err).__name__}: {err}")


if __name__ == "__main__":
    import ringcomm
    comm = ringcomm.init(timeout=60)
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    process = context.Process(target=child, args=(answers,))
    process.start()
    print(f"spawn child: {answers.get(timeout=60)}", flush=True)
    process.join(30)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        answers = multiprocessing.SimpleQueue()
        child(answers)
        os.write(write, answers.get().encode())
        os._exit(0)
    os.close(write)
    time.sleep(1)   # the child's init, had it run, would now pair with the peers' calls
    x = np.full(4, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    os.waitpid(pid, 0)
    print(f"fork child: {os.read(read, 4096).decode()}", flush=True)
    print(f"sum {x[0]}", flush=True)
    comm.barrier()
    print(f"rank {comm.rank} done", flush=True)
    comm.close()
    sys.exit(0)
