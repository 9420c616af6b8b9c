"""DistributedDataParallel over a ringcomm Communicator: the nn.Module wrapper.

    comm = ringcomm.init()
    model = ddp.DistributedDataParallel(net)          # replicas now equal rank 0's
    loss_fn(model(x), y).backward()                   # .grad averaged over ranks on return
    optimizer.step()

Only the public Communicator API is used (broadcast, all_reduce with async_op=True, Work.wait),
so every backend of ringcomm.init works. See reducer.py for how buckets overlap backward.
"""
from __future__ import annotations

import contextlib
import hashlib
import weakref
from typing import Callable, Optional

import torch
from torch import nn

from ringcomm.errors import UsageError, bad_type, bad_value
from ringcomm.integrations.torch_tensors import flat as flat_view

from . import comm_hooks, untraced
from .places import Places
from .reducer import Reducer
from .timeline import from_env

NAME = "DistributedDataParallel"


class DistributedDataParallel(nn.Module):
    def __init__(self, module: nn.Module, comm=None, *, bucket_cap_mb: float = 25, first_bucket_mb: float = 1,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise bad_type(NAME, "module", "a torch.nn.Module", type(module).__name__)
        for arg, value in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad_type(NAME, arg, "a number of MiB", type(value).__name__)
            if value < 0:   # 0, as in torch: a bucket per parameter
                raise bad_value(NAME, arg, "a number of MiB >= 0", value)
        # torch's static_graph promises the graph never changes: the reducer then learns in the
        # first backward how many gradients each parameter gets (reentrant checkpoints reusing one).
        if not isinstance(static_graph, bool):
            raise bad_type(NAME, "static_graph", "a bool", type(static_graph).__name__)
        if comm is None:
            import ringcomm
            comm = _default_comm(ringcomm)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
        self._wrapped = {id(p) for p in module.parameters()}   # all held alive: by the reducer or _frozen
        self._tree = {id(m): (weakref.ref(m), f"{n}." if n else "") for n, m in module.named_modules()}
        self._changed: list = []   # what was registered in the tree since (_watch_registrations)
        self._places = Places(module)   # what torch replaces past those hooks (places.py)
        for n, p in named:
            if p.is_sparse or p.layout != torch.strided:
                raise bad_value(NAME, "module", "dense (strided) parameters", f"{n} with layout {p.layout}")
        # Refused before any message: the broadcast below stopped at torch's "Cannot copy out of meta
        # tensor; no data!" after the model check had already gone round the ranks.
        meta = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type == "meta"]
        if meta:
            raise bad_value(NAME, "module", "parameters and buffers with data (materialise a model built on the "
                            "meta device first: module.to_empty(device=...) and initialise it)",
                            f"{', '.join(meta)} on the meta device")
        # Parameters whose gradients are sparse rows (embeddings with sparse=True, as torch's DDP
        # finds them) are summed apart at the end of backward, in no bucket (reducer.py).
        sparse = {id(p) for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
                  for p in m.parameters(recurse=False)}
        self._dense = [k for k, (_, p) in enumerate(named) if id(p) not in sparse]
        self.module = module
        self.comm = comm
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self._sync_buffers = True   # broadcast buffers in the next forward (torch's require_forward_param_sync)
        self.timeline = from_env(comm.rank)
        self._hook_state = comm_hooks.CommState(comm)
        self._hook = comm_hooks.allreduce_hook
        verify_same_model(comm, module)
        # Replicas start from rank 0's state, whatever each rank initialised.
        broadcast_tensors(comm, [p.data for p in module.parameters()] + [b.data for b in module.buffers()])
        dense = [named[k] for k in self._dense]
        self.reducer = Reducer(comm, [p for _, p in dense], [n for n, _ in dense],
                               bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb,
                               find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                               gradient_as_bucket_view=gradient_as_bucket_view,
                               hook=self._hook, state=self._hook_state, timeline=self.timeline,
                               sparse=[(n, p) for n, p in named if id(p) in sparse],
                               wants_sync=_wants_sync(weakref.ref(self)))
        _watch_registrations(self)

    # ---- training-loop API ---------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        # Under torch.compile only the module's own call is traced; the bookkeeping either side
        # runs as ordinary Python (untraced.py says why).
        untraced.before_forward(self)
        return untraced.after_forward(self, self.module(*args, **kwargs))

    def __getstate__(self):
        # Without this, pickle stopped at the reducer's lock: "cannot pickle '_thread.RLock' object".
        raise TypeError(f"{NAME} cannot be pickled or deep-copied: it holds a communicator and hooks on "
                        f"the parameters. Save model.state_dict() or model.module (torch.save), or deep-copy "
                        f"model.module (an EMA copy, for instance)")

    def _registered(self, name: str, param) -> None:
        """A parameter registered in the wrapped tree after wrapping (``module.weight = Parameter(...)``,
        a parametrization): with no bucket, its gradients would stay each rank's own. One frozen
        now is only watched, as the frozen ones are."""
        if param is None or id(param) in self._wrapped:
            return   # a removal, or the same parameter assigned again
        if param.requires_grad:
            self._changed.append(f"parameter {name}")
        else:
            self._frozen.append((name, param))

    def _added(self, name: str, submodule) -> None:
        """A submodule attached to the wrapped tree after wrapping: refused if it brings trainable
        parameters, else watched as the tree is."""
        trainable = [n for n, p in submodule.named_parameters() if p.requires_grad and id(p) not in self._wrapped]
        if trainable:
            self._changed.append(f"submodule {name} (with {', '.join(trainable)})")
            return
        self._frozen.extend((f"{name}.{n}", p) for n, p in submodule.named_parameters() if id(p) not in self._wrapped)
        for n, m in submodule.named_modules():
            self._tree.setdefault(id(m), (weakref.ref(m), f"{name}.{n}." if n else f"{name}."))

    def _refuse_changed(self) -> None:
        raise UsageError(f"{NAME}: {'; '.join(self._changed)} registered in the model after it was wrapped: "
                         f"their gradients would not be reduced, and the replicas would drift apart (as under "
                         f"torch's DDP). Change the model before wrapping it, or wrap model.module again on "
                         f"every rank: DistributedDataParallel(model.module, comm, ...)")

    def _refuse_moved(self) -> None:
        """Parameters torch replaced or swapped past the registration hooks (places.py): their
        gradients would reach no bucket. Frozen ones that stay frozen are only watched anew."""
        changes = self._places.changes()
        harmless = [c for c in changes if not c[2].requires_grad and (c[3] is None or not c[3].requires_grad)]
        if len(harmless) == len(changes):
            self._places.adopt([c[0] for c in harmless])
            moved = {id(c[2]): c[3] for c in harmless}
            self._frozen = [(n, moved.get(id(p), p)) for n, p in self._frozen if moved.get(id(p), p) is not None]
            return
        kinds: dict = {}
        for c in changes:
            kinds.setdefault(c[4], []).append(c[1])
        what = "; ".join(f"parameter(s) {', '.join(labels)} {how}" for how, labels in kinds.items())
        raise UsageError(f"{NAME}: {what} after the model was "
                         f"wrapped (torch does so past its registration hooks under "
                         f"torch.__future__.set_overwrite_module_params_on_conversion or "
                         f"set_swap_module_params_on_conversion, and in torch.utils.swap_tensors): the reducer's "
                         f"hooks are on the old tensors, so the new ones' gradients would not be reduced and the "
                         f"replicas would drift apart. Convert or load the model before wrapping it, or wrap "
                         f"model.module again on every rank: DistributedDataParallel(model.module, comm, ...)")

    def _refuse_thawed(self) -> None:
        """Parameters frozen when the model was wrapped have no place in a bucket: unfrozen since
        (gradual unfreezing), their gradients stayed each rank's own and the replicas drifted
        apart, as they do under torch's DDP. Raised before any message, on every rank that
        unfroze them."""
        thawed = [n for n, p in self._frozen if p.requires_grad]
        if thawed:
            raise UsageError(f"{NAME}: parameter(s) {', '.join(thawed)} did not require grad when the model was "
                             f"wrapped and do now; their gradients would not be reduced. Wrap the module again "
                             f"after unfreezing, on every rank: DistributedDataParallel(model.module, comm, ...)")

    @contextlib.contextmanager
    def no_sync(self):
        """Skip gradient synchronisation inside: gradients accumulate locally in ``.grad``.

        The first backward after the block reduces the accumulated sum, so k micro-batches under
        no_sync plus one outside equal one step on the k+1 times larger batch.
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state, hook: Callable) -> None:
        """Replace how a bucket is reduced: ``hook(state, bucket) -> future-like`` (see comm_hooks)."""
        if not callable(hook):
            raise bad_type("register_comm_hook", "hook", "a callable hook(state, bucket) -> future",
                           type(hook).__name__)
        if self.reducer._started:
            raise bad_value("register_comm_hook", "hook", "a registration outside backward",
                            getattr(hook, "__name__", hook))
        if state is None:
            state = self._hook_state
        self.reducer.hook, self.reducer.state = hook, state

    @property
    def last_step_stats(self) -> dict:
        """Timings of the last synchronised backward: backward_s; comm_s, the time some bucket's
        reduction was in flight; exposed_comm_s, the time backward waited on it at its end."""
        return dict(self.reducer.stats)

    def bucket_members(self) -> list:
        """Parameter indices (into the trainable parameters, in registration order) per bucket;
        sparse embeddings' weights are in none."""
        return [[self._dense[i] for i in members] for members in self.reducer.bucket_members()]

    def write_timeline(self) -> Optional[str]:
        if self.timeline is None:
            return None
        self.timeline.write()
        return self.timeline.path


