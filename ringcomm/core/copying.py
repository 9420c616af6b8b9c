"""Copies between two buffers on the hot paths, safe from the slow distances of ``rep movsb``.

On the AMD EPYC we measure (glibc 2.36, Linux 6.18) a copy of 2 KiB to 512 KiB whose
destination lies 1 to 31 bytes past its source modulo 4 KiB runs 6-12x slower through memcpy,
and a process_vm_readv (CMA) of any size 2-5x slower: both end in ``rep movsb``, which these CPUs
run slowly at such distances. Such distances are the common case here, not bad luck: numpy's
large arrays start 16 bytes into a page (malloc's header), torch's at a page (or 64 bytes in),
the staging pool's messages at a page.
docs/transports.md ("Copies whose buffers are a few bytes apart") has the measurements.

Two remedies, one per kind of copy:
- a copy in this process: ``copy`` goes through core/_copy.h, which copies in 2 KiB pieces (under
  glibc's threshold for ``rep movsb``) where the distance is slow and is memcpy elsewhere (in
  256 KiB pieces from 1 MiB, so that glibc writes them with rep movsb: _copy.h says why), and
  from the size of the last-level cache on with streaming stores (``stream_from``);
- a CMA read or write, whose copy is the kernel's: the side this rank owns is a scratch buffer
  placed at the other side's page offset (``like``), or where it is the caller's own array at a
  slow distance, the bytes go through such a scratch buffer and ``copy`` (cma.py), on hosts
  whose kernel copies such distances slowly (``cma.distance_cost``: the Intel Xeon hosts this VM
  also lands on do not, and there the detour's second copy only cost time).

Without the compiled piece (no compiler at install, RINGCOMM_COMPILED=0) ``copy`` is numpy's
assignment: same bytes, the slow speed where the distance is slow.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .. import env
from ..topology import last_level_cache
from .compiled import array_address

try:
    from ._round import copy as copy_bytes   # copy_bytes(dst, src): two contiguous buffers of one length
    from ._round import set_stream_min, stream_min
except ImportError:   # not built: numpy's copy
    copy_bytes = set_stream_min = stream_min = None

PAGE = 4096
STREAM_GUESS = 32 << 20   # where the host does not say how large its last-level cache is
WINDOW = 64     # (dst - src) mod PAGE in [1, WINDOW): slow (1-31 measured; a cache line, with margin)
PIECE = 2048    # no memcpy this short takes rep movsb: core/_copy.h copies in such pieces


def slow_distance(dst: int, src: int) -> bool:
    """Whether a copy to address ``dst`` from address ``src`` runs at rep movsb's slow speed."""
    d = (dst - src) % PAGE
    return 0 < d < WINDOW


def copier() -> Callable[[np.ndarray, np.ndarray], None]:
    """The copy a transport built now uses: compiled where built and RINGCOMM_COMPILED allows."""
    return copy if copy_bytes is not None and env.get("RINGCOMM_COMPILED") else numpy_copy


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for arrays of one dtype and shape, through core/_copy.h when both are
    contiguous and longer than PIECE."""
    if dst.nbytes > PIECE and dst.flags.c_contiguous and src.flags.c_contiguous:
        copy_bytes(dst, src)
    else:
        dst[...] = src


def stream_from(nbytes: int) -> int:
    """Make compiled copies of ``nbytes`` and more go around the cache (core/_copy.h says why);
    returns the length in force (at least 1 MiB), 0 where the compiled copy is not built."""
    return set_stream_min(int(nbytes)) if set_stream_min is not None else 0


def streamed_from() -> int:
    """The length from which compiled copies go around the cache now; 0 where not built."""
    return stream_min() if stream_min is not None else 0


# A copy as long as the last-level cache cannot stay in it: from there on, stream.
STREAM_FROM = last_level_cache() or STREAM_GUESS
stream_from(STREAM_FROM)


def numpy_copy(dst: np.ndarray, src: np.ndarray) -> None:
    dst[...] = src


def like(scratch: np.ndarray, addr: int, nbytes: int) -> Optional[np.ndarray]:
    """``nbytes`` of ``scratch`` (uint8, at least nbytes + PAGE long) starting at ``addr``'s page
    offset, so that a CMA transfer between them and ``addr`` runs at full speed; None if
    ``scratch`` is too short."""
    base = array_address(scratch)
    off = (addr - base) % PAGE
    if off + nbytes > scratch.nbytes:
        return None
    return scratch[off:off + nbytes]
