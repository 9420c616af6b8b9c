"""The torch.distributed backend "ringcomm": errors, futures, issue order, timeouts.

In-process cases build ``RingcommProcessGroup`` over thread ranks (``run_threads``) and call it
the way torch's Python API does; the mpirun jobs go through ``dist.*`` and torch's DDP.
"""
import random
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

import ringcomm
from mpi_util import run_mpi
from ringcomm import CommError, CommTimeoutError, MismatchError, PeerAbortedError, UsageError
from ringcomm.integrations.torch_backend import RingcommProcessGroup
from ringcomm.integrations.torch_groups import Shared
from ringcomm.integrations.torch_work import seconds
from ringcomm.testing import run_threads


def group_of(comm, timeout=None, shared=None):
    return RingcommProcessGroup(shared or Shared(comm, owned=False), comm.rank, comm.size, timeout)


def opts(blocking=False):
    o = AllreduceOptions()
    o.asyncOp = not blocking
    return o


def test_results_and_typed_values():
    def body(comm):
        pg = group_of(comm)
        t = torch.full((4,), float(comm.rank + 1))
        work = pg.allreduce([t], opts())
        assert work.wait() is True and work.is_completed() and work.is_success()
        assert work.exception() is None and work.result() == [t]
        assert work.get_future().value()[0] is t
        blocking = torch.ones(3)
        pg.allreduce([blocking], opts(blocking=True)).wait()     # the Engine runs it inline
        return t.tolist(), blocking.tolist()
    for reduced, ones in run_threads(2, body):
        assert reduced == [3.0] * 4 and ones == [2.0] * 3


def test_an_op_the_dtype_cannot_take_is_named_not_shown_as_an_object():
    def body(comm):
        pg = group_of(comm)
        o = opts()
        o.reduceOp = dist.ReduceOp.BAND
        with pytest.raises(UsageError, match=r'argument "op" \(expected sum, prod, min, max, avg or premul_sum for '
                                             r"floating dtype float32, got 'band'\)") as info:
            pg.allreduce([torch.ones(3)], o).wait()
        assert "object at 0x" not in str(info.value)
    run_threads(2, body)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_tensors_are_refused_by_layout_except_all_reduces_coo_sum():
    """gloo sums sparse COO tensors and nothing else sparse; so does ringcomm, and it names the
    layout of what it refuses instead of a torch error from inside a copy."""
    def body(comm):
        pg = group_of(comm)
        summed = torch.eye(3).to_sparse()
        pg.allreduce([summed], opts()).wait()
        refused = []
        for call in (lambda: pg.allreduce([torch.eye(3).to_sparse_csr()], opts()),
                     lambda: pg.broadcast([torch.eye(3).to_sparse()], dist.BroadcastOptions())):
            with pytest.raises(UsageError, match=r'"tensor" \(expected a dense tensor.*a torch\.sparse_(csr|coo) '):
                call()
            refused.append(True)
        return summed.to_dense().tolist(), refused
    for summed, refused in run_threads(2, body):
        assert summed == (2 * torch.eye(3)).tolist() and refused == [True, True]


def test_meta_tensors_are_refused_naming_the_device_before_any_message():
    """A meta tensor has a shape and no memory: refused as the direct API refuses it, not by
    torch's "Cannot copy out of meta tensor" from inside the copy to host memory."""
    def body(comm):
        pg = group_of(comm)
        for call in (lambda: pg.allreduce([torch.empty(3, device="meta")], opts()),
                     lambda: pg.broadcast([torch.empty(3, device="meta")], dist.BroadcastOptions())):
            with pytest.raises(UsageError, match=r'"tensor" \(expected a tensor with data .*got .a tensor on meta.\)'):
                call()
        x = torch.ones(3)
        pg.allreduce([x], opts()).wait()   # nothing was sent: the next call pairs as usual
        return x.tolist()
    assert run_threads(2, body) == [[2.0, 2.0, 2.0]] * 2


