"""Tensors as the Communicator takes them, for the "ringcomm" process group.

Reductions get typed memory (numpy views, bfloat16 tensors as themselves); data movement
(broadcast, gathers, scatters, all-to-all, send/recv) gets raw bytes, so any dtype travels,
complex and bool included. Tensors the communicator cannot take in place (non-contiguous, or
on a device the communicator does not serve) go through a contiguous host copy, written back
only after the collective succeeded. The coalesced forms pack many tensors into ONE buffer for
ONE call and unpack after it (``pack``/``unpack``). CUDA tensors stay on the device where the
communicator lists "cuda" in ``comm.devices`` (ringcomm over CUDA IPC, nccl, gloo); a call's
input then goes to its output's device (``alike``).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ..errors import bad_value

# numpy views made here, not with Tensor.numpy(): that marks the storage non-resizable for good,
# and torch's batched PowerSGD hook resizes DDP's bucket in place.
NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64, torch.int8: np.int8,
         torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
         torch.bool: np.bool_}


class _Memory:
    """A contiguous CPU tensor's memory for numpy, by address; the array's ``base``, so the
    tensor lives as long as any view of it (a temporary ``.contiguous()`` copy included)."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, t: torch.Tensor, dtype):
        dtype = np.dtype(dtype)
        self.tensor = t
        self.__array_interface__ = {"data": (t.data_ptr(), False), "typestr": dtype.str, "version": 3,
                                    "shape": (t.numel() * t.element_size() // dtype.itemsize,)}


def memory(t: torch.Tensor, dtype) -> np.ndarray:
    """A flat, writable numpy array of ``dtype`` over a contiguous CPU tensor's memory."""
    if t.numel() == 0:
        return np.empty(0, dtype)
    return np.asarray(_Memory(t, dtype))


def host_view(t: torch.Tensor):
    """What a reducing collective gets: a numpy view of a CPU tensor, or the tensor itself
    (device tensors; bfloat16, which numpy lacks and the communicator must know as such; a dtype
    the communicator refuses, so that its error names the dtype)."""
    if t.device.type != "cpu" or t.dtype not in NUMPY:
        return t
    return memory(t, NUMPY[t.dtype])


def raw(t):
    """A flat uint8 view of a contiguous tensor's memory (any dtype): for data movement. numpy for
    a CPU tensor; a torch view for a device one (the communicator takes it as device memory)."""
    if isinstance(t, np.ndarray):
        return t.reshape(-1).view(np.uint8)
    if t.device.type != "cpu":
        return flat(t.detach()).view(torch.uint8)
    return memory(t, np.uint8)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous ``t`` as a 1-D view of stride 1. torch calls a tensor of at most one element
    contiguous whatever its stride (``x[::2][:1]``; the indices torch's coalesce() leaves when
    duplicates merge into one entry), and ``view(torch.uint8)`` of such a view raises."""
    line = t.reshape(-1)
    return line if line.numel() > 1 or line.stride(0) == 1 else line.as_strided((line.numel(),), (1,))


def real_pairs(t: torch.Tensor, op) -> torch.Tensor:
    """A complex tensor as its (real, imaginary) pairs for a sum or an average, which act on each
    part alone, as gloo sums complex tensors (torch's all_reduce does the same before it calls a
    backend; its reduce and reduce_scatter do not); any other tensor or op as it is, for the
    communicator to refuse by dtype."""
    return torch.view_as_real(t) if t.is_complex() and op in ("sum", "avg") else t


def apart(x: torch.Tensor, out: torch.Tensor, in_place_at: Optional[int] = None) -> torch.Tensor:
    """``x``, or a copy of it where its memory overlaps ``out``'s. gloo takes every input before it
    writes an output, so torch users may pass ``all_gather_into_tensor(out, out[:n])`` or
    ``all_to_all_single(x, x)``; the communicator refuses overlaps (on the ranks where they
    occur, leaving the others to time out). ``in_place_at``: the byte offset in ``out`` where
    ``x`` may lie exactly, the communicator's own in-place form (an all-gather's own block)."""
    nx, no = x.numel() * x.element_size(), out.numel() * out.element_size()
    if not nx or not no or x.device != out.device:
        return x
    a, b = x.data_ptr(), out.data_ptr()
    if a >= b + no or b >= a + nx or (in_place_at is not None and a == b + in_place_at):
        return x
    return x.clone()


def alike(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` contiguous on the device of ``like`` (the input of a call whose output is ``like``:
    a call's buffers must share one device); ``x`` itself when it already is."""
    return resolved(x.detach().to(like.device)).contiguous()


def resolved(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its lazy conjugation or negation applied (a copy), or ``t`` itself where it has
    none. A negative view (``x.conj().imag``, ``torch._neg_view``) holds the negated values in
    memory; the communicator reads memory, so a max over such views would pick the minimum."""
    return t.resolve_conj().resolve_neg()


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t``, a dense tensor with data; a sparse one is refused here, naming its layout, and a
    meta tensor (a shape with no memory) naming its device, rather than by a torch error from
    deep inside the copy to host memory (only all_reduce takes sparse COO: its sum, as gloo's)."""
    if t.layout is not torch.strided:
        raise bad_value("ringcomm process group", "tensor", "a dense tensor (sparse: COO, to all_reduce's sum only)",
                        f"a {t.layout} tensor")
    if t.is_meta:
        raise bad_value("ringcomm process group", "tensor", "a tensor with data (on cpu, or a device torch copies "
                        "to the host)", "a tensor on meta")
    return t


def accepts(comm, t: torch.Tensor) -> bool:
    on_device = t.device.type == "cpu" or t.device.type in getattr(comm, "devices", ("cpu",))
    return on_device and t.is_contiguous() and not (t.is_neg() or t.is_conj())


def staged(comm, t: torch.Tensor) -> tuple:
    """(a tensor the communicator works on: ``t`` itself or a contiguous host copy, the write-back
    of that copy or None)."""
    if accepts(comm, dense(t)):
        return t, None
    host = resolved(t.detach().to("cpu", copy=True)).contiguous()
    return host, lambda: t.copy_(host.view(t.shape))


def host_input(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor holding ``t``'s values (``t`` itself when it already is one)."""
    return resolved(dense(t).detach().to("cpu")).contiguous()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 host tensor of ``t``'s bytes (``t``'s own memory when it is a contiguous CPU
    tensor, else a copy)."""
    return flat(host_input(t)).view(torch.uint8)


def pack(tensors: list) -> tuple:
    """(one flat uint8 tensor holding every tensor's bytes side by side, the offsets where each
    starts, plus the end): the buffer one fused collective moves."""
    parts = [as_bytes(t) for t in tensors]
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + p.numel())
    return (torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)), offsets


def sizes_of(tensors: list) -> list:
    """Each tensor's size in bytes."""
    return [t.numel() * t.element_size() for t in tensors]


def unpack(tensors: list, buffer: torch.Tensor, offsets: list) -> None:
    """Copy each tensor's bytes back out of ``buffer`` (what ``pack`` laid out) into its memory."""
    for t, start, end in zip(tensors, offsets, offsets[1:]):
        if t.numel():
            t.copy_(buffer[start:end].view(t.dtype).view(t.shape))


def offsets_of(sizes: list) -> list:
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def run_all(callbacks: list) -> Optional[Callable]:
    """One callable that runs every one of ``callbacks`` (None entries skipped)."""
    todo = [c for c in callbacks if c is not None]
    if not todo:
        return None

    def run():
        for c in todo:
            c()
    return run


def uneven(counts: list) -> Optional[list]:
    """``counts`` for an all_gather or reduce_scatter when they differ by rank, else None (even
    calls may use every algorithm)."""
    return None if len(set(counts)) <= 1 else counts