_DEFAULT_COMM = []


def _wants_sync(module_ref) -> Callable[[], bool]:
    """The module's require_backward_grad_sync as a backward sees it, held weakly: the reducer
    is the module's."""
    def wants() -> bool:
        module = module_ref()
        return module is not None and module.require_backward_grad_sync
    return wants


_WRAPPERS: weakref.WeakSet = weakref.WeakSet()   # live wrappers, whose trees the hooks below watch
_HOOKS: list = []


def _watch_registrations(wrapper) -> None:
    """torch's global registration hooks tell each live wrapper what is registered in its tree
    after wrapping: a parameter replaced or added there had no bucket and stayed each rank's own
    (silently, with find_unused_parameters=True). Free per step: they run only as a model changes."""
    if not _HOOKS:
        from torch.nn.modules import module as torch_module
        _HOOKS.append(torch_module.register_module_parameter_registration_hook(_parameter_registered))
        _HOOKS.append(torch_module.register_module_module_registration_hook(_module_registered))
    _WRAPPERS.add(wrapper)


def _holders(module):
    """(wrapper, the module's name in its tree) for each live wrapper whose tree holds ``module``."""
    for wrapper in list(_WRAPPERS):
        entry = wrapper._tree.get(id(module))
        if entry is not None and entry[0]() is module:
            yield wrapper, entry[1]


