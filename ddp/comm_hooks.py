"""Communication hooks: how one gradient bucket is reduced across ranks.

A hook has PyTorch's shape, ``hook(state, bucket) -> future``: ``bucket`` is a ``GradBucket``
(``buffer()`` is the flat gradient tensor), and the future's ``wait()`` returns the tensor that
holds the averaged gradients (usually ``bucket.buffer()`` itself). Any object with ``wait()``
works, including ``torch.futures.Future``; the hooks here return ``CommFuture``, which also lets
the reducer time the communication apart from the continuation.

``state`` is a ``CommState`` (or a bare Communicator): it names the communicator to use. Hooks
never keep per-iteration state of their own, so one state may be shared by several models.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ringcomm.errors import bad_type


class CommState:
    """What the built-in hooks need: the communicator, and the deadline of one bucket's reduction."""

    __slots__ = ("comm", "timeout")

    def __init__(self, comm, timeout: Optional[float] = None):
        self.comm = comm
        self.timeout = getattr(comm, "timeout", None) if timeout is None else timeout


class CommFuture:
    """A future over one async ringcomm ``Work``, with lazy continuations.

    ``then(fn)`` does not start a thread: ``fn`` runs in whichever thread calls ``wait()`` first,
    which for DDP is the end-of-backward callback. ``wait_comm()`` waits for the communication
    only, so a watcher thread can time it without running continuations.
    """

    __slots__ = ("_work", "_parent", "_fn", "_timeout", "_value", "_done")

    def __init__(self, work=None, *, timeout: Optional[float] = None, parent: "CommFuture" = None,
                 fn: Callable = None):
        self._work, self._parent, self._fn = work, parent, fn
        self._timeout = timeout if parent is None else parent._timeout
        self._value, self._done = None, False

    @classmethod
    def completed(cls, value) -> "CommFuture":
        fut = cls()
        fut._value, fut._done = value, True
        return fut

    def then(self, fn: Callable) -> "CommFuture":
        return CommFuture(parent=self, fn=fn)

    def wait_comm(self, timeout: Optional[float] = None) -> None:
        root = self
        while root._parent is not None:
            root = root._parent
        if root._work is not None:
            root._work.wait(self._deadline(timeout))

    def wait(self, timeout: Optional[float] = None):
        if not self._done:
            if self._parent is not None:
                self._value = self._fn(self._parent.wait(timeout))
            else:
                self._value = self._work.wait(self._deadline(timeout))
            self._done = True
        return self._value

    def value(self):
        return self.wait()

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout


def _state(state, hook: str) -> CommState:
    if isinstance(state, CommState):
        return state
    if hasattr(state, "all_reduce") and hasattr(state, "size"):
        return CommState(state)
    raise bad_type(hook, "state", "a ddp.comm_hooks.CommState or a ringcomm Communicator",
                   type(state).__name__)


def comm_accepts(comm, device) -> bool:
    """Whether ``comm`` reduces tensors on ``device`` (a torch.device, or "cpu"/"cuda") in place;
    otherwise they go via host memory. Communicators list theirs in ``comm.devices``."""
    kind = getattr(device, "type", device)
    return kind == "cpu" or kind in getattr(comm, "devices", ("cpu",))


def device_type(tensor) -> str:
    """"cpu" or "cuda" for a torch tensor, and "cuda" for a cupy array (a bucket a custom
    reducer keeps in cupy memory)."""
    device = tensor.device
    return device.type if isinstance(device, torch.device) else "cuda"


def _all_reduce(state: CommState, tensor, op: str) -> CommFuture:
    """Async all-reduce of ``tensor`` where it lives; a device tensor the communicator cannot take
    is staged on the host."""
    comm = state.comm
    if isinstance(tensor, torch.Tensor) and tensor.is_complex():
        # As torch.distributed.all_reduce takes them: a complex sum or average is that of the real
        # and imaginary parts. Handed on as complex, the bucket of a complex parameter was refused
        # by all_reduce in the middle of backward.
        return _all_reduce(state, torch.view_as_real(tensor), op).then(lambda _: tensor)
    if comm_accepts(comm, device_type(tensor)):
        return CommFuture(comm.all_reduce(tensor, op=op, async_op=True), timeout=state.timeout)
    host = tensor.to("cpu")
    fut = CommFuture(comm.all_reduce(host, op=op, async_op=True), timeout=state.timeout)
    return fut.then(lambda reduced: tensor.copy_(reduced, non_blocking=False))


