"""Register torch.distributed's backend "ringcomm" as soon as torch.distributed exists.

``import ringcomm`` then ``dist.init_process_group("ringcomm")`` must work with no call of
ringcomm's own, yet ``import ringcomm`` must not import torch (numpy-only jobs would pay its
seconds). So: if torch.distributed is already imported, register now; otherwise an import hook
registers right after torch.distributed's module has run (``import torch`` imports it).

Registration itself imports nothing of ringcomm's torch code: ``Backend.register_backend`` gets
a creator that imports ``torch_groups`` on first call. At hook time torch itself may still be
half-imported (torch/__init__.py imports torch.distributed midway), so nothing else may run then.

Under mpirun nobody sets torch's env:// variables (MASTER_ADDR, RANK, ...), so the env://
rendezvous handler is wrapped: in a process an MPI launcher started, with MASTER_ADDR unset, rank,
size and the store come from MPI instead (torch_groups.mpi_rendezvous); otherwise torch's own
handler runs unchanged.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

BACKEND = "ringcomm"
TARGET = "torch.distributed"


def _create(*args, **kwargs):
    from .torch_groups import create
    return create(*args, **kwargs)


def register(dist) -> None:
    """Register the backend with ``dist`` (torch.distributed), once."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    if not getattr(handlers.get("env"), "ringcomm", False):
        handlers["env"] = _env_or_mpi(handlers["env"])


def _env_or_mpi(torch_handler):
    def handler(url, timeout=None, **kwargs):
        from ..init import mpi_launched
        if os.environ.get("MASTER_ADDR") or not mpi_launched():
            return torch_handler(url, **({} if timeout is None else {"timeout": timeout}), **kwargs)
        from .torch_groups import mpi_rendezvous
        return mpi_rendezvous(url, timeout)
    handler.ringcomm = True
    return handler


class _Loader(importlib.abc.Loader):
    """torch.distributed's own loader, then the registration."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        if hasattr(module, "Backend"):   # a torch built without distributed has no Backend
            register(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)   # one module to wrap; never in the way of other imports
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    module = sys.modules.get(TARGET)
    if module is not None:
        if hasattr(module, "Backend"):
            register(module)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
