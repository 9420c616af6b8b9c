"""The exact reference of a reduction, shared by the soaks (soak.py, soak_torch.py): the ranks'
inputs as float64 rows of small integers, reduced as the library defines each op."""
import numpy as np

BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
PLAIN = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}


def reduce_rows(stack: np.ndarray, op: str, boolean: bool, factor=None) -> np.ndarray:
    """``stack`` (a row per rank) reduced with ``op``; ``boolean``: bool's sums are logical or and
    its products logical and; ``factor``: premul_sum's."""
    if op in BITWISE:
        return BITWISE[op].reduce(stack.astype(np.int64), axis=0).astype(np.float64)
    if boolean:
        return stack.max(0) if op in ("sum", "max") else stack.min(0)
    if op == "avg":
        return stack.sum(0) / len(stack)
    if op == "premul_sum":
        return (factor * stack).sum(0)
    return PLAIN[op](stack, axis=0)
