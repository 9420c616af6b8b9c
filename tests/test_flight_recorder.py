"""The flight recorder lists every call of a communicator in issue order: collectives (#n) and
sends/receives (p2p#n: peer, user tag, size, state, time), and each rank prints it on a timeout.

In-process ranks; the same under real mpirun (shm, MPI) in test_faults_mpi.py."""
import io
import re

import numpy as np
import pytest

from ringcomm import CommError, CommTimeoutError, MismatchError
from ringcomm.testing import run_threads

MS = r"\d+\.\d ms"


def first_dump(stderr: str, rank: int) -> list:
    """The entry lines of ``rank``'s first flight-recorder dump in ``stderr``."""
    head = f"ringcomm flight recorder, rank {rank}: "
    assert head in stderr, stderr
    lines = stderr.split(head, 1)[1].splitlines()[2:]   # past the reason and the column legend
    end = next((i for i, line in enumerate(lines) if not line.startswith("  ")), len(lines))
    return [line.strip() for line in lines[:end]]


def test_a_receive_nobody_answers_dumps_a_recorder_naming_the_receive_its_peer_and_tag(capsys):
    def body(comm):
        comm.all_reduce(np.ones(4))
        if comm.rank == 1:   # rank 0 never sends
            comm.recv(np.zeros(6, np.float32), 0, tag=11)
    with pytest.raises(CommTimeoutError, match=r"recv p2p#1 from rank 0 \(tag 11\) on rank 1: timed out"):
        run_threads(2, body, timeout=1.0)
    stderr = capsys.readouterr().err
    assert "ringcomm flight recorder, rank 1: recv p2p#1 from rank 0 (tag 11)" in stderr
    entries = first_dump(stderr, 1)
    assert len(entries) == 2, entries
    assert re.fullmatch(rf"#0 +all_reduce +4 x float64 +\w+ +done {MS}", entries[0]), entries
    took = re.fullmatch(rf"p2p#1 +recv +6 x float32 +from rank 0 tag 11 +failed: CommTimeoutError ({MS})",
                        entries[1])
    assert took and float(took.group(1).split()[0]) >= 1000 * 0.99, entries


def test_sends_and_receives_appear_in_issue_order_among_the_collectives():
    def body(comm):
        x = np.arange(8, dtype=np.float32)
        comm.all_reduce(x)
        if comm.rank == 0:
            comm.send(x, 1, tag=3)
            comm.broadcast(x)
            work = comm.recv(np.zeros(2, np.int64), None, tag=4, async_op=True)
        else:
            comm.recv(x, 0, tag=3)
            comm.broadcast(x)
            work = comm.send(np.arange(2), 0, tag=4, async_op=True)
        comm.barrier()
        work.wait(10)
        return comm.recorder.dump("on request", stream=io.StringIO())
    dumps = run_threads(2, body, timeout=10)
    expected = {
        0: [r"#0 +all_reduce +8 x float32 +\w+ +done",
            r"p2p#1 +send +8 x float32 +to rank 1 tag 3 +done",
            r"#1 +broadcast +8 x float32 +\w+ +done",
            r"p2p#2 +recv +2 x int64 +from any \(rank 1\) tag 4 +done",
            r"#2 +barrier +0 x - +\w+ +done"],
        1: [r"#0 +all_reduce +8 x float32 +\w+ +done",
            r"p2p#1 +recv +8 x float32 +from rank 0 tag 3 +done",
            r"#1 +broadcast +8 x float32 +\w+ +done",
            r"p2p#2 +send +2 x int64 +to rank 0 tag 4 +done",
            r"#2 +barrier +0 x - +\w+ +done"],
    }
    for rank, text in enumerate(dumps):
        entries = first_dump(text, rank)
        assert len(entries) == len(expected[rank]), entries
        for pattern, line in zip(expected[rank], entries):
            assert re.fullmatch(rf"{pattern} {MS}", line), (rank, line, pattern)


def test_a_collective_timeout_shows_the_receive_still_posted_and_the_send_still_queued(capsys):
    """The pipeline case: a rank waits in a collective while its receive of the previous stage
    never arrived; its dump must show that receive, posted and waiting, and what queued behind."""
    def body(comm):
        if comm.rank == 1:   # rank 0 takes no part
            comm.recv(np.zeros(3), 0, tag=5, async_op=True)
            stuck = comm.all_reduce(np.ones(4), async_op=True)
            comm.send(np.zeros(2, np.int32), 0, tag=6, async_op=True)
            stuck.wait(30)
    with pytest.raises(CommTimeoutError, match="all_reduce #0"):
        run_threads(2, body, timeout=1.0)
    entries = first_dump(capsys.readouterr().err, 1)
    assert len(entries) == 3, entries
    assert re.fullmatch(rf"p2p#1 +recv +3 x float64 +from rank 0 tag 5 +posted {MS}", entries[0]), entries
    assert re.fullmatch(rf"#0 +all_reduce +4 x float64 +\w+ +failed: CommTimeoutError {MS}", entries[1]), entries
    assert re.fullmatch(r"p2p#2 +send +2 x int32 +to rank 0 tag 6 +queued", entries[2]), entries


def test_a_failed_receive_is_marked_failed_with_its_error_class():
    def body(comm):
        if comm.rank == 0:
            comm.send(np.zeros(4, np.float32), 1, tag=2, async_op=True)
            return None
        with pytest.raises(MismatchError):
            comm.recv(np.zeros(4, np.int32), 0, tag=2)
        return comm.recorder
    recorder = run_threads(2, body, timeout=10)[1]
    (entry,) = recorder.entries
    assert (entry.seq, entry.name, entry.peer, entry.tag, entry.state) == (1, "recv", 0, 2, "failed: MismatchError")
    assert entry.started <= entry.ended
    assert re.fullmatch(rf"p2p#1 +recv +4 x int32 +from rank 0 tag 2 +failed: MismatchError {MS}",
                        entry.line(entry.ended))


def test_a_receive_withdrawn_by_close_is_marked_cancelled():
    def body(comm):
        if comm.rank == 0:
            work = comm.recv(np.zeros(2), None, tag=9, async_op=True)   # nobody sends
            return comm, work
        return None
    comm, work = run_threads(2, body, timeout=10)[0]   # run_threads closed the communicator
    with pytest.raises(CommError, match=r"recv p2p#1 from any rank \(tag 9\).*cancelled"):
        work.wait(5)
    (entry,) = comm.recorder.entries
    assert re.fullmatch(rf"p2p#1 +recv +2 x float64 +from any tag 9 +cancelled {MS}", entry.line(entry.ended))
