"""Gradient buckets, filled by per-parameter hooks and all-reduced while backward still runs.

Life of one synchronised iteration:
1. ``prepare_backward`` (end of forward) arms the hooks and, with find_unused_parameters, walks
   the autograd graph from the outputs to learn which parameters will get no gradient.
2. Backward starts: the first hook queues ``_finalize`` as an autograd-engine callback and marks
   the unused parameters ready (their slots are zero).
3. Each parameter's post-accumulate-grad hook copies its gradient into its bucket's slot (no copy
   with gradient_as_bucket_view: the gradient *is* the slot). When a bucket's last gradient is in,
   the bucket is ready. Buckets are *launched* strictly in bucket order: bucket i goes out once it
   and every bucket before it are ready. Async collectives are matched across ranks by issue
   order, so this keeps every rank issuing the same sequence even when gradients arrive in a
   different order on different ranks. The comm hook returns at once (async Work on ringcomm's
   progress thread), so the reduction overlaps the rest of backward.
4. ``_finalize`` (end of backward) waits for every bucket in order, sums the gradients of sparse
   embeddings (below), and writes the averages back to ``.grad``. A parameter that got no
   gradient without find_unused_parameters is an error naming it, raised only after every bucket
   was launched (missing slots zero) and drained and every sparse sum made, so all ranks issued
   the same collectives and none is left waiting.

The weights of ``nn.Embedding`` and ``nn.EmbeddingBag`` with ``sparse=True`` get sparse COO
gradients, which no bucket holds: at the end of backward each is summed over the ranks as torch's
gloo sums a sparse all_reduce (ringcomm/integrations/torch_sparse.py: every rank's rows gathered,
in rank order), in registration order, on every rank, even one with no gradient for it, and
divided by the world size. They take no comm hook and no overlap with backward.

After the first synchronised iteration the bucket order is rebuilt from the order in which
gradients became ready; rank 0's order is broadcast so that every rank builds the same buckets.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
import weakref
from typing import Callable, Optional, Sequence

import torch

from ringcomm.errors import UsageError
from ringcomm.integrations.torch_sparse import sparse_sum

from . import comm_hooks

MiB = 1 << 20


def assign_buckets(params: Sequence[torch.Tensor], order: Sequence[int], cap_bytes: int,
                   first_cap_bytes: int) -> list:
    """Split parameter indices into buckets, walking ``order``; returns lists of indices.

    Parameters of a different dtype or device never share a bucket: each (dtype, device) has its
    own open bucket. A bucket closes once it reaches its cap; the first bucket closed for each
    key uses the small first cap so that communication starts early in backward. Buckets come
    out in the order of their first parameter in ``order``.
    """
    open_: dict = {}
    closed_count: dict = {}
    done: list = []
    for i in order:
        p = params[i]
        key = (p.dtype, p.device)
        bucket, size = open_.get(key, ([], 0))
        bucket.append(i)
        size += p.numel() * p.element_size()
        cap = first_cap_bytes if closed_count.get(key, 0) == 0 else cap_bytes
        if size >= cap:
            done.append(bucket)
            closed_count[key] = closed_count.get(key, 0) + 1
            open_.pop(key, None)
        else:
            open_[key] = (bucket, size)
    done.extend(bucket for bucket, _ in open_.values())
    position = {i: n for n, i in enumerate(order)}
    done.sort(key=lambda b: position[b[0]])
    return done


class GradBucket:
    """What a comm hook receives: one bucket's flat gradient buffer and its parameters."""

    __slots__ = ("_index", "_buffer", "_params", "_views", "_last")

    def __init__(self, index: int, buffer: torch.Tensor, params: list, views: list, last: bool):
        self._index, self._buffer, self._params, self._views, self._last = index, buffer, params, views, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list:
        return list(self._params)

    def gradients(self) -> list:
        return list(self._views)

    def is_last(self) -> bool:
        return self._last


