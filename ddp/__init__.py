"""Data-parallel training over ringcomm: gradient buckets all-reduced while backward runs."""
from ringcomm.integrations.autoregister import never_traced

from . import comm_hooks
from .comm_hooks import (
                         CommFuture,
                         CommState,
                         allreduce_hook,
                         bf16_compress_hook,
                         bf16_compress_wrapper,
                         fp16_compress_hook,
                         fp16_compress_wrapper,
)
from .distributed import DistributedDataParallel, broadcast_tensors
from .reducer import GradBucket, assign_buckets

never_traced(f"{__name__}.untraced")   # the wrapper's bookkeeping around a compiled forward

__all__ = [
    "DistributedDataParallel", "GradBucket", "CommState", "CommFuture", "comm_hooks",
    "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
    "bf16_compress_wrapper", "broadcast_tensors", "assign_buckets",
]