def test_sparse_all_reduce_of_tensors_that_differ_raises_on_every_rank():
    """Ranks whose sparse tensors differ in shape or dtype would sum each other's entries at
    indices that mean something else: MismatchError on every rank, and the group still works."""
    def body(comm):
        pg = group_of(comm)
        errors = []
        dtype = [torch.float32, torch.float64][comm.rank]
        for t in (torch.eye(3 + comm.rank).to_sparse(), torch.eye(3, dtype=dtype).to_sparse()):
            with pytest.raises(MismatchError, match=f"rank {1 - comm.rank}'s tensor differs from this rank's") as info:
                pg.allreduce([t], opts()).wait()
            errors.append(str(info.value))
        same = torch.eye(3).to_sparse()
        pg.allreduce([same], opts()).wait()
        return errors, same.to_dense().tolist()
    for errors, same in run_threads(2, body):
        assert len(errors) == 2 and same == (2 * torch.eye(3)).tolist()


def test_one_element_tensors_of_any_stride_move_like_gloo_moves_them():
    """torch calls ``x[::2][:1]`` contiguous; a flat byte view of it raised on the rank that had
    one (its peers then waited out the timeout). So did the indices of a sparse tensor whose
    duplicates coalesce into one entry: what a sparse embedding's gradient is when a batch
    repeats one token."""
    def body(comm):
        pg = group_of(comm)
        odd = torch.tensor([comm.rank + 1.0, -1.0])[::2][:1]
        assert odd.is_contiguous() and odd.stride() == (2,)
        gathered = [torch.empty(1) for _ in range(comm.size)]
        pg.allgather([gathered], [odd]).wait()
        repeated = torch.sparse_coo_tensor(torch.tensor([[2, 2]]), torch.tensor([1.0, 2.0]), (4,))
        pg.allreduce([repeated], opts()).wait()
        return [t.item() for t in gathered], repeated.to_dense().tolist()
    for gathered, summed in run_threads(2, body):
        assert gathered == [1.0, 2.0] and summed == [0.0, 0.0, 6.0, 0.0]


def test_an_even_all_to_all_single_splits_rows_and_refuses_a_dim_0_that_does_not_divide():
    """5 float32 over 2 ranks were split by bytes, 10 and 10, cutting the third element in two
    (gloo returns the same garbage); the rows must divide, as NCCL checks."""
    def body(comm):
        pg = group_of(comm)
        with pytest.raises(UsageError, match=r"dim 0 of the tensor, 5, does not split evenly over 2 ranks"):
            pg.alltoall_base(torch.empty(5), torch.ones(5), [], [])
        x = torch.arange(8, dtype=torch.float32).view(4, 2) + 10 * comm.rank
        out = torch.empty(4, 2)
        pg.alltoall_base(out, x, [], []).wait()
        return out.tolist()
    for r, out in enumerate(run_threads(2, body, timeout=20)):
        assert out == [[0.0 + 4 * r, 1.0 + 4 * r], [2.0 + 4 * r, 3.0 + 4 * r],
                       [10.0 + 4 * r, 11.0 + 4 * r], [12.0 + 4 * r, 13.0 + 4 * r]]


def test_complex_reduce_and_reduce_scatter_sum_each_part_as_gloo_does():
    """torch's all_reduce hands a backend complex tensors as real pairs, its reduce and
    reduce_scatter do not: they were refused by dtype where gloo sums them."""
    def body(comm):
        pg, r = group_of(comm), comm.rank
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (r + 1)
        o = dist.ReduceOptions()
        o.rootRank, o.reduceOp = 0, dist.ReduceOp.SUM
        pg.reduce([z], o).wait()
        x = torch.arange(4, dtype=torch.float64).to(torch.complex128) * (1 + 1j) + r
        part = torch.empty(2, dtype=torch.complex128)
        pg._reduce_scatter_base(part, x).wait()
        parts = [torch.full((1 + i,), complex(r, -r), dtype=torch.complex64) for i in range(2)]
        mine = torch.empty(1 + r, dtype=torch.complex64)
        pg.reduce_scatter([mine], [parts]).wait()
        refused = None
        try:
            o.reduceOp = dist.ReduceOp.PRODUCT
            pg.reduce([z.clone()], o).wait()
        except ringcomm.ArgumentTypeError as err:
            refused = str(err)
        return z.tolist(), part.tolist(), mine.tolist(), refused
    for r, (z, part, mine, refused) in enumerate(run_threads(2, body, timeout=20)):
        if r == 0:
            assert z == [3 + 6j, 9 - 3j]
        assert part == [complex(2 * k + 1, 2 * k) for k in (2 * r, 2 * r + 1)]
        assert mine == [complex(1, -1)] * (1 + r)
        assert refused is not None and "complex64" in refused