def shared_allocator(comm) -> Optional[Callable]:
    """Bucket memory from ``ringcomm.empty`` on the ringcomm backend: blocks the node's ranks map
    into each other, so the all-reduce of a bucket reduces straight out of the peers' buckets and
    stores into them, with plain loads and stores instead of through the kernel, as for buckets in
    private memory (docs/ddp.md, docs/performance.md round thirty-two). Each rank allocates alone.
    """
    if getattr(comm, "backend", None) != "ringcomm":
        return None
    import ringcomm

    def alloc(numel: int, dtype: torch.dtype) -> torch.Tensor:
        return ringcomm.empty(numel, dtype).zero_()
    return alloc


class _Bucket:
    def __init__(self, index: int, members: list, params: list, last: bool, alloc: Optional[Callable]):
        self.index, self.members = index, members
        first = params[members[0]]
        self.dtype, self.device = first.dtype, first.device
        numel = sum(params[i].numel() for i in members)
        if alloc is not None and self.device.type == "cpu":
            self.flat = alloc(numel, self.dtype)
        else:
            self.flat = torch.zeros(numel, dtype=self.dtype, device=self.device)
        self.views, offset = [], 0
        for i in members:
            n = params[i].numel()
            self.views.append(self.flat[offset:offset + n].view(params[i].shape))
            offset += n
        self.grad_bucket = GradBucket(index, self.flat, [params[i] for i in members], self.views, last)
        # allreduce_hook's division can ride on the copy back to .grad (comm_hooks.allreduce_sum_for_avg)
        self.divisible = self.device.type == "cpu" and self.dtype in (torch.float32, torch.float64)


