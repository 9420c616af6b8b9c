"""Persistent all_reduce (comm.all_reduce_init) and the implicit fast road of small in-place calls:
the same bits as the ordinary road, interchangeable across ranks, and every fault still caught."""
import numpy as np
import pytest
import torch

from ringcomm import CommTimeoutError, MismatchError, UsageError
from ringcomm.testing import run_threads
from thread_util import in_thread


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("size", [2, 3, 5])
def test_persistent_and_fast_calls_give_the_ordinary_bits(kind, size):
    def body(comm):
        rng = np.random.default_rng(comm.rank)
        data = [rng.standard_normal(300).astype(np.float32) for _ in range(12)]
        mk = (lambda a: torch.from_numpy(a.copy())) if kind == "torch" else (lambda a: a.copy())
        x = mk(data[0])
        p = comm.all_reduce_init(x, op="sum")
        persistent, repeated, ordinary = [], [], []
        for d in data:   # the same buffer, refilled: p() and the implicit fast road of all_reduce(x)
            x[...] = mk(d)
            persistent.append(np.asarray(p()).copy())
            x[...] = mk(d)
            repeated.append(np.asarray(comm.all_reduce(x)).copy())
            ordinary.append(np.asarray(comm.all_reduce(mk(d), algorithm="one_shot")).copy())
        return persistent, repeated, ordinary
    results = run_threads(size, body)
    for r in range(size):
        for i in range(12):
            assert results[r][0][i].tobytes() == results[r][1][i].tobytes() == results[r][2][i].tobytes()
            assert results[r][0][i].tobytes() == results[0][0][i].tobytes()


def test_ranks_may_mix_persistent_fast_and_ordinary_calls():
    def body(comm):
        x = np.full(64, comm.rank + 1.0)
        p = comm.all_reduce_init(x)
        out = []
        for i in range(9):
            x[...] = comm.rank + 1.0
            road = (i + comm.rank) % 3
            if road == 0:
                out.append(p()[0])
            elif road == 1:
                out.append(comm.all_reduce(x)[0])          # fast road after the first time
            else:
                out.append(comm.all_reduce(x.copy())[0])   # a new array: the ordinary road
        return out
    for out in run_threads(3, body):
        assert out == [6.0] * 9


def test_start_and_wait_run_it_asynchronously():
    def body(comm):
        x = np.full(1000, float(comm.rank))
        p = comm.all_reduce_init(x, op="max")
        work = p.start()
        return work.wait(30)[0]
    assert run_threads(4, body) == [3.0] * 4


def test_a_buffer_that_changed_since_init_is_refused():
    def body(comm):
        t = torch.ones(16)
        p = comm.all_reduce_init(t)
        p()
        t.resize_(32)   # re-pointed storage: the validated memory is gone
        with pytest.raises(UsageError, match="changed since all_reduce_init"):
            p()
        return True
    assert run_threads(2, body) == [True, True]


def test_an_output_that_changed_since_init_is_refused():
    """all_reduce_init(x, out=y): a y resized since is refused before anything is written (it
    was written through the old, freed storage: a heap corruption, not an error)."""
    def body(comm):
        x, y = torch.ones(16), torch.zeros(16)
        p = comm.all_reduce_init(x, out=y)
        p()
        y.resize_(64)
        with pytest.raises(UsageError, match="changed since all_reduce_init"):
            p()
        return y[:16].tolist()
    assert run_threads(2, body) == [[2.0] * 16, [2.0] * 16]


def test_a_count_mismatch_on_the_fast_road_is_a_mismatch_on_every_rank():
    def body(comm):
        x = np.ones(256 + comm.rank * 512)   # equal mod 32, all the tag holds: the window stamp's exact count differs
        p = comm.all_reduce_init(x, algorithm="one_shot")
        return p()
    with pytest.raises(MismatchError, match="count"):
        run_threads(2, body, timeout=10)


def test_an_absent_peer_times_out_on_the_fast_road_naming_it():
    def body(comm):
        x = np.ones(8)
        p = comm.all_reduce_init(x, algorithm="one_shot")
        p()
        p()
        if comm.rank == 1:
            return None
        return p()
    with pytest.raises(CommTimeoutError, match=r"all_reduce #2 \(one_shot.*rank 1"):
        run_threads(2, body, timeout=1.0)


