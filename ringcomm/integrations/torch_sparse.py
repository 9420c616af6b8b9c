"""The sum of every rank's sparse COO tensor, as torch's gloo offers it for all_reduce.

There is no sparse reduction on the wire: every rank gathers every rank's coalesced indices and
values (uneven all-gathers of raw bytes), concatenates them in rank order and coalesces, so every
rank sums the same entries in the same order and ends with the same bits. Used by the torch
backend's sparse all_reduce and by ddp/ for the gradients of sparse embeddings.
"""
from __future__ import annotations

import math
import zlib

import torch

from ..errors import MismatchError
from .torch_tensors import as_bytes, raw, uneven


def sparse_sum(comm, t: torch.Tensor, what: str = "sparse all_reduce") -> torch.Tensor:
    """The coalesced sum over ``comm``'s ranks of each rank's sparse COO tensor ``t`` (on the
    CPU); a collective of ``comm``. Ranks whose tensors differ in shape, sparse dimensions or
    dtype raise MismatchError, every one of them, naming ``what``."""
    local = t.detach().to("cpu").coalesce()
    indices, values = local.indices().contiguous(), local.values().contiguous()
    rank, n = comm.rank, comm.size
    # What every rank's tensor must share, as one number: ranks whose shapes differed would
    # otherwise sum each other's entries at indices that mean something else, or past the end.
    kind = zlib.crc32(repr((tuple(t.shape), t.sparse_dim(), str(t.dtype))).encode())
    table = torch.zeros(n, 2, dtype=torch.int64)   # per rank: its entries, its kind
    table[rank] = torch.tensor([indices.shape[1], kind])
    comm.all_gather(raw(table), raw(table[rank].clone()))
    nnz, kinds = table[:, 0].tolist(), table[:, 1].tolist()
    odd = [r for r in range(n) if kinds[r] != kind]
    if odd:
        raise MismatchError(f"{what} on rank {rank}: rank {odd[0]}'s tensor differs from this rank's (shape "
                            f"{tuple(t.shape)}, {t.sparse_dim()} sparse dims, {t.dtype}) in shape, sparse "
                            f"dims or dtype")
    parts = []
    # Entry by entry: indices as (nnz, sparse_dim) rows, values as (nnz, *dense) rows.
    for rows in (indices.t().contiguous(), values):
        per_entry = math.prod(rows.shape[1:]) * rows.element_size()
        sizes = [k * per_entry for k in nnz]
        out = torch.empty(sum(sizes), dtype=torch.uint8)
        comm.all_gather(raw(out), raw(as_bytes(rows)), counts=uneven(sizes))
        parts.append(out)
    all_indices = parts[0].view(torch.int64).view(-1, indices.shape[0]).t()
    all_values = parts[1].view(values.dtype).view(-1, *values.shape[1:])
    # Every rank's indices came from a coalesced tensor of this very shape (the kinds agree).
    return torch.sparse_coo_tensor(all_indices, all_values, t.shape, check_invariants=False).coalesce()