class Reducer:
    def __init__(self, comm, params: list, names: list, *, bucket_cap_mb: float, first_bucket_mb: float,
                 find_unused_parameters: bool, gradient_as_bucket_view: bool, hook: Callable, state,
                 timeline=None, sparse: Sequence = (), wants_sync: Callable[[], bool] = lambda: True,
                 static_graph: bool = False):
        self.comm, self.params, self.names = comm, params, names
        self.sparse = list(sparse)   # (name, parameter) of the sparse-gradient parameters, in no bucket
        self.cap_bytes = int(bucket_cap_mb * MiB)
        self.first_cap_bytes = int(first_bucket_mb * MiB)
        self.find_unused = find_unused_parameters
        # static_graph: the first synchronised backward reduces every gradient at its end and
        # learns how many each parameter gets (``_fires``); later ones reduce a parameter after
        # its last. A parameter can get several in one backward where a reentrant
        # torch.utils.checkpoint recomputes it and it is used outside that segment too.
        self.static = static_graph
        self._fires: Optional[list] = None
        self.as_view = gradient_as_bucket_view
        self.hook, self.state = hook, state
        self.timeline = timeline
        self.timeout = getattr(comm, "timeout", None)
        self._index = {id(p): i for i, p in enumerate(params)}
        self._alloc = shared_allocator(comm)
        self._lock = threading.RLock()
        self._build(list(reversed(range(len(params)))))
        self.rebuilt = False
        self.iteration = 0       # synchronised iterations finished
        self.stats: dict = {}    # of the last synchronised iteration (see _finalize)
        self._armed = False
        self._started = False
        self.wants_sync = wants_sync   # the module's require_backward_grad_sync (no_sync), asked at backward
        self._forward = 0              # forwards so far (the hooks on their outputs name theirs)
        self._reduced = 0              # the last one whose backward finished reducing
        self._ready_order: list = []
        self._unused: set = set()
        self._used_unsynced: set = set()   # parameters given a gradient under no_sync since the last sync
        self._watch_q: queue.Queue = queue.Queue()
        self._finish_t: dict = {}
        # The watcher holds only the queue and the dict, so a dropped Reducer is collected, and
        # its collection stops the thread.
        threading.Thread(target=_watch, args=(self._watch_q, self._finish_t), daemon=True,
                         name="ddp-bucket-watcher").start()
        weakref.finalize(self, self._watch_q.put, None)
        # The hooks live in C++ on the parameters, out of the garbage collector's sight: they hold
        # the Reducer weakly, or parameter -> hook -> Reducer -> parameter would never be freed.
        ref = weakref.ref(self)

        def grad_ready(param):
            reducer = ref()
            if reducer is not None:
                reducer._grad_ready(param)
        self._handles = [_post_accumulate_hook(p, grad_ready) for p in params]

    # ---- bucket layout ---------------------------------------------------------------------
    def _build(self, order: list) -> None:
        groups = assign_buckets(self.params, order, self.cap_bytes, self.first_cap_bytes)
        self.buckets = [_Bucket(b, members, self.params, b == len(groups) - 1, self._alloc)
                        for b, members in enumerate(groups)]
        self.slot = [None] * len(self.params)    # param index -> (bucket index, position)
        self._layout = [(p.dtype, p.device) for p in self.params]   # what the buckets were built for
        for bucket in self.buckets:
            for pos, i in enumerate(bucket.members):
                self.slot[i] = (bucket.index, pos)

    def bucket_members(self) -> list:
        return [list(b.members) for b in self.buckets]

    def maybe_rebuild(self) -> None:
        """Rebuild the buckets from the first iteration's gradient-ready order, once, on all ranks."""
        if self.rebuilt or self.iteration == 0:
            return
        seen = set(self._ready_order)
        order = self._ready_order + [i for b in self.buckets for i in b.members if i not in seen]
        agreed = torch.tensor(order, dtype=torch.int64)
        self.comm.broadcast(agreed, root=0)    # rank 0's order: buckets must match across ranks
        order = agreed.tolist()
        if sorted(order) != list(range(len(self.params))):
            raise UsageError(f"DistributedDataParallel: rank 0's parameter order {order} is not a "
                             f"permutation of this rank's {len(self.params)} parameters; every rank "
                             f"must wrap the same model")
        old = [(p.grad, self.slot[i]) for i, p in enumerate(self.params)]
        self._build(order)
        if self.as_view:
            # Gradients of the finished iteration still await the optimizer: move them along.
            for i, (grad, _) in enumerate(old):
                if grad is not None:
                    view = self._view(i)
                    view.copy_(grad)
                    self.params[i].grad = view
        self.rebuilt = True
        self._ready_order = []

    def _view(self, i: int) -> torch.Tensor:
        b, pos = self.slot[i]
        return self.buckets[b].views[pos]

    # ---- one iteration ---------------------------------------------------------------------------
    def prepare_backward(self, outputs: list) -> None:
        """Arm the hooks for the backward of the forward that produced ``outputs``."""
        with self._lock:
            if self._started:
                raise UsageError(
                    f"DistributedDataParallel: forward ran before the previous backward finished reducing "
                    f"gradients ({self._next} of {len(self.buckets)} buckets launched): that backward raised "
                    f"before its end, or still runs in another thread. The model cannot go on in step with "
                    f"its peers; after an exception in backward, zero the gradients and wrap the module again "
                    f"on every rank (DistributedDataParallel(model.module, comm, ...)): the collectives it "
                    f"launched complete first, and a rank that stopped elsewhere makes that raise")
            self._follow_conversions()
            # No output tensor to walk back from (an object of the user's own): which parameters
            # go unused shows only at the end of backward, where the missing ones go out.
            self._arm(self._unused_now(outputs))
            self._forward += 1
            forward = self._forward
        for out in outputs:
            # Fires when backward reaches the output: the start of backward, even if no parameter
            # gets a gradient at all.
            out.register_hook(functools.partial(self._output_grad, forward))

    def _unused_now(self, outputs: list) -> set:
        """What the coming backward will not reach: found by walking the graph from ``outputs``
        (find_unused_parameters), or, with static_graph, as the first backward found it. The
        walk cannot see inside a reentrant torch.utils.checkpoint, whose parameters are used
        only in its own backward."""
        if not self.find_unused or not outputs:
            return set()
        if self.static:
            return set() if self._fires is None else {i for i, f in enumerate(self._fires) if f == 0}
        return self._unreachable(outputs)

    def _arm(self, unused: set) -> None:
        """Expect one backward: every bucket to fill, and ``unused`` (parameters that backward
        cannot reach) to go out as they stand (lock held)."""
        self._armed = True
        if self.iteration == 0:   # a first backward that failed left its order half recorded
            self._ready_order = []
        self._pending = [len(b.members) for b in self.buckets]
        self._ready = [False] * len(self.params)
        self._bucket_ready = [False] * len(self.buckets)
        self._futures: list = [None] * len(self.buckets)
        self._divisors: list = [None] * len(self.buckets)   # a sum still to divide (allreduce_sum_for_avg)
        self._launch_t = [0.0] * len(self.buckets)
        self._next = 0
        # Used since the last synchronised backward: under no_sync too, as torch counts it.
        self._used = [i in self._used_unsynced for i in range(len(self.params))]
        self._unused = unused
        # static_graph: gradients each parameter got in this backward
        self._count = [0] * len(self.params) if self.static else None

    def _follow_conversions(self) -> None:
        """Rebuild the buckets, in their order, where parameters changed dtype or device since
        they were built (``model.double()``, ``model.to(...)`` after wrapping, as torch allows):
        a float32 bucket once took float64 gradients and rounded them on the way in and out."""
        params, layout = self.params, self._layout
        if all(p.dtype == d and p.device == v for p, (d, v) in zip(params, layout)):
            return
        self._build([i for b in self.buckets for i in b.members])

    def disarm(self) -> None:
        """A forward whose backward is not reduced (no_sync, no_grad): the outputs of the one
        before it are no longer the last forward's."""
        with self._lock:
            self._forward += 1
            if not self._started:
                self._armed = False

    def _unreachable(self, outputs: list) -> set:
        """Indices of parameters that backward from ``outputs`` cannot reach."""
        used, seen = set(), set()
        stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None)
            if var is not None and id(var) in self._index:
                used.add(self._index[id(var)])
            stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
        for o in outputs:   # an output that is itself a parameter
            if o.grad_fn is None and id(o) in self._index:
                used.add(self._index[id(o)])
        return set(range(len(self.params))) - used

    def _output_grad(self, forward: int, grad):
        with self._lock:
            if not self._armed and forward == self._forward == self._reduced and self.wants_sync():
                # A second backward through the last forward's outputs (retain_graph=True). Its
                # gradients accumulate into .grad on top of the reduced ones; left unreduced, as
                # torch's DDP leaves them, each replica kept its own and they drifted apart. So it
                # is reduced like the first: the average of the accumulated gradients.
                self._arm(self._unused)
            if self._armed:
                self._start()
        return grad

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._t_backward = time.perf_counter()
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
        for i in sorted(self._unused):
            self._keep(i)
            self._mark_ready(i)

    def _keep(self, i: int) -> None:
        """A parameter that gets no gradient in this backward contributes its ``.grad`` as it
        stands (an accumulation under no_sync), or zeros where it has none, as torch's DDP does.
        Zeros in every case once overwrote an accumulated gradient with the other ranks' average."""
        grad, view = self.params[i].grad, self._view(i)
        if grad is None:
            view.zero_()
        elif not _same_storage(grad, view):
            view.copy_(grad)

    def _grad_ready(self, param: torch.Tensor) -> None:
        with self._lock:
            if not self._armed:   # no_sync, or a backward that did not come from our forward
                if self.find_unused and param.grad is not None:
                    self._used_unsynced.add(self._index[id(param)])   # used in the no_sync session
                return
            try:
                self._on_grad(param)
            except BaseException:
                # Backward stops here and _finalize will not run: disarm so the next forward works.
                self._armed = self._started = False
                raise

    def _on_grad(self, param: torch.Tensor) -> None:
        self._start()
        i = self._index[id(param)]
        if param.grad is not None and param.grad.layout is not torch.strided:
            raise UsageError(f"DistributedDataParallel: parameter {self.names[i]} got a {param.grad.layout} "
                             f"gradient; sparse gradients are reduced for the weights of nn.Embedding and "
                             f"nn.EmbeddingBag with sparse=True, and every other gradient must be dense")
        if self.static:
            self._count[i] += 1
            learning = self._fires is None
            if learning or self._count[i] < self._fires[i]:
                # More may come: it goes out at the end of this backward (the first, which
                # learns), or with its last gradient. The first fixes its place in the rebuilt order.
                self._used[i] = True
                if learning and self._count[i] == 1 and not self.rebuilt and self.iteration == 0:
                    self._ready_order.append(i)
                return
        if self._ready[i]:
            raise UsageError(self._again(i))
        view = self._view(i)
        if not _same_storage(param.grad, view):
            if param.grad is None:
                view.zero_()
            else:
                view.copy_(param.grad)
            if self.as_view:
                param.grad = view
        if not self.rebuilt and self.iteration == 0:   # the first iteration's order, once
            self._ready_order.append(i)
        self._used[i] = True
        self._mark_ready(i)

    def _again(self, i: int) -> str:
        """Why a gradient of parameter ``i`` came when its slot was already taken."""
        name = self.names[i]
        if self.static:
            got = self._count[i]
            return (f"DistributedDataParallel: parameter {name} got {got} gradient{'s' * (got != 1)} in this "
                    f"backward where the first synchronised one gave it {self._fires[i]} (static_graph=True "
                    f"promises the same graph every iteration)")
        if i in self._unused:
            return (f"DistributedDataParallel: parameter {name} got a gradient after find_unused_parameters=True "
                    f"found it unreachable from the forward's outputs: a reentrant torch.utils.checkpoint "
                    f"(use_reentrant=True) hides the parameters it recomputes. Use use_reentrant=False, or "
                    f"static_graph=True if the graph is the same every iteration")
        return (f"DistributedDataParallel: parameter {name} got a second gradient in one backward: it is used "
                f"inside a reentrant torch.utils.checkpoint (use_reentrant=True) and outside it, or in two such "
                f"segments, and each adds its gradient separately. Pass static_graph=True (the first backward "
                f"learns how many it gets) or use use_reentrant=False")

    def _mark_ready(self, i: int) -> None:
        self._ready[i] = True
        b, _ = self.slot[i]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._bucket_ready[b] = True
            if self.timeline:
                self.timeline.instant(f"bucket {b} ready", time.perf_counter(), bucket=b)
            while self._next < len(self.buckets) and self._bucket_ready[self._next]:
                self._launch(self._next)
                self._next += 1

    def _launch(self, b: int) -> None:
        bucket = self.buckets[b]
        t = time.perf_counter()
        self._launch_t[b] = t
        if self.timeline:
            self.timeline.instant(f"bucket {b} launch", t, bucket=b)
        if self.hook is comm_hooks.allreduce_hook and bucket.divisible:
            fut, self._divisors[b] = comm_hooks.allreduce_sum_for_avg(self.state, bucket.grad_bucket)
        else:
            fut = self.hook(self.state, bucket.grad_bucket)
        if fut is None or not hasattr(fut, "wait"):
            raise UsageError(f"DistributedDataParallel: comm hook {getattr(self.hook, '__name__', self.hook)} "
                             f"returned {type(fut).__name__}, expected a future-like object with wait()")
        self._futures[b] = fut
        if hasattr(fut, "wait_comm"):
            self._watch_q.put((b, fut))

    def _finalize(self) -> None:
        with self._lock:
            try:
                self._finish_iteration()
                self._reduced = self._forward
            finally:
                self._armed = self._started = False

    def _finish_iteration(self) -> None:
        missing = [i for i, r in enumerate(self._ready) if not r]
        none_got_one = len(missing) == len(self.params) > 0
        # Reachable in the graph but given no gradient (find_unused), or an error to report: either
        # way zero the slots and launch the remaining buckets, so that every rank has issued the
        # same collectives and ranks whose gradients were all there are not left waiting.
        for i in missing:
            self._keep(i)
            self._mark_ready(i)
        if self.static and self._fires is None:   # the first: every gradient waited for this end
            self._fires = list(self._count)
            missing = [i for i in missing if not self._count[i]]
        missing = [self.names[i] for i in missing] + [name for name, p in self.sparse if p.grad is None]
        if self.find_unused:
            missing = []
        t_wait = time.perf_counter()
        launched = list(range(self._next))
        results = []
        error = None
        for b in launched:
            try:
                results.append(self._futures[b].wait(self.timeout) if _takes_timeout(self._futures[b])
                               else self._futures[b].wait())
            except BaseException as err:   # drain the rest, then raise the first failure
                error = error or err
                results.append(None)
        self._watch_q.join()
        used = self._globally_used() if self.find_unused and error is None else None
        self._used_unsynced.clear()
        sums = self._sparse_sums() if error is None else []
        t_end = time.perf_counter()
        if error is not None:
            raise error
        if missing:
            names = ", ".join(missing)
            raise UsageError(
                f"DistributedDataParallel: parameter(s) {names} received no gradient in this backward "
                f"(.grad was left as it was; their slots went out as that .grad, or zeros, so that no rank waits). "
                f"Pass find_unused_parameters=True if some parameters are legitimately unused in "
                f"forward, or make the loss depend on them." + (_NONE_GOT_ONE if none_got_one else ""))
        for b, result in zip(launched, results):
            self._write_back(self.buckets[b], result, self._divisors[b], used)
        for (_, p), total in zip(self.sparse, sums):
            p.grad = total.div_(self.comm.size).to(p.device)
        self._record(t_wait, t_end)
        self.iteration += 1

    def _globally_used(self) -> list:
        """Per parameter, whether some rank gave it a gradient in this backward: one all-reduce
        (max) of this rank's flags, issued after every bucket, as torch's local_used_map. A
        parameter no rank used keeps its ``.grad`` untouched (None stays None)."""
        flags = torch.tensor(self._used, dtype=torch.uint8)
        self.comm.all_reduce(flags, op="max")
        return flags.bool().tolist()

    def _sparse_sums(self) -> list:
        """Each sparse-gradient parameter's gradient summed over the ranks, in registration order
        (a rank with no gradient for one adds no rows: every rank takes part in every sum)."""
        sums = []
        for name, p in self.sparse:
            grad = p.grad
            if grad is None:
                grad = torch.sparse_coo_tensor(torch.empty(1, 0, dtype=torch.int64),
                                               torch.empty(0, *p.shape[1:], dtype=p.dtype), p.shape,
                                               check_invariants=False)
            elif grad.layout is torch.strided:   # made dense by the caller: the same rows, as rows
                grad = grad.to_sparse(1)
            sums.append(sparse_sum(self.comm, grad, f"DistributedDataParallel: the gradient of {name}"))
        return sums

    def _write_back(self, bucket: _Bucket, result, divisor: Optional[int] = None,
                    used: Optional[list] = None) -> None:
        """The bucket's reduced gradients into ``.grad``; ``divisor``: the bucket holds sums,
        divided here on the way (in place where ``.grad`` is the bucket's own memory); ``used``:
        per parameter whether any rank gave it a gradient (find_unused_parameters), else all."""
        if isinstance(result, (list, tuple)) and len(result) == 1:
            result = result[0]
        flat = bucket.flat
        # The hook's value becomes every gradient: anything but the bucket's shape would be
        # broadcast into it (a scalar) or leave each rank its own unreduced gradients (None).
        if not isinstance(result, torch.Tensor) or result.numel() != flat.numel() or result.is_complex() != flat.is_complex():
            got = (f"a tensor of {result.numel()} elements ({result.dtype})" if isinstance(result, torch.Tensor)
                   else type(result).__name__)
            raise UsageError(f"DistributedDataParallel: comm hook {getattr(self.hook, '__name__', self.hook)}'s "
                             f"future gave {got} for bucket {bucket.index}; expected a tensor of its "
                             f"{flat.numel()} elements ({flat.dtype}), the reduced bucket")
        if result.data_ptr() != flat.data_ptr():
            flat.copy_(result.reshape(-1))
        if divisor is not None and self.as_view:
            bucket.flat.div_(divisor)
            divisor = None
        for pos, i in enumerate(bucket.members):
            if used is not None and not used[i]:
                continue   # no rank gave it a gradient: .grad stays as it was, as in torch
            p, view = self.params[i], bucket.views[pos]
            if self.as_view:
                if not _same_storage(p.grad, view):
                    p.grad = view
            elif p.grad is None:
                p.grad = view.clone() if divisor is None else torch.div(view, divisor)
            elif divisor is None:
                p.grad.copy_(view)
            else:
                torch.div(view, divisor, out=p.grad)

    def _record(self, t_wait: float, t_end: float) -> None:
        spans, busy, prev = [], 0.0, 0.0
        for b in range(len(self.buckets)):
            s, f = self._launch_t[b], self._finish_t.get(b, t_end)
            spans.append((b, s, f))
            # Buckets reduce one after another: a queued bucket is not busy until the previous ends.
            busy += max(0.0, f - max(s, prev))
            prev = max(prev, f)
        self.stats = {
            "backward_s": t_end - self._t_backward,
            "exposed_comm_s": t_end - t_wait,     # backward blocked on communication
            "comm_s": busy,
            "buckets": len(self.buckets),
        }
        if self.timeline:
            for b, s, f in spans:
                self.timeline.span(f"all_reduce bucket {b}", s, f, tid=1, bucket=b,
                                   bytes=self.buckets[b].flat.numel() * self.buckets[b].flat.element_size(),
                                   params=len(self.buckets[b].members))
            self.timeline.span("backward", self._t_backward, t_end)
        self._finish_t.clear()

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