def test_inputs_that_overlap_their_outputs_give_what_gloo_gives():
    """gloo takes every input before writing an output; ringcomm's collectives refuse overlaps,
    and refused them on the ranks where they occurred while the others timed out. Copied first
    now, except an all-gather's input that is exactly its own block (FSDP's in-place form)."""
    def body(comm):
        pg, n, r = group_of(comm), 3, comm.rank
        gathered = torch.arange(2 * n, dtype=torch.float32) + 100 * r
        pg._allgather_base(gathered, gathered[:n]).wait()              # rank 1's input is rank 0's block
        own = torch.arange(2 * n, dtype=torch.float32) + 100 * r
        pg._allgather_base(own, own[r * n:(r + 1) * n]).wait()         # in place
        x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
        pg._reduce_scatter_base(x[:n], x).wait()
        y = torch.arange(2 * n, dtype=torch.float32) + 100 * r
        pg.alltoall_base(y, y, [], []).wait()
        return gathered.tolist(), own.tolist(), x[:n].tolist(), y.tolist()
    for r, (gathered, own, part, swapped) in enumerate(run_threads(2, body, timeout=20)):
        assert gathered == [0.0, 1.0, 2.0, 100.0, 101.0, 102.0]
        assert own == [0.0, 1.0, 2.0, 103.0, 104.0, 105.0]
        assert part == [100.0 + 2 * i + 6 * r for i in range(3)]
        assert swapped == [[0.0, 1.0, 2.0, 100.0, 101.0, 102.0], [3.0, 4.0, 5.0, 103.0, 104.0, 105.0]][r]


@pytest.mark.parametrize("blocking", [False, True])
def test_a_mismatch_raises_from_wait_and_from_the_future(blocking):
    def body(comm):
        pg = group_of(comm)
        t = torch.ones(4 + 4 * comm.rank)
        work = pg.allreduce([t], opts(blocking))
        # The rank that sees the other's count raises MismatchError; the other may be released
        # first by its abort notice (PeerAbortedError), which quotes it.
        with pytest.raises(CommError, match=r"all_reduce #\d+.*differs in count"):
            work.wait()
        assert work.is_completed() and not work.is_success()
        assert isinstance(work.exception(), (MismatchError, PeerAbortedError))
        with pytest.raises(RuntimeError, match=r"Error: all_reduce #\d+.*differs in count"):
            work.get_future().wait()
        return t.sum().item()
    assert run_threads(2, body) == [4.0, 8.0]   # neither tensor reduced


def test_wait_timeout_raises_and_the_work_goes_on():
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 1:
            time.sleep(0.5)
        t = torch.ones(2)
        work = pg.allreduce([t], opts())
        if comm.rank == 0:
            with pytest.raises(CommTimeoutError, match=r"all_reduce #\d+ on rank 0: not complete after work.wait"):
                work.wait(timedelta(seconds=0.05))
        work.wait()
        return t.tolist()
    assert run_threads(2, body) == [[2.0, 2.0]] * 2


def test_group_timeout_shorter_than_the_communicators_fires_and_aborts():
    def body(comm):
        shared = Shared(comm, owned=False)
        group_of(comm, shared=shared)                  # the world group: the communicator's 30 s
        pg = group_of(comm, timeout=0.3, shared=shared)
        assert comm.timeout == 30
        if comm.rank == 0:
            t0 = time.monotonic()
            with pytest.raises(CommTimeoutError, match="process group's timeout of 0.3 s; the communicator was aborted"):
                pg.allreduce([torch.ones(2)], opts()).wait()
            return time.monotonic() - t0
        time.sleep(1.5)
        return None
    took = run_threads(2, body, timeout=30)[0]
    assert took < 10


