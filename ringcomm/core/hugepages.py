"""Large torch tensors on transparent huge pages, as large numpy arrays already are.

A CMA copy (``process_vm_readv``/``process_vm_writev``: every direct collective from 4 MiB, a
send from 4 MiB) pins each page of the peer's array it touches, and pinning costs per page: a
64 MiB read from a peer's 4 KiB pages took 11.5-14.1 ms here, from its 2 MiB pages 4.5-6.5 ms,
about a memcpy (benchmarks/cma_copy.py; docs/transports.md "Huge pages"). numpy asks the kernel
for huge pages (``madvise``) for every array of 4 MiB or more; torch's CPU allocator does only
under ``THP_MEM_ALLOC_ENABLE=1``, so a 64 MiB all-reduce of tensors torch allocated took 9.2-11.4
ms against 5.5-6.1 ms for numpy arrays, and 6.2-7.3 ms with the variable set.

torch reads the variable once, at its first allocation, so ``import ringcomm`` sets it unless
the user did (``THP_MEM_ALLOC_ENABLE=0`` keeps torch's default). Tensors allocated before
ringcomm was imported keep their pages. ``report()`` says what this process asks for
(``python -m ringcomm.explain``).
"""
from __future__ import annotations

import os
import sys

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def prefer_for_torch() -> None:
    """Ask torch's CPU allocator for huge pages for its large tensors (the module docstring),
    unless the user chose; nothing where the kernel has no transparent huge pages."""
    if sys.platform.startswith("linux") and VARIABLE not in os.environ and kernel_mode() not in (None, "never"):
        os.environ[VARIABLE] = "1"


def kernel_mode() -> str | None:
    """The kernel's THP policy (always, madvise, never), or None where it says none."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def report() -> str:
    """One line: the kernel's policy and whether torch's large tensors ask for huge pages."""
    mode = kernel_mode()
    if mode is None:
        return "transparent huge pages: none on this kernel (CMA copies pin 4 KiB pages)"
    value = os.environ.get(VARIABLE)
    torch_side = (f"torch tensors >= 2 MiB ask for them ({VARIABLE}={value})" if value == "1" else
                  f"torch tensors do not ask for them ({VARIABLE}={value if value is not None else 'unset'}; "
                  f"CMA copies of them pin 4 KiB pages, 3-5x slower)")
    numpy_side = "ask for them" if numpy_asks() else "do not ask for them (NUMPY_MADVISE_HUGEPAGE=0)"
    return f"transparent huge pages: kernel {mode}; numpy arrays >= 4 MiB {numpy_side}; {torch_side}"


def numpy_asks() -> bool:
    """Whether numpy madvises its large arrays (its default on Linux; NUMPY_MADVISE_HUGEPAGE=0 stops it)."""
    import numpy as np
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None) or getattr(np.core, "multiarray", None)
    ask = getattr(multiarray, "_get_madvise_hugepage", None)
    return bool(ask()) if ask is not None else sys.platform.startswith("linux")