# ---- the implicit fast road of the other blocking collectives --------------------------------------
def _calls(comm, x, out_ag, out_rs, out_a2a, root):
    """One blocking call of each collective the memo remembers, on the given buffers."""
    n = comm.size
    return {
        "all_gather": lambda: comm.all_gather(out_ag, x),
        "reduce_scatter": lambda: comm.reduce_scatter(out_rs, out_ag, op="max"),
        "broadcast": lambda: comm.broadcast(x, root=root),
        "all_to_all": lambda: comm.all_to_all(out_a2a, out_ag),
        "gather": lambda: comm.gather(out_ag if comm.rank == root else None, x, root=root),
        "scatter": lambda: comm.scatter(x, out_ag if comm.rank == root else None, root=root),
        "all_reduce avg": lambda: comm.all_reduce(out_rs, op="avg"),
    }, n


WINDOW_ALGOS = {   # the threads transport's model prefers schedules at these sizes: force window ones
    "one_shot": "all_reduce=one_shot,all_gather=one_shot,reduce_scatter=one_shot,broadcast=one_shot,"
                "all_to_all=one_shot,gather=direct,scatter=direct",
    "direct": "all_reduce=direct,all_gather=direct,reduce_scatter=direct,broadcast=direct,"
              "all_to_all=direct,gather=direct,scatter=direct",
}


@pytest.mark.parametrize("algos", sorted(WINDOW_ALGOS))
@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("size", [2, 3])
def test_repeated_calls_of_every_collective_give_the_ordinary_bits(kind, size, algos, monkeypatch):
    """The second and later calls on the same buffers take the memo's road (a WindowCall); each
    result must equal, byte for byte, what a fresh ordinary call returns for the same values."""
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS[algos])

    def body(comm):
        rng = np.random.default_rng(comm.rank)
        mk = (lambda a: torch.from_numpy(a)) if kind == "torch" else (lambda a: a)
        count = 37
        x = mk(np.zeros(count, np.float32))
        ag = mk(np.zeros(count * size, np.float32))
        rs = mk(np.zeros(count, np.float32))
        a2a = mk(np.zeros(count * size, np.float32))
        got, ref = [], []
        for step in range(6):
            root = step % size
            vals = rng.standard_normal(count).astype(np.float32)
            for name in _calls(comm, x, ag, rs, a2a, root)[0]:
                for bufs, out in ((None, got), ("fresh", ref)):
                    x[...] = mk(vals.copy())
                    ag[...] = mk(np.tile(vals, size))
                    rs[...] = mk(vals * 2)
                    if bufs is None:
                        calls = _calls(comm, x, ag, rs, a2a, root)[0]
                    else:   # new objects every time: never a memo hit
                        calls = _calls(comm, mk(np.asarray(x).copy()), mk(np.asarray(ag).copy()),
                                       mk(np.asarray(rs).copy()), mk(np.zeros(count * size, np.float32)),
                                       root)[0]
                    result = calls[name]()
                    out.append((step, name, None if result is None else np.asarray(result).tobytes()))
        return got, ref, len(comm._fast.calls)
    results = run_threads(size, body)
    for got, ref, remembered in results:
        assert got == ref
        assert remembered >= 6, "the memo remembered nothing: the test ran no fast road"
    for got, _, _ in results[1:]:   # all_gather, broadcast, all_to_all... equal across ranks where they must be
        same = [g for g in got if g[1] in ("all_gather", "broadcast", "all_reduce avg")]
        assert same == [g for g in results[0][0] if g[1] in ("all_gather", "broadcast", "all_reduce avg")]