def test_callbacks_may_block_on_later_collectives_and_issue_in_one_order():
    """Callbacks issue collectives and wait for them (PowerSGD's pattern) while the main thread
    keeps issuing; random delays make every rank's timing differ. Each nested all-reduce carries
    its bucket's number, equal in size for every bucket: issued in different orders on two
    ranks, they would be summed across buckets without any error."""
    buckets = 6

    def body(comm):
        pg = group_of(comm)
        rng = random.Random(comm.rank)
        sums = {}

        def callback_for(b):
            def callback(fut):
                time.sleep(rng.random() * 0.01)
                tag = torch.full((8,), float(b))
                pg.allreduce([tag], opts()).get_future().wait()
                sums[b] = tag[0].item()
                return fut.value()
            return callback

        futures = []
        for b in range(buckets):
            time.sleep(rng.random() * 0.01)
            futures.append(pg.allreduce([torch.ones(8)], opts()).get_future().then(callback_for(b)))
        for f in futures:
            f.wait()
        return sums
    for sums in run_threads(2, body, timeout=30):
        assert sums == {b: 2.0 * b for b in range(buckets)}


def test_set_timeout_reaches_the_communicator():
    def body(comm):
        pg = group_of(comm)
        pg.set_timeout(timedelta(seconds=9))
        with pytest.raises(ValueError, match='"timeout"'):
            pg.set_timeout(timedelta(0))
        return comm.timeout, pg.timeout
    assert run_threads(2, body) == [(9.0, 9.0)] * 2


def test_seconds_reads_c10d_timeouts():
    assert seconds(None) is None and seconds(timedelta(0)) is None      # kNoTimeout
    assert seconds(timedelta(milliseconds=-1)) is None                    # kUnsetTimeout
    assert seconds(timedelta(seconds=2.5)) == 2.5 and seconds(3) == 3.0


def test_calls_after_a_slow_callback_wait_for_it_in_order():
    """A call made outside callbacks is issued after earlier calls' callbacks return (so every
    rank issues the same sequence); the caller is not blocked meanwhile unless it waits."""
    def body(comm):
        pg = group_of(comm)
        if comm.rank == 1:
            time.sleep(0.2)     # rank 0's callback is attached before its future completes
        slow = pg.allreduce([torch.ones(1)], opts()).get_future().then(lambda f: time.sleep(0.3) or f.value())
        t0 = time.monotonic()
        later = torch.ones(2)
        work = pg.allreduce([later], opts())          # queued: returns at once
        queued_s = time.monotonic() - t0
        work.wait()
        slow.wait()
        return queued_s, time.monotonic() - t0, later.tolist()
    (queued_s, total_s, later), (_, _, later_1) = run_threads(2, body, timeout=30)
    assert queued_s < 0.2 and total_s >= 0.25 and later == later_1 == [2.0, 2.0]


def test_only_calls_behind_a_watched_future_queue():
    """Nobody asked for the future: no Python callback can issue from it, so later calls go
    straight to the communicator. Once Python holds an in-flight call's future, later calls
    queue until its callbacks have returned."""
    release = threading.Event()

    def body(comm):
        pg = group_of(comm)
        plain = [pg.allreduce([torch.ones(2)], opts()) for _ in range(3)]
        issued_at_once = all(w._pending.index is not None for w in plain)
        if comm.rank == 1:
            time.sleep(0.3)       # rank 0's callback is attached before its future completes
        held = pg.allreduce([torch.ones(2)], opts()).get_future().then(lambda f: release.wait(10) and f.value())
        after = pg.allreduce([torch.ones(2)], opts())
        queued = after._pending.index is None
        release.set()
        after.wait()
        held.wait()
        for w in plain:
            w.wait()
        return issued_at_once, queued
    (at_once_0, queued_0), (at_once_1, _) = run_threads(2, body, timeout=30)
    assert at_once_0 and at_once_1 and queued_0


def test_a_call_queued_behind_a_stuck_callback_fails_instead_of_hanging():
    release = threading.Event()

    def body(comm):
        pg = group_of(comm, timeout=0.5)
        if comm.rank == 1:
            time.sleep(0.5)        # so that rank 0's callback is attached before its future completes
            pg.allreduce([torch.ones(1)], opts()).wait()
            with pytest.raises(CommError):   # rank 0 never issues it
                pg.allreduce([torch.ones(1)], opts()).wait()
            return
        stuck = pg.allreduce([torch.ones(1)], opts()).get_future().then(lambda f: release.wait(30))
        try:
            with pytest.raises(CommTimeoutError, match=r"all_reduce on rank 0: not issued after .*callbacks of "
                                                       r"all_reduce #\d+"):
                pg.allreduce([torch.ones(1)], opts()).wait()
        finally:
            release.set()
        stuck.wait()
    run_threads(2, body, timeout=30)


