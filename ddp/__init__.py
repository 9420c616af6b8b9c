"""Data-parallel training over ringcomm: gradient buckets all-reduced while backward runs."""
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

__all__ = [
    "DistributedDataParallel", "GradBucket", "CommState", "CommFuture", "comm_hooks",
    "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
    "bf16_compress_wrapper", "broadcast_tensors", "assign_buckets",
]
