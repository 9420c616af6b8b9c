"""The shm transport's pieces without MPI: the staging pool's policy, fault specs, the docs."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ringcomm import env
from ringcomm.diagnostics import faults
from ringcomm.errors import UsageError
from ringcomm.transport.shm import staging
from ringcomm.transport.shm.staging import OVERFLOW, PLACED, WAIT, StagingPool, share_size

ROOT = Path(__file__).resolve().parents[1]


class Send:
    """What the pool reads of a send: its tag and buffer; it sets ``off``."""

    def __init__(self, tag, nbytes):
        self.tag, self.buf, self.off = tag, np.zeros(nbytes, np.uint8), None


def pool(share=4096, peers=(1, 2)):
    memory = np.zeros(100 + share * len(peers), np.uint8)

    def copy_in(off, buf):
        memory[off:off + buf.nbytes] = buf.view(np.uint8)
    return StagingPool(100, share, list(peers), copy_in), memory


def test_sends_are_copied_into_their_peers_share_first_fit_and_aligned():
    p, memory = pool()
    a, b, c = Send(5, 100), Send(5, 10), Send(5, 1000)
    a.buf[:] = 7
    assert [p.admit(1, s) for s in (a, b, c)] == [PLACED] * 3
    assert (a.off, b.off, c.off) == (100, 228, 292)   # whole 64-byte lines from the share's start
    assert memory[100:200].tolist() == [7] * 100
    p.release(1, b.off)
    d = Send(5, 64)
    assert p.admit(1, d) == PLACED and d.off == 228   # the hole is reused
    e = Send(9, 50)
    assert p.admit(2, e) == PLACED and e.off == 100 + 4096   # another peer: its own share


def test_a_stream_waits_behind_its_own_messages_and_others_overflow_meanwhile():
    p, _ = pool(share=1024)
    first = [Send(5, 512), Send(5, 512)]
    assert [p.admit(1, s) for s in first] == [PLACED, PLACED]
    waiting = [Send(5, 512), Send(5, 512)]
    assert [p.admit(1, s) for s in waiting] == [WAIT, WAIT]   # only stream 5 holds the share
    assert p.admit(1, Send(6, 8)) == OVERFLOW                  # never wait behind another stream
    assert p.admit(2, Send(6, 8)) == PLACED                    # another peer is not affected
    assert p.retry(1) == []
    p.release(1, first[0].off)
    assert p.retry(1) == [(waiting[0], PLACED)]                # in stream order, as room frees
    p.release(1, first[1].off)
    assert p.retry(1) == [(waiting[1], PLACED)] and not p.shares[1].waiting


def test_a_send_overflows_when_the_share_holds_another_stream_or_it_is_larger_than_a_share():
    p, _ = pool(share=1024)
    assert p.admit(1, Send(5, 1000)) == PLACED
    assert p.admit(1, Send(6, 512)) == OVERFLOW   # waiting behind stream 5 could close a cycle
    assert p.admit(2, Send(6, 1025)) == OVERFLOW  # never fits, not even in an empty share


def test_share_size_respects_the_wish_the_cap_and_the_budget():
    assert share_size(3, 4 << 20, None, staging.POOL_CAP) == 4 << 20
    assert share_size(15, 4 << 20, None, staging.POOL_CAP) == (32 << 20) // 15 // (64 << 10) * (64 << 10)
    assert share_size(3, 4 << 20, 3 << 20, None) == 1 << 20
    assert share_size(3, 4 << 20, 100 << 10, None) == 0   # less than one quantum each: no pool
    assert share_size(0, 4 << 20, None, None) == 0


def test_fault_specs_parse_and_bad_ones_name_what_is_accepted(monkeypatch):
    assert faults.parse("ring:1:KILL") == faults.Fault("ring", 1, "KILL")
    assert faults.parse("setup:0:stop").signal == "STOP"
    monkeypatch.setenv("RINGCOMM_FAULT", "rings:1:KILL")
    with pytest.raises(UsageError, match="RINGCOMM_FAULT='rings:1:KILL': expected phase:rank:signal"):
        env.get("RINGCOMM_FAULT")
    monkeypatch.setenv("RINGCOMM_FAULT", "ring:1:KILL")
    assert faults.armed(1) == faults.Fault("ring", 1, "KILL") and faults.armed(0) is None
    faults.fire("ring", 0)   # another rank: nothing happens


def test_sends_are_read_by_cma_from_256k_only_where_this_hosts_reads_are_fast(monkeypatch):
    """The eager pool's two copies against one CMA read: which wins below 4 MiB is the host's
    (cma.py has the figures), so a node that reads by CMA asks its own reads."""
    from ringcomm.transport.shm import cma
    monkeypatch.delenv("RINGCOMM_SHM_CMA_P2P_MIN", raising=False)
    monkeypatch.setattr(cma, "read_cost", lambda: 1.9)   # the Intel Xeon host
    assert cma.p2p_min_bytes(probe=True) == 256 << 10
    assert cma.p2p_min_bytes(probe=False) == 4 << 20     # no CMA: the pipe's floor is not the host's
    monkeypatch.setattr(cma, "read_cost", lambda: 3.8)   # the AMD EPYC host
    assert cma.p2p_min_bytes(probe=True) == 4 << 20
    monkeypatch.setenv("RINGCOMM_SHM_CMA_P2P_MIN", "64K")   # the variable wins over the host
    assert cma.p2p_min_bytes(probe=True) == 64 << 10


def test_read_cost_reads_this_process_for_real():
    from ringcomm.transport.shm import cma
    cost = cma.read_cost.__wrapped__(64 << 10)   # not the cached 1 MiB figure
    assert 0 < cost < float("inf"), cost


def test_reliability_doc_lists_every_variable():
    text = (ROOT / "docs" / "reliability.md").read_text()
    assert env.table() in text, "docs/reliability.md: paste the output of python -c 'from ringcomm import env; print(env.table())'"


def test_a_window_polls_briefly_where_the_machine_holds_more_ranks_than_its_node(monkeypatch):
    """Nodes named by RINGCOMM_NODE_ID can share a machine: a node of 2 ranks on 2 cores polls
    long only while the machine holds no more ranks than cores (init says how many it holds)."""
    from ringcomm.transport import polling
    monkeypatch.setattr(polling, "cores", lambda: 2)
    monkeypatch.setattr(polling, "_ranks_here", 1)
    monkeypatch.setattr(polling, "_spin", polling.SPIN_SHARED)
    assert polling.spin_for(2) == polling.SPIN_DEDICATED
    assert polling.set_ranks_here(4) == polling.SPIN_SHARED
    assert polling.spin_for(2) == polling.SPIN_SHARED
    polling.set_ranks_here(2)
    assert polling.spin_for(2) == polling.SPIN_DEDICATED and polling.spin_for(3) == polling.SPIN_SHARED


def test_a_wait_whose_peer_left_right_after_posting_returns_what_it_posted():
    """A peer may post its last round and close at once; a waiter that tested just before the
    post and then sees the peer closed must take the post, not raise (polling.wait_polling)."""
    from ringcomm import PeerAbortedError
    from ringcomm.transport.polling import wait_polling
    posted = []

    def left():   # the peer posts between this rank's test and its look at the peer's flags
        posted.append(True)
        return "rank 1 has closed its communicator (close())"
    assert wait_polling(lambda: bool(posted), 5, left, spin=0)
    with pytest.raises(PeerAbortedError, match="has closed"):
        wait_polling(lambda: False, 5, left, spin=0)


def test_a_process_is_ended_once_gone_a_zombie_or_its_pid_reused_and_never_while_it_runs():
    """What the shm transport's watch of its peers (aborted_reason) rests on: no false death, and
    a dead peer seen as dead whether reaped or not."""
    from ringcomm.transport.shm import segments
    assert segments.proc_is_ours()
    me = os.getpid()
    start = segments.process_start(me)
    assert start is not None and not segments.process_ended(me, start)
    assert segments.process_ended(me, start + 1)   # the same pid, started at another time: reused
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    born = segments.process_start(child.pid)
    assert born is not None and not segments.process_ended(child.pid, born)
    deadline = time.monotonic() + 10
    while not segments.process_ended(child.pid, born):   # exited, not yet reaped: a zombie
        assert time.monotonic() < deadline, "a child that exited never looked ended"
        time.sleep(0.05)
    assert segments.owner_alive(child.pid)   # its pid is still there: ended as a zombie
    assert child.poll() == 0   # reaps it
    assert segments.process_ended(child.pid, born)
