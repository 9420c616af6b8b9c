"""One runner for the per-collective grids: every case of a (collective, algorithm, size) in one
in-process job, each rank's outputs compared with the collective's reference semantics."""
from __future__ import annotations

from ringcomm.testing import run_threads


def run(size: int, case_list: list, inputs_of, call, timeout: float = 120) -> list:
    """``inputs_of(case, rank)`` -> that rank's input values; ``call(comm, case, values)`` -> what
    the rank returns for the case (its output, or a tuple of outputs). Returns, per case, the
    list of every rank's result, and the inputs."""
    inputs = [[inputs_of(c, r) for c in case_list] for r in range(size)]

    def rank_fn(comm):
        return [call(comm, c, v) for c, v in zip(case_list, inputs[comm.rank])]
    results = run_threads(size, rank_fn, timeout=timeout)
    return [([results[r][i] for r in range(size)], [inputs[r][i] for r in range(size)])
            for i in range(len(case_list))]
