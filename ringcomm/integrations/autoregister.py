"""What ``import ringcomm`` registers with torch, as each piece of torch loads.

``import ringcomm`` must not import torch (numpy-only jobs would pay its seconds), yet two pieces
of torch must know ringcomm before anyone uses them. For each, if its module is already imported,
register now; otherwise an import hook registers right after that module has run:

- **torch.distributed** (``import torch`` imports it): the backend "ringcomm", so that
  ``import ringcomm`` then ``dist.init_process_group("ringcomm")`` works with no call of
  ringcomm's own. Registration imports nothing of ringcomm's torch code: ``Backend.register_backend``
  gets a creator that imports ``torch_groups`` on first call. At hook time torch itself may still
  be half-imported (torch/__init__.py imports torch.distributed midway), so nothing else may run
  then. Under mpirun nobody sets torch's env:// variables (MASTER_ADDR, RANK, ...), so the env://
  rendezvous handler is wrapped: in a process an MPI launcher started, with MASTER_ADDR unset,
  rank, size and the store come from MPI instead (torch_groups.mpi_rendezvous); otherwise torch's
  own handler runs unchanged.
- **torch._dynamo** (``torch.compile`` imports it, ``import torch`` does not): ringcomm's files
  join the files torch.compile never traces. Dynamo traced into the library's Python as if it
  were the user's model: ``comm.all_reduce`` inside a compiled function, and torch's DDP on
  backend "ringcomm" under torch.compile, stopped with Dynamo's errors (fake tensors in the
  executor's numpy calls, an opaque object in the backend's broadcast); where tracing got
  through it had traced the library's internals (Dynamo warned of core/buffers.py's caches),
  which nothing guarantees to survive being traced. Skipped, a call
  into ringcomm is a graph break: it runs as ordinary Python and the code around it is still
  compiled. It costs a call nothing, where ``torch.compiler.disable`` on each entry point would
  cost ~0.25 us, and ``import torch._dynamo`` 0.6 s at import in jobs that never compile. ddp,
  whose forward is traced so that the wrapped module is compiled, keeps its bookkeeping out the
  same way (``never_traced``, ddp/untraced.py).
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


COMPILER = "torch._dynamo.trace_rules"   # Dynamo's list of the files it skips (its ``add``)
_NEVER_TRACED = [__name__.split(".")[0]]   # ringcomm, and what never_traced adds


def never_traced(module: str) -> None:
    """Have torch.compile run ``module`` (the import name of a package or a module) as ordinary
    Python, never tracing it: at once if torch._dynamo is loaded, else when it loads."""
    _NEVER_TRACED.append(module)
    rules = sys.modules.get(COMPILER)
    if rules is not None:
        _skip([module])(rules)


def _skip(modules):
    def add(rules) -> None:
        if hasattr(rules, "add"):   # Dynamo's own, not a public API: a torch without it traces as before
            for module in modules:
                rules.add(module)
    return add


def _backend(dist) -> None:
    if hasattr(dist, "Backend"):   # a torch built without distributed has no Backend
        register(dist)


class _Loader(importlib.abc.Loader):
    """A module's own loader, then ``then(module)``."""

    def __init__(self, inner, then):
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.then(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, then):
        self.target, self.then = target, then

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)   # one module to wrap; never in the way of other imports
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.then)
        return spec


def when_imported(target: str, then) -> None:
    """``then(module)`` once module ``target`` has run: now if it is imported already."""
    module = sys.modules.get(target)
    if module is not None:
        then(module)
    elif not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, then))


def install() -> None:
    when_imported(TARGET, _backend)
    when_imported(COMPILER, _skip(_NEVER_TRACED))