def _parameter_registered(module, name, param):
    for wrapper, prefix in _holders(module):
        wrapper._registered(prefix + name, param)


def _module_registered(module, name, submodule):
    if submodule is not None:
        for wrapper, prefix in _holders(module):
            wrapper._added(prefix + name, submodule)


def _default_comm(ringcomm):
    """One communicator per process for every wrapper built with comm=None."""
    if not _DEFAULT_COMM:
        _DEFAULT_COMM.append(ringcomm.init())
    return _DEFAULT_COMM[0]


def _model_entries(module: nn.Module) -> list:
    """One line per parameter and buffer: what ranks must agree on to be replicas."""
    return ([f"parameter {n}: shape {tuple(p.shape)}, {p.dtype}, requires_grad={p.requires_grad}"
             for n, p in module.named_parameters()]
            + [f"buffer {n}: shape {tuple(b.shape)}, {b.dtype}" for n, b in module.named_buffers()])


def verify_same_model(comm, module: nn.Module) -> None:
    """Every rank wraps the same model (names, shapes, dtypes, which parameters train), or every
    rank raises UsageError naming the ranks that differ and, on each of those, its first
    difference from rank 0. The parameters travel as bytes in one broadcast, so without this
    two models of the same total size (a transposed weight, the same layers registered in another
    order) were taken as replicas, rank 0's bytes reinterpreted in the other shapes."""
    entries = _model_entries(module)
    text = "\n".join(entries).encode()
    digest = hashlib.sha256(text).digest()
    mine = torch.tensor([int.from_bytes(digest[:8], "little", signed=True)], dtype=torch.int64)
    every = torch.empty(comm.size, dtype=torch.int64)
    comm.all_gather(every, mine)
    odd = [r for r in range(comm.size) if every[r] != every[0]]
    if not odd:
        return
    size = torch.tensor([len(text)], dtype=torch.int64)
    comm.broadcast(size, root=0)
    theirs = torch.zeros(int(size.item()), dtype=torch.uint8)
    if comm.rank == 0:
        theirs.copy_(torch.frombuffer(bytearray(text), dtype=torch.uint8))
    comm.broadcast(theirs, root=0)
    detail = ""
    if comm.rank in odd:
        reference = theirs.numpy().tobytes().decode().split("\n") if theirs.numel() else []
        for k in range(max(len(entries), len(reference))):
            here = entries[k] if k < len(entries) else "nothing"
            there = reference[k] if k < len(reference) else "nothing"
            if here != there:
                detail = f"; entry {k} here is '{here}', on rank 0 '{there}'"
                break
    raise UsageError(f"{NAME}: the ranks wrap different models: rank(s) {odd} differ from rank 0 in their "
                     f"parameters or buffers (names, shapes, dtypes, requires_grad){detail}. Every rank "
                     f"must build the same model before wrapping it.")


def broadcast_tensors(comm, tensors: list, root: int = 0) -> None:
    """Give every rank root's values of ``tensors``: one byte-level broadcast per device.

    Bytes, because buffers may have dtypes the communicator does not reduce (bool); a broadcast
    only moves them.
    """
    by_device: dict = {}
    for t in tensors:
        if t.numel():
            by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        # Widest dtypes first: every offset stays a multiple of the element size that views it.
        group.sort(key=lambda t: -t.element_size())
        flat = torch.cat([flat_view(t.detach().contiguous()).view(torch.uint8) for t in group])
        staged = flat if comm_hooks.comm_accepts(comm, device) else flat.cpu()
        comm.broadcast(staged, root=root)
        if staged is not flat:
            flat.copy_(staged)
        offset = 0
        for t in group:
            n = t.numel() * t.element_size()
            with torch.no_grad():
                t.copy_(flat[offset:offset + n].view(t.dtype).view(t.shape))
            offset += n