def allreduce_hook(state, bucket) -> CommFuture:
    """The default: average the bucket over all ranks in its own dtype, in place."""
    return _all_reduce(_state(state, "allreduce_hook"), bucket.buffer(), "avg")


def allreduce_sum_for_avg(state, bucket) -> tuple:
    """``allreduce_hook`` less its division: (the future of the sum, the n to divide it by). The
    reducer runs this in its place on float32/float64 host buckets and divides while it copies
    the gradients back, one pass over them instead of two (24 MiB of gradients, 2 ranks: the
    division alone took 0.6-3 ms). avg sums those dtypes unscaled and then divides each element
    by n (ringcomm.core.ops.finish_avg): the same IEEE division of the same bits, so the result
    is bitwise what ``allreduce_hook`` gives."""
    st = _state(state, "allreduce_hook")
    return _all_reduce(st, bucket.buffer(), "sum"), st.comm.size


def _compress_hook(state, bucket, dtype: torch.dtype, name: str) -> CommFuture:
    st = _state(state, name)
    buffer = bucket.buffer()
    if buffer.dtype == dtype:
        return allreduce_hook(st, bucket)
    real, compressed = _compressed(buffer, dtype, st.comm.size)

    def decompress(reduced):
        real.copy_(reduced)
        return buffer
    return _all_reduce(st, compressed, "sum").then(decompress)


def _compressed(buffer: torch.Tensor, dtype: torch.dtype, size: int) -> tuple:
    """(``buffer`` as a real view, that view cast to ``dtype`` and divided by ``size``): what a
    compressing hook sends and where it writes the result back. Divided before the sum, as
    PyTorch does: the half-precision sum of n gradients can overflow. A complex buffer goes as its
    real and imaginary parts: cast as complex, the imaginary parts were dropped (torch warns, and
    so do its own hooks)."""
    real = torch.view_as_real(buffer) if buffer.is_complex() else buffer
    return real, real.to(dtype).div_(size)


def fp16_compress_hook(state, bucket) -> CommFuture:
    """Send the bucket as float16 (half the bytes of float32), then write it back in its own dtype."""
    return _compress_hook(state, bucket, torch.float16, "fp16_compress_hook")


def bf16_compress_hook(state, bucket) -> CommFuture:
    """As fp16_compress_hook with bfloat16: float32's range, so no overflow, but 8 bits of mantissa."""
    return _compress_hook(state, bucket, torch.bfloat16, "bf16_compress_hook")


class _CompressedBucket:
    """A GradBucket whose buffer is a compressed copy: what a wrapped hook sees."""

    __slots__ = ("_bucket", "_buffer")

    def __init__(self, bucket, buffer: torch.Tensor):
        self._bucket, self._buffer = bucket, buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def __getattr__(self, name):
        return getattr(self._bucket, name)


def _compress_wrapper(hook: Callable, dtype: torch.dtype) -> Callable:
    def wrapped(state, bucket):
        st = _state(state, f"{dtype}_compress_wrapper")
        buffer = bucket.buffer()
        size = st.comm.size
        real, compressed = _compressed(buffer, dtype, size)
        # The inner hook averages; undo the pre-division that guards against overflow.

        def decompress(reduced):
            reduced = reduced[0] if isinstance(reduced, (list, tuple)) else reduced
            real.copy_(reduced.to(real.dtype).mul_(size))
            return buffer
        fut = hook(st, _CompressedBucket(bucket, compressed))
        if isinstance(fut, CommFuture):
            return fut.then(decompress)
        return CommFuture.completed(None).then(lambda _: decompress(fut.wait()))
    wrapped.__name__ = f"{dtype_name(dtype)}_compress_wrapper({getattr(hook, '__name__', 'hook')})"
    return wrapped


def fp16_compress_wrapper(hook: Callable) -> Callable:
    """Run ``hook`` on a float16 copy of the bucket (e.g. around a custom averaging hook)."""
    return _compress_wrapper(hook, torch.float16)


def bf16_compress_wrapper(hook: Callable) -> Callable:
    return _compress_wrapper(hook, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