@pytest.mark.parametrize("before", [2, 3])   # changed after the memo learnt the call / after it took it
def test_a_buffer_changed_between_repeated_calls_takes_the_ordinary_road(before, monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        out, t = torch.zeros(2 * 16), torch.full((16,), float(comm.rank))
        for _ in range(before):                      # seen, remembered, [taken]
            comm.all_gather(out, t)
        t.resize_(8)                                  # re-pointed: the memo must not use the old memory
        t.fill_(comm.rank + 10.0)
        out2 = torch.zeros(2 * 8)
        comm.all_gather(out2, t)
        short = torch.zeros(16)
        out.resize_(16)                               # and the output too
        comm.all_gather(out, t)
        return out2.tolist(), out.tolist(), short.tolist()
    for out2, out, _ in run_threads(2, body):
        assert out2 == [10.0] * 8 + [11.0] * 8
        assert out == [10.0] * 8 + [11.0] * 8


def test_a_root_mismatch_on_the_fast_road_is_a_mismatch_on_every_rank(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        x = np.full(64, float(comm.rank))
        for _ in range(3):
            comm.broadcast(x, root=0)                 # the memo's road from the third call on
        return comm.broadcast(x, root=comm.rank)      # ranks disagree on the root
    with pytest.raises(MismatchError, match="root"):
        run_threads(2, body, timeout=10)


@pytest.mark.parametrize("kind", ["broadcast", "gather", "scatter"])
def test_a_remembered_root_passed_as_a_float_or_bool_is_still_refused(kind, monkeypatch):
    """1.0 and True equal 1 as keys: the memo must not let through a root the ordinary road refuses."""
    from ringcomm import ArgumentTypeError
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        x, out = np.ones(8), np.ones(8 * comm.size)
        call = {"broadcast": lambda root: comm.broadcast(x, root),
                "gather": lambda root: comm.gather(out if comm.rank == 1 else None, x, root),
                "scatter": lambda root: comm.scatter(x, out if comm.rank == 1 else None, root)}[kind]
        for _ in range(3):
            call(1)
        errors = []
        for root in (1.0, True):
            try:
                call(root)
            except ArgumentTypeError as err:
                errors.append(str(err))
        return errors
    for errors in run_threads(2, body, timeout=20):
        assert len(errors) == 2 and all('"root"' in e for e in errors), errors


def test_an_absent_peer_times_out_on_the_fast_road_of_all_gather_naming_it(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        out, x = np.zeros(16), np.ones(8)
        for _ in range(3):   # seen, remembered, taken
            comm.all_gather(out, x)
        if comm.rank == 1:
            return None
        return comm.all_gather(out, x)
    with pytest.raises(CommTimeoutError, match=r"all_gather #3 .*rank 1"):
        run_threads(2, body, timeout=1.0)


def test_the_memo_holds_few_bytes_alive(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    from ringcomm.persistent import FAST_BYTES, FAST_ENTRIES, FAST_LIMIT

    def body(comm, count):
        kept = []
        for i in range(2 * FAST_ENTRIES + 8):   # distinct broadcasts, each twice: more than the memo may hold
            x = np.full(count, float(i))
            comm.broadcast(x)
            comm.broadcast(x)
            kept.append(x)
        return len(comm._fast.calls), comm._fast.pinned
    # small buffers: the count of calls binds; large ones (as large as a remembered call may be): the bytes
    small, large = FAST_BYTES // FAST_ENTRIES // 4, min(FAST_LIMIT, FAST_BYTES // 4)
    for entries, pinned in run_threads(2, body, small // 8):
        assert entries == FAST_ENTRIES and pinned <= FAST_BYTES
    for entries, pinned in run_threads(2, body, large // 8):
        assert 0 < entries <= FAST_BYTES // large < FAST_ENTRIES and pinned <= FAST_BYTES


def test_calls_as_large_as_the_limit_take_the_fast_road_with_the_right_result(monkeypatch):
    """FAST_LIMIT bytes is on the road (the boundary the test below crosses), and a remembered call
    of that size still moves this call's data, not the data it was remembered with."""
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["direct"])
    from ringcomm.persistent import FAST_LIMIT

    def body(comm):
        n, r = comm.size, comm.rank
        x, out = np.empty(FAST_LIMIT // 4, np.float32), np.empty(FAST_LIMIT // 4, np.float32)
        wrong = 0
        for i in range(4):
            x[...] = np.arange(x.size, dtype=np.float32) + 10 * i + r
            comm.all_to_all(out, x)
            block = x.size // n
            expected = np.concatenate([np.arange(x.size, dtype=np.float32)[r * block:(r + 1) * block] + 10 * i + q
                                       for q in range(n)])
            wrong += int(np.count_nonzero(out != expected))
        return [type(entry[1]).__name__ for entry in comm._fast.calls.values()], wrong
    # a WindowCall: the road was built (third call) and taken (fourth)
    assert run_threads(2, body) == [(["WindowCall"], 0)] * 2


def test_calls_too_large_for_the_fast_road_are_neither_remembered_nor_planned_twice(monkeypatch):
    from ringcomm.communicator import Communicator
    from ringcomm.persistent import FAST_LIMIT
    planned = []
    plan_for = Communicator._plan_for
    monkeypatch.setattr(Communicator, "_plan_for", lambda self, *a: (planned.append(a[0].name), plan_for(self, *a))[1])

    def body(comm):
        x, out = np.ones(FAST_LIMIT // 4 + 2, np.float32), np.empty(FAST_LIMIT // 4 + 2, np.float32)
        for _ in range(3):
            comm.all_to_all(out, x)
            comm.all_reduce(x)
        return len(comm._fast.calls), len(comm._fast.seen)
    assert run_threads(2, body) == [(0, 0), (0, 0)]
    assert planned.count("all_to_all") == planned.count("all_reduce") == 2 * 3   # once per call and rank


def test_a_second_thread_on_the_fast_road_is_refused_naming_it(monkeypatch):
    """The thread rule holds on the memo's road: a remembered call from another thread while this
    one's receive is in flight raises UsageError, it does not pair with the peer's messages."""
    import threading
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])
    intruded = threading.Barrier(2)

    def body(comm):
        out, x = np.zeros(16), np.full(8, float(comm.rank))
        for _ in range(3):                           # seen, remembered, taken
            comm.all_gather(out, x)
        assert len(comm._fast.calls) == 1
        peer, inbox = 1 - comm.rank, np.zeros(4)
        work = comm.recv(inbox, src=peer, async_op=True)   # in flight until both intruders ran
        _, caught = in_thread(lambda: comm.all_gather(out, x))
        intruded.wait(60)
        comm.send(np.ones(4), dst=peer)
        work.wait(60)
        return caught, comm.all_gather(out, x).tolist()
    for caught, gathered in run_threads(2, body):
        assert isinstance(caught, UsageError) and "intruder" in str(caught) and "comm.dup()" in str(caught)
        assert gathered == [0.0] * 8 + [1.0] * 8


def test_all_reduces_last_road_is_checked_and_forgotten_with_its_entry(monkeypatch):
    # all_reduce keeps the road of its previous call (FastCalls.last) to skip the memo lookup: a
    # buffer changed since must not take it, nor may a road the memo has dropped keep its buffer.
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        t = torch.full((16,), float(comm.rank + 1))
        for _ in range(4):                      # seen, remembered, taken twice: the last road
            comm.all_reduce(t)
        assert comm._fast.last[0] is t
        t.resize_(8)                             # re-pointed on the shortcut
        t.fill_(comm.rank + 1.0)
        first = comm.all_reduce(t).tolist()
        x = np.full(8, float(comm.rank + 1))
        for _ in range(4):
            comm.all_reduce(x)
        with comm._fast.lock:
            for key in list(comm._fast.calls):
                comm._fast._drop(key)           # every road forgotten (evicted), the last one too
        return first, comm._fast.last[2], x.tolist()
    for first, last, x in run_threads(2, body):
        assert first == [3.0] * 8
        assert last is None
        assert x == [3.0 * 2 ** 3] * 8


# ---- send and recv: prepared calls remembered (PreparedP2P) -------------------------------------

def test_remembered_sends_and_receives_move_each_calls_data_and_are_taken():
    """From the third call on the same buffers the prepared calls are reused; every call still
    moves what the buffer holds then, torch tensors and numpy arrays alike."""
    def body(comm):
        peer = 1 - comm.rank
        got = []
        for make in (np.zeros, torch.zeros):
            x, out = make(1000), make(1000)
            for i in range(5):
                x[:] = 100 * i + comm.rank
                work = comm.send(x, peer, tag=3, async_op=True)
                comm.recv(out, peer, tag=3)
                work.wait()
                got.append(float(out[0]) == 100 * i + peer and float(out[-1]) == 100 * i + peer)
        return got, sorted(type(entry[1][0]).__name__ for entry in comm._p2p.calls.values())
    for got, remembered in run_threads(2, body):
        assert got == [True] * 10
        assert remembered == ["Call"] * 4   # a send and a receive, numpy and torch


def test_a_p2p_buffer_changed_since_it_was_remembered_takes_the_ordinary_road():
    """A receive buffer made read-only, or a tensor re-pointed, after the memo took it: the ordinary
    road's checks run again (the read-only one refused as it would be on a first call, the
    re-pointed one written in its new memory)."""
    def body(comm):
        peer = 1 - comm.rank
        out, t = np.zeros(64), torch.zeros(64)
        for _ in range(3):
            work = comm.send(np.full(64, 1.0 + comm.rank), peer, async_op=True)
            comm.recv(out, peer)
            work.wait()
            work = comm.send(torch.full((64,), 1.0 + comm.rank), peer, async_op=True)
            comm.recv(t, peer)
            work.wait()
        out.flags.writeable = False
        refused = None
        try:
            comm.recv(out, peer)
        except UsageError as err:
            refused = str(err)
        t.set_(torch.zeros(32))                    # re-pointed: the old memory must not be written
        old = torch.zeros(64)
        work = comm.send(torch.full((32,), 7.0 + comm.rank), peer, async_op=True)
        comm.recv(t, peer)
        work.wait()
        return refused, t.tolist(), old.tolist()
    for rank, (refused, t, old) in enumerate(run_threads(2, body)):
        assert refused is not None and "writable" in refused and 'argument "out"' in refused
        assert t == [7.0 + 1 - rank] * 32 and old == [0.0] * 64


def test_a_remembered_peer_or_tag_passed_as_a_bool_is_still_refused():
    """True == 1 hashes alike: the memo must not let a bool through that the ordinary road refuses."""
    from ringcomm import ArgumentTypeError

    def body(comm):
        x = np.ones(8)
        if comm.rank == 0:
            for _ in range(3):
                comm.send(x, 1, tag=1)
            errors = []
            for dst, tag in ((True, 1), (1, True)):
                try:
                    comm.send(x, dst, tag=tag)
                except ArgumentTypeError as err:
                    errors.append(str(err))
            return errors
        for _ in range(3):
            comm.recv(x, 0, tag=1)
        return None
    errors = run_threads(2, body)[0]
    assert len(errors) == 2 and '"dst"' in errors[0] and '"tag"' in errors[1]


def test_the_p2p_memo_holds_few_buffers_and_no_large_or_one_off_ones():
    from ringcomm.persistent import FAST_BYTES, FAST_ENTRIES, FAST_LIMIT

    def body(comm):
        peer, kept = 1 - comm.rank, []
        for i in range(2 * FAST_ENTRIES + 4):     # distinct buffers, each three times
            x = np.full(1 << 10, float(i))
            for _ in range(3):
                work = comm.send(x, peer, async_op=True)
                comm.recv(x, peer)
                work.wait()
            kept.append(x)
        entries, pinned = len(comm._p2p.calls), comm._p2p.pinned
        big = np.zeros(FAST_LIMIT // 8 + 1)       # one element above the limit
        staging = np.zeros(64)
        for _ in range(3):
            work = comm.send(big, peer, async_op=True)
            comm.recv(big, peer)
            work.wait()
            work = comm.send(staging[:], peer, async_op=True)   # a fresh view per call
            comm.recv(staging[:], peer)
            work.wait()
        bufs = [entry[0][0] for entry in comm._p2p.calls.values()]
        return entries, pinned, any(b is big or b.base is staging for b in bufs)
    for entries, pinned, held in run_threads(2, body):
        assert entries == FAST_ENTRIES and pinned <= FAST_BYTES and not held


def test_a_persistent_call_runs_once_at_a_time():
    """Started again before its Work completed, it once reduced twice in place (1 became 4 on 2
    ranks); MPI_Start calls that erroneous. Now it raises, before any message moves. Rank 1 joins
    late, so rank 0's first start is surely still in flight."""
    import time

    def body(comm):
        x = np.ones(4, np.float32)
        p = comm.all_reduce_init(x)
        if comm.rank == 0:
            work = p.start()
            with pytest.raises(UsageError, match="has not completed"):
                p.start()
            with pytest.raises(UsageError, match="has not completed"):
                p()
            work.wait()
        else:
            time.sleep(0.3)
            p.start().wait()
        p()   # completed: it runs again
        return x.tolist()
    assert run_threads(2, body) == [[4.0] * 4] * 2


def test_every_road_that_writes_a_tensor_tells_autograd_and_none_that_only_reads_it(monkeypatch):
    """ringcomm writes a tensor's memory by address, out of autograd's sight: a tensor saved for
    a backward and then all-reduced in place gave silently wrong gradients (w.grad 3 instead of
    1 and 2 below), where torch's in-place ops and its c10d collectives make that backward raise.
    Each road counts: ordinary, remembered (the fast road from the third call), persistent,
    asynchronous, and a prepared receive."""
    monkeypatch.setenv("RINGCOMM_ALGO", WINDOW_ALGOS["one_shot"])

    def body(comm):
        peer = 1 - comm.rank
        w = torch.ones(4, requires_grad=True)
        x = torch.full((4,), float(comm.rank + 1))
        y = (w * x).sum()   # saves x for w's gradient
        comm.all_reduce(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
        x, out, sent, gathered = torch.ones(8), torch.zeros(8), torch.ones(8), torch.zeros(16)
        p = comm.all_reduce_init(x)
        roads = {
            "all_reduce": (lambda: comm.all_reduce(x), x),
            "persistent": (p, x),
            "start/wait": (lambda: p.start().wait(), x),
            "async all_gather": (lambda: comm.all_gather(gathered, sent, async_op=True).wait(), gathered),
            "recv": (lambda: (comm.send(sent, peer, async_op=True), comm.recv(out, peer))[0].wait(), out),
        }
        missed = []
        for name, (run, written) in roads.items():
            for i in range(4):   # the third and later calls take the remembered roads
                before, read = written._version, sent._version
                run()
                if written._version == before or sent._version != read:
                    missed.append((name, i))
        return missed
    assert run_threads(2, body) == [[], []]