_NONE_GOT_ONE = (" No parameter received one: torch.autograd.grad, or backward(inputs=...), through the "
                 "model's output gives gradients without accumulating them into .grad, and DDP (as torch's) "
                 "reduces only those; run such a pass through the unwrapped model (ddp_model.module).")


def _post_accumulate_hook(param: torch.Tensor, fn):
    """``param.register_post_accumulate_grad_hook(fn)``, wired to the tensor behind ``param`` now.
    torch.utils.swap_tensors (torch's conversions and load_state_dict under
    set_swap_module_params_on_conversion) leaves a hooked parameter's hook dict on it and the
    autograd side of it with the old tensor; torch then adds new hooks to that dict unwired, so
    none fired and a wrap after such a swap reduced nothing. Setting the dict again wires it (the
    hooks already there fire again too, as they would have without the swap)."""
    hooks = param._post_accumulate_grad_hooks
    if hooks is not None:
        param._post_accumulate_grad_hooks = hooks
    return param.register_post_accumulate_grad_hook(fn)


def _watch(q: queue.Queue, finish_t: dict) -> None:
    """Record when each bucket's communication finishes (the end-of-backward wait comes later).

    Nothing of a bucket stays bound while the thread waits. The collector at exit frees a
    Reducer still alive and so wakes its watcher (``weakref.finalize``) while the interpreter
    finalizes; CPython ends a daemon thread that reaches for the GIL then, and one that was
    freeing the last bucket's future (and so a tensor) died inside torch's C++: the process
    aborted, "terminate called without an active exception", about one run in ten of
    examples/compare_backends.py on backend gloo. Holding nothing, the watcher frees nothing."""
    while True:
        item = q.get()
        try:
            if item is None:
                return
            b, fut = item
            fut.wait_comm()
            finish_t[b] = time.perf_counter()
        except BaseException:   # _finalize's own wait reports the failure
            pass
        finally:
            item = fut = None
            q.task_done()


def _same_storage(grad, view: torch.Tensor) -> bool:
    return grad is not None and grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


def _takes_timeout(fut) -> bool:
    return hasattr(fut, "wait_comm")