def _passed(proc, names):
    for name in names:
        assert proc.stdout.count(f"check {name} ok") == 2, \
            f"check {name} not passed on both ranks:\n{proc.stdout}\n{proc.stderr[-4000:]}"


@pytest.mark.mpi
def test_failures_raise_on_every_rank_through_torch_distributed():
    proc = run_mpi(2, "torch_backend_faults.py", timeout=240)
    names = [f"mismatch_{w}" for w in ("blocking", "wait", "future")] + \
            [f"absent_{w}" for w in ("blocking", "wait", "future")] + ["group_timeout", "wait_timeout", "lifecycle"]
    _passed(proc, names)


@pytest.mark.mpi
def test_torch_comm_hooks_train_like_on_gloo():
    proc = run_mpi(2, "torch_comm_hooks.py", timeout=240)
    _passed(proc, ["allreduce", "fp16_compress", "bf16_compress", "builtin_allreduce", "builtin_fp16_compress",
                   "powersgd", "noop", "powersgd_many_buckets", "batched_powersgd"])


def test_negative_views_reduce_the_values_they_show():
    """A negative view (``x.conj().imag``, ``torch._neg_view``) holds the negated values in memory.
    The process group read memory, so a MAX over such views returned the negated minimum and a
    broadcast into one from a plain root wrote the root's values negated, with no error (gloo
    gives the values the views show). The native API refuses them, naming the argument."""
    from torch._C._distributed_c10d import AllToAllOptions, BroadcastOptions, ReduceScatterOptions

    def body(comm):
        pg, r = group_of(comm), comm.rank
        shown = torch.tensor([1.0, -5.0, 2.0, 7.0]) * (1 + r) - 3 * r
        most = torch._neg_view(-shown)
        o = opts(blocking=True)
        o.reduceOp = dist.ReduceOp.MAX
        pg.allreduce([most], o).wait()
        into = torch._neg_view(torch.zeros(4))
        b = BroadcastOptions()
        b.rootRank = 1
        pg.broadcast([into if r == 0 else shown.clone()], b).wait()
        gathered = torch._neg_view(torch.zeros(8))
        pg._allgather_base(gathered, torch._neg_view(-shown)).wait()
        part = torch._neg_view(torch.zeros(2))
        s = ReduceScatterOptions()
        s.reduceOp = dist.ReduceOp.MAX
        pg._reduce_scatter_base(part, torch._neg_view(-shown), s).wait()
        swapped = torch.zeros(4)
        pg.alltoall_base(swapped, torch._neg_view(-shown), [], [], AllToAllOptions()).wait()
        with pytest.raises(UsageError, match=r'argument "x" \(expected a tensor without a lazy negation'):
            comm.all_reduce(torch._neg_view(torch.ones(3)))
        return [t.tolist() for t in (most, into, gathered, part, swapped)] + [shown.tolist()]

    (most0, into0, gathered0, part0, swapped0, s0), (most1, _, gathered1, part1, swapped1, s1) = run_threads(2, body)
    top = torch.maximum(torch.tensor(s0), torch.tensor(s1)).tolist()
    assert most0 == most1 == top
    assert into0 == s1
    assert gathered0 == gathered1 == s0 + s1
    assert (part0, part1) == (top[:2], top[2:])
    assert swapped0 == s0[:2] + s1[:2] and swapped1 == s0[2:] + s1[2:]


def test_closing_the_engine_waits_for_its_threads_to_end():
    """Engine.close returns only once its threads have ended: a thread ending during the
    interpreter's exit drops tensors and futures there, and torch aborts the process
    ('terminate called without an active exception'). A call still settling when close comes
    (here: 0.3 s) holds close until it is done."""
    from ringcomm.integrations.torch_engine import Engine

    class Settling:   # the part of a Pending the completing thread uses
        index, watched, error, what = 0, False, None, "fake all_reduce"

        def __init__(self):
            self.issued, self.settled = time.perf_counter(), threading.Event()

        def settle(self):
            time.sleep(0.3)
            self.settled.set()

        def publish(self):
            pass

    engine = Engine("test-engine")
    pending = Settling()
    with engine._cv:
        engine._queue.append(pending)
        engine._start_thread()
        engine._cv.notify_all()
    threads = list(engine._threads)
    engine.close()
    assert pending.settled.is_set()
    assert threads and not any(t.is_alive() for t in threads), threads
