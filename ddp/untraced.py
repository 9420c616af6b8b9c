"""What torch.compile must not trace: DistributedDataParallel's bookkeeping either side of the
wrapped module's forward.

``torch.compile(DistributedDataParallel(net))`` traces the wrapper's ``forward`` so that ``net``
is compiled into a graph, but what surrounds that call cannot be a graph: it broadcasts buffers
through the communicator, walks the parameters for replacements and arms the reducer, Python
state all of it. Traced, a model with a BatchNorm stopped with Dynamo's errors. So this file
joins the files torch.compile never traces (ringcomm/integrations/autoregister.py registers it
when torch._dynamo loads, at no cost to a job that never compiles): each call into it from a
compiled forward is a graph break. A skipped frame's callees are still traced, each as a frame
of its own (``TORCH_LOGS=+dynamo`` showed the reducer's ``maybe_rebuild``, ``prepare_backward``
and ``_unused_now`` traced), so once Dynamo is loaded the bookkeeping runs under
``torch.compiler.disable``, which turns frame evaluation off for everything it calls (0.25 us a
forward; none where Dynamo was never imported). The timeline's clock is kept on the wrapper,
not passed through the traced frame, where each new float would compile it again.
"""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

from .timeline import COMPUTE


def before_forward(model) -> None:
    _eagerly(_before, model)


def after_forward(model, out):
    return _eagerly(_after, model, out)


_DISABLED: dict = {}   # function -> the same under torch.compiler.disable, made once Dynamo is loaded


def _eagerly(fn, *args):
    """``fn(*args)`` with torch.compile's frame evaluation off for all it calls, where Dynamo is
    loaded (nothing compiles without it, so there is nothing to turn off)."""
    if "torch._dynamo" not in sys.modules:
        return fn(*args)
    off = _DISABLED.get(fn)
    if off is None:
        off = _DISABLED[fn] = torch.compiler.disable(fn)
    return off(*args)


def _before(model) -> None:
    if model._changed:
        model._refuse_changed()
    if torch.is_grad_enabled():
        if model._places.moved():
            model._refuse_moved()
        if model._frozen:
            model._refuse_thawed()
    model.reducer.maybe_rebuild()
    # As torch's DDP: buffers are synchronised before a forward whose predecessor synchronised
    # gradients (or the first), not after a no_sync or no_grad forward, whose buffer updates
    # (BatchNorm's running stats) stay each rank's until the next synchronised step.
    if model.broadcast_buffers and model._sync_buffers:
        buffers = [b.data for b in model.module.buffers()]
        if buffers:
            from .distributed import broadcast_tensors   # distributed.py imports this file
            broadcast_tensors(model.comm, buffers)
    model._forward_t0 = time.perf_counter()


def _after(model, out):
    if model.timeline:
        model.timeline.span("forward", model._forward_t0, time.perf_counter(), COMPUTE)
    model._sync_buffers = torch.is_grad_enabled() and model.require_backward_grad_sync
    if model._sync_buffers:
        # Armed even where no output tensor is found (an object of the user's own): the first
        # parameter's gradient then starts the reduction. Armed only when a tensor was found,
        # a dataclass output's backward went unreduced and the replicas drifted apart.
        model.reducer.prepare_backward([t for t in _tensors(out) if t.requires_grad])
    else:
        model.reducer.disarm()
    return out


def _tensors(obj) -> list:
    """The tensors in a forward's output, where torch's DDP looks for them: in lists, tuples
    (named ones too), dicts and dataclasses, nested."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []
