"""A process a rank starts with multiprocessing's spawn (a DataLoader worker, a pool re-importing
a script whose top level calls init) inherits mpirun's variables but not its connection; its
ringcomm.init raises UsageError saying so. MPICH's MPI_Init used to end it (exit 15, "PMI_Init
returned -1") before Python could say why.

    mpirun -n 2 python spawned_child.py

Prints, per rank, "child: <what the child's init raised>" and "rank R done".
"""
import multiprocessing
import sys


def child(answers) -> None:
    try:
        import ringcomm
        comm = ringcomm.init(timeout=30)
        answers.put(f"joined as rank {comm.rank} of {comm.size}")
    except BaseException as err:
        answers.put(f"{type(err).__name__}: {err}")


if __name__ == "__main__":
    import ringcomm
    comm = ringcomm.init(timeout=60)
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    process = context.Process(target=child, args=(answers,))
    process.start()
    print(f"child: {answers.get(timeout=60)}", flush=True)
    process.join(30)
    comm.barrier()   # the parent's job is intact
    print(f"rank {comm.rank} done", flush=True)
    comm.close()
    sys.exit(0)
