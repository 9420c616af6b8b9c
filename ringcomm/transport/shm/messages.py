"""How a message moves between two ranks of a node: ShmTransport's point-to-point half.

A send moves no bytes itself: it publishes a descriptor (rings.py) saying where the receiver can
read the payload, and the receiver copies (``irecv``) or reduces (``irecv_reduce``) straight
from there into its own buffer, then acknowledges. Where the payload is read from is the
sender's decision, per send:

- the send's range lies in a segment from ``allocate`` (DDP buckets): read in place;
- it lies in an array of a collective of at least ``cma_min_bytes`` staged with ``stage``, or
  it is a user's send (``isend_p2p``) of at least ``cma_p2p_min_bytes``, and the node can use
  CMA: read out of the sender's process (cma.py); such a send goes through a pipe (pipe.py)
  where the node cannot;
- otherwise: copied into this rank's staging pool (staging.py), read from there (a
  ``comm.send`` is done for its caller once this copy is published: ``buffered``);
- the pool has no room for it and must not wait (staging.py says when), or it is larger than a
  pool share: the bytes go over the node's MPI communicator ("payload over MPI").

Payloads over MPI all use one MPI tag (``payload_tag``) per pair, whatever their ringcomm tag (tags
reach 2**62; MPICH's bound is 2**29): the sender starts its MPI send at the moment it publishes
the descriptor, the receiver posts its MPI receive when it discovers the descriptor, both under
the transport's lock and in PUB order, so MPI's non-overtaking rule pairs the k-th payload with
the k-th such descriptor.

A receive is claimed under the lock and then copied or reduced outside it, by one thread.
Reductions happen only in the receive's own wait, in the order the caller waits them, so the
order of reduction never depends on timing; plain receives complete in any wait.

``Messages`` is a mixin of ShmTransport (transport.py), which sets up the state it works on: the
rings (``_out``, ``_in``), the pool, the ordinals, the lock. Apart so that each file holds one
role; one class at run time, so a message pays no extra call for the split.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np

from ...errors import CommError, MismatchError, UsageError
from ..base import Request
from ..polling import wait_polling
from ..view import CONTEXT_SHIFT
from . import pipe, staging
from .rings import BLOCK, CMA, EMPTY, PIPE, VIA_MPI
from .segments import address

TAG_LIMIT = 1 << 62


def _gone(req) -> Optional[str]:
    """Why the peer of a stalled send or receive ``req`` will post nothing more, named as the
    communicator of its message numbers it (ShmTransport.aborted_reason)."""
    t = req.t
    return t.aborted_reason(req.peer, t._as_rank(req.tag, req.peer))


class _Send(Request):
    __slots__ = ("t", "peer", "tag", "ord", "buf", "seg", "off", "extra", "slot", "num", "mpi", "keep", "pooled",
                 "held", "pipe")

    def __init__(self, t, peer, tag, ordinal, buf):
        self.t, self.peer, self.tag, self.ord, self.buf = t, peer, tag, ordinal, buf
        self.seg = self.off = self.extra = 0
        self.slot = self.num = -1
        self.mpi = self.keep = None
        self.pipe = None      # a send through a ring of cells (pipe.py): its descriptor
        self.pooled = False   # holds pool space until acknowledged
        self.held = False     # published and kept in the transport's _inflight until acknowledged

    def test(self) -> bool:
        t = self.t
        with t._lock:
            if t._send_done(self):   # acknowledged already: no progress pass needed
                return True
        t.progress()
        with t._lock:
            return t._send_done(self)

    def wait(self, timeout):
        return wait_polling(self.test, timeout, lambda: _gone(self))

    def buffered(self) -> bool:
        # Published into the pool (or empty): the caller's array was copied when it was, and
        # the transport holds the request (_inflight) until the receiver acknowledges.
        if self.num >= 0 and self.mpi is None and self.pipe is None:
            if self.pooled or self.seg == EMPTY:
                return True
            # Read in place by its receiver (CMA, a data segment): only the receiver's
            # acknowledgement completes it, which no progress pass of this rank hastens (at 4 MiB
            # the pass cost 5-13 us on the path of every send, with caches cold from the copy).
            if not self.t._out[self.peer].acked(self.slot, self.num):
                return False
        return self.test()

    def rendezvous(self) -> bool:
        return self.seg in (CMA, BLOCK, PIPE)

    def passive(self) -> bool:
        # Published, and read by the receiver from the pool or by CMA: only its acknowledgement
        # is left. A pipe the sender still has to fill is not: the progress thread fills it while
        # the caller does something else.
        return (self.num >= 0 and self.mpi is None and (self.pooled or self.seg in (EMPTY, CMA, BLOCK))
                and (self.pipe is None or self not in self.t._pipes))


class _Recv(Request):
    __slots__ = ("t", "peer", "tag", "ord", "buf", "reduce", "own", "slot", "seg", "off", "nbytes",
                 "mpi", "tmp", "busy", "done", "error", "pipe", "extra")

    def __init__(self, t, peer, tag, ordinal, buf, reduce, own):
        self.t, self.peer, self.tag, self.ord = t, peer, tag, ordinal
        self.buf, self.reduce, self.own = buf, reduce, own
        self.slot = -1
        self.seg = self.off = self.nbytes = self.extra = 0
        self.mpi = self.tmp = None
        self.busy = self.done = False
        self.error: Optional[BaseException] = None
        self.pipe = None   # a message through a ring of cells, being emptied: its descriptor

    def test(self) -> bool:
        if not self.done:
            t = self.t
            t.progress()
            if not self.done:
                t._consume(self)
        if self.error is not None:
            raise self.error
        return self.done

    def wait(self, timeout):
        return wait_polling(self.test, timeout, lambda: _gone(self))

    def cancel(self) -> None:
        """Withdraw a copy-receive whose message has not been claimed (comm.close())."""
        t = self.t
        with t._lock:
            if not self.done and self.slot < 0 and not self.busy:
                t._plain[self.peer].pop((self.tag, self.ord), None)
                self.done = True


class Messages:
    """ShmTransport's sends, receives and probes (the module docstring)."""

    def stages(self, nbytes: int) -> bool:
        """Whether ``stage`` marks arrays of a collective as large as ``nbytes`` to be read by CMA."""
        return bool(self._direct and nbytes and nbytes >= self.cma_min_bytes)

    def reads_in_place(self, nbytes: int) -> bool:
        """Whether a user's send of ``nbytes`` (``isend_p2p``) is read out of the sender's array
        (CMA) or goes through a pipe, rather than through the staging pool."""
        return bool((self._direct or self._pipe_ok) and nbytes and nbytes >= self.cma_p2p_min_bytes)

    @contextlib.contextmanager
    def stage(self, arrays: tuple):
        """Bracket one collective over ``arrays`` (the flat arrays it sends from and receives
        into). Receives land in them directly. If the collective is at least ``cma_min_bytes``
        and the node reads by CMA, peers read what this rank sends from them straight out of
        this process; other sends from private memory go through the staging pool."""
        largest = 0
        for a in arrays:
            self._check_array(a)
            largest = max(largest, a.nbytes)
        if not self.stages(largest):
            yield
            return
        ranges = [(address(a), address(a) + a.nbytes) for a in arrays if a.nbytes]
        with self._lock:
            self._staged.extend(ranges)
        try:
            yield
        finally:
            with self._lock:
                for r in ranges:
                    self._staged.remove(r)

    def _piped_send(self, req: _Send) -> bool:
        """Give ``req`` a pipe if its pool share has room for a ring (lock held); else it goes the
        way it would have without one."""
        share = self.pool.shares[req.peer]
        off = None if share.waiting else share.take(pipe.RING_BYTES, req.tag)
        if off is None:
            return False
        ring = self._pool_seg.data[off:off + pipe.RING_BYTES]
        pipe.reset(ring)
        req.seg, req.off, req.pooled = PIPE, off, True   # pooled: the ring is given back when acknowledged
        req.pipe = pipe.descriptor(ring, req.buf)
        return True

    # ---- point to point ------------------------------------------------------------------------
    def _node_rank(self, peer: int) -> int:
        try:
            return self.local[peer]
        except KeyError:
            raise CommError(f"shm transport on rank {self.rank}: rank {peer} is not on this node "
                            f"(node ranks {self.ranks})") from None

    def isend(self, buf, peer, tag, in_place: bool = False):
        p = self._node_rank(peer)
        if not 0 <= tag < TAG_LIMIT:
            raise UsageError(f'isend got unexpected value for argument "tag" (expected 0 <= tag < 2**62, '
                             f'got {tag})')
        with self._lock:
            self._check_usable()
            ordinal = self._out_ord[p][tag]
            self._out_ord[p][tag] = ordinal + 1
            req = _Send(self, p, tag, ordinal, buf)
            self._route(req, in_place)
            self._flush(p)
        return req

    def isend_p2p(self, buf, peer, tag):
        # Routed by this flag, not by a staged range: entering and leaving a stage (the ranges,
        # the lock twice, two context managers) was a third of a 4 MiB send's post.
        return self.isend(buf, peer, tag, in_place=True)

    def irecv(self, buf, peer, tag):
        return self._post(buf, peer, tag, None, None)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch, own=None):
        return self._post(buf, peer, tag, reduce, own)

    def _post(self, buf, peer, tag, reduce, own):
        p = self._node_rank(peer)
        with self._lock:
            self._check_usable()
            ordinal = self._in_ord[p][tag]
            self._in_ord[p][tag] = ordinal + 1
            req = _Recv(self, p, tag, ordinal, buf, reduce, own)
            if reduce is not None:
                return req   # reduced in its own wait: in the order the caller waits, never at post
            self._plain[p][(tag, ordinal)] = req
        self._consume(req)
        return req

    def _route(self, req: _Send, in_place: bool = False) -> None:
        """Decide where the peer reads ``req``'s payload (``in_place``: a user's send, which may
        be read out of its array); queue it for a slot unless it waits for pool room (lock held)."""
        buf = req.buf
        nbytes = buf.nbytes
        if not nbytes:
            req.seg = EMPTY
        else:
            addr, contiguous = address(buf), buf.flags.c_contiguous   # peers read one range
            in_place = in_place and contiguous and self.reads_in_place(nbytes)
            found = self._locate(addr, nbytes) if contiguous else None
            if found is not None:
                req.seg, req.off = found
            elif in_place and self._pipe_ok and self._piped_send(req):
                pass
            elif in_place and self._direct:
                # In a ringcomm.empty block, the receiver maps the block and copies: no page
                # pinning (cma.py), which cost a 64 MiB send on blocks 1.5-1.75x MPI's.
                req.extra = self._blocks.send_word(addr, nbytes)
                req.seg, req.off = (BLOCK if req.extra else CMA), addr
            elif self._staged and contiguous and _covers(self._staged, addr, nbytes):
                req.seg, req.off = CMA, addr
            else:
                if self.pool is not None:
                    self._reclaim(req.peer)   # space of sends acknowledged since (comm.send leaves them early)
                outcome = self.pool.admit(req.peer, req) if self.pool is not None else staging.OVERFLOW
                if outcome == staging.WAIT:
                    self._fire("pool_full")
                    return
                self._pooled(req, outcome)
        self._out[req.peer].queue.append(req)

    def _pooled(self, req: _Send, outcome: str) -> None:
        if outcome == staging.PLACED:
            req.seg, req.pooled = self._pool_seg.seg_id, True
        else:
            req.seg = VIA_MPI

    def _flush(self, p: int) -> None:
        """Publish the sends ready for ``p``, in order, as slots free up (lock held)."""
        out = self._out[p]
        while out.queue and out.slot_free():
            req = out.queue.popleft()
            if req.seg == VIA_MPI:   # now, in PUB order: see the module docstring
                self._send_outside(req)
            self._before_publish()
            req.slot, req.num = out.publish(req.tag, req.ord, req.seg, req.off, req.buf.nbytes, req.extra)
            if req.pipe is not None and not pipe.push(req.pipe):
                self._pipes.append(req)   # the rest goes in as the receiver empties cells
            if req.pooled or req.seg in (CMA, BLOCK):
                # Held until acknowledged: its pool space, or the array the receiver reads by
                # CMA, which must outlive a request its caller dropped (a communicator closed
                # with the send unmatched) or the receiver could read reused memory.
                req.held = True
                self._inflight[p].append(req)
            if self._fault is not None and req.seg != EMPTY:
                self._sent += 1
                if self._sent == 3:
                    self._fire("ring")
                if req.seg == CMA:
                    self._fire("cma")

    def _send_done(self, req: _Send) -> bool:
        if req.num < 0:
            return False
        if req.mpi is not None and not req.mpi.Test():
            return False
        if not self._out[req.peer].acked(req.slot, req.num):
            return False
        if req.held:
            self._release(req)
        return True

    def _reclaim(self, p: int) -> None:
        """Let go of what the sends to ``p`` that ``p`` acknowledged hold (lock held)."""
        inflight = self._inflight[p]
        while inflight and self._out[p].acked(inflight[0].slot, inflight[0].num):
            self._release(inflight[0])

    def _release(self, req: _Send) -> None:
        # Every completed send passes here: try/except, not contextlib.suppress (three calls and
        # an object per use), for a request its list may no longer hold.
        req.held = False
        if req.pipe is not None:   # acknowledged: its receiver has it all, or refused it
            pipe.retire(req.pipe)
            try:
                self._pipes.remove(req)
            except ValueError:
                pass
        if req.pooled:
            req.pooled = False
            self.pool.release(req.peer, req.off)
        try:
            self._inflight[req.peer].remove(req)
        except ValueError:
            pass

    def _discover(self, p: int) -> None:
        """Index ``p``'s new messages; post the MPI receive of each payload over MPI, in PUB
        order (lock held)."""
        inc, dead = self._in[p], self._dead_contexts
        for slot in inc.discover():
            seg, _, nbytes = inc.fields(slot)
            if seg == VIA_MPI:
                tmp = np.empty(nbytes, np.uint8)
                self._mpi_in[p][inc.key(slot)] = (self.comm.Irecv(tmp, source=p, tag=self.payload_tag), tmp)
                self.ledger.received[p] += 1   # posted: the message can match nothing else
            if dead:
                key = inc.key(slot)
                if key[0] >> CONTEXT_SHIFT in dead:
                    self._drop(p, key)

    def drop_context(self, context: int) -> None:
        """A sub-communicator's view was closed: acknowledge, unread, every message of its context
        that arrived and was never received (a receive refused it, or none was posted) and every
        one that arrives later. Each holds a slot of its sender's ring to this rank, and a ring has
        SLOTS of them: that many messages later, of any communicator, that pair's sends waited for
        the slot until their deadline."""
        with self._lock:
            self._members_of.pop(context, None)
            if self._closed:
                return
            self._dead_contexts.add(context)
            for p in self.others:
                self._discover(p)   # what arrives from now on is dropped as it is discovered
                arrived = self._in[p].arrived
                for key in [k for k in arrived if k[0] >> CONTEXT_SHIFT == context]:
                    self._drop(p, key)

    def revive_context(self, context: int, members: Optional[list] = None) -> None:
        """A new view takes ``context``: its messages are received again. ``members``: its ranks
        (job ranks, in its order), by which a stalled wait of its messages names a peer."""
        with self._lock:
            self._dead_contexts.discard(context)
            if members is not None:
                self._members_of[context] = members

    def _as_rank(self, tag: int, p: int) -> Optional[int]:
        """Node rank ``p``'s rank in the sub-communicator whose message carries ``tag`` (its
        context above bit 32), or None in the job's own communicator (aborted_reason's ``as_rank``)."""
        members = self._members_of.get(tag >> CONTEXT_SHIFT)
        job_rank = self.ranks[p]
        return members.index(job_rank) if members is not None and job_rank in members else None

    def _drop(self, p: int, key: tuple) -> None:
        """Acknowledge ``p``'s message ``key`` unread (lock held)."""
        inc = self._in[p]
        slot = inc.arrived.pop(key)
        mpi = self._mpi_in[p].pop(key, None)
        if mpi is not None:   # its MPI receive must still finish, or the sender's never does
            self._orphans.append(mpi[0])
        inc.ack(slot)   # a pipe's sender takes this as a refusal (_release)

    def progress(self) -> None:
        """Place sends waiting for pool room, publish what waits for a slot, return pool space
        of acknowledged sends, discover messages, and complete plain receives that can be."""
        ready = None
        with self._lock:
            if self._closed:
                return
            pool = self.pool
            for req in list(self._pipes):
                if pipe.push(req.pipe):
                    self._pipes.remove(req)
            for p in self.others:
                if pool is not None and pool.shares[p].waiting:
                    for req, outcome in pool.retry(p):
                        self._pooled(req, outcome)
                        self._out[p].queue.append(req)
                if self._out[p].queue:
                    self._flush(p)
                self._reclaim(p)
                self._discover(p)
                plain = self._plain[p]
                if plain:
                    arrived = self._in[p].arrived
                    for key, req in plain.items():   # arrived, or claimed and waiting for MPI
                        if not req.busy and (key in arrived or req.slot >= 0):
                            ready = ready or []
                            ready.append(req)
            if self._orphans:
                self._orphans = [r for r in self._orphans if not r.Test()]
        if ready:
            for req in ready:
                self._consume(req)

    def _consume(self, req: _Recv) -> None:
        """Claim ``req``'s message if it has arrived and consume it (copy or reduce), outside the
        lock; at most once, by one thread."""
        with self._lock:
            if req.done or req.busy or self._closed:
                return
            if req.slot < 0 and not self._claim(req):
                return
            if req.seg == VIA_MPI and not req.mpi.Test():
                return
            req.busy = True
        complete = True
        try:
            complete = self._move(req)
        except CommError as err:   # raised when the receive is waited, like a mismatch
            req.error = err
        finally:
            with self._lock:
                req.busy = False
                if complete:
                    self._finish(req)

    def _claim(self, req: _Recv) -> bool:
        """Take ``req``'s message from the index (lock held); False if it has not arrived. A
        message of another size is refused: MismatchError when waited, nothing is written."""
        inc, key = self._in[req.peer], (req.tag, req.ord)
        slot = inc.arrived.pop(key, None)
        if slot is None:
            self._discover(req.peer)
            slot = inc.arrived.pop(key, None)
            if slot is None:
                return False
        req.slot = slot
        req.seg, req.off, req.nbytes = inc.fields(slot)
        if req.seg == BLOCK:
            req.extra = inc.extra(slot)
        if req.seg == VIA_MPI:
            req.mpi, req.tmp = self._mpi_in[req.peer].pop(key)
        if req.nbytes != req.buf.nbytes:
            # No tag in the words: it is the transport's (dtype and context bits included); the
            # caller's description names the call, and a user's send/recv tag with it.
            req.error = MismatchError(f"rank {self.rank}: a message from rank {self.ranks[req.peer]} "
                                      f"has {req.nbytes} bytes, the receive expected {req.buf.nbytes} "
                                      f"(do the ranks agree on the count?)")
            if req.mpi is not None:   # its MPI receive must still finish, or the sender's never does
                self._orphans.append(req.mpi)
            self._finish(req)
            return False
        return True

    def _finish(self, req: _Recv) -> None:
        self._in[req.peer].ack(req.slot)
        req.done = True
        if req.reduce is None:
            self._plain[req.peer].pop((req.tag, req.ord), None)

    def _move(self, req: _Recv) -> bool:
        """Copy or reduce ``req``'s payload into its buffer (no lock held); False while a pipe's
        message is not all in (its next wait goes on)."""
        seg, buf = req.seg, req.buf
        if seg == EMPTY:
            return True
        if seg == BLOCK:
            there = self._blocks.sent(req.peer, req.extra, req.nbytes)
            if there is not None and req.reduce is None and buf.flags.c_contiguous:
                self._copy(buf.reshape(-1).view(np.uint8), there)
                return True
            seg = CMA   # not mapped here (another user's process, hidepid): read it
        if seg == CMA:
            if req.reduce is None:
                self._memory.copy(req.peer, req.off, buf)
            else:
                self._memory.reduce(req.peer, req.off, buf,
                                    lambda i, part: _reduce(req, buf[i:i + part.size], part, i))
            return True
        if seg == PIPE:
            return self._pull(req)
        if seg == VIA_MPI:
            src = self._from_host(req.tmp)
        else:
            view = self._peers.get((req.peer, seg))
            if view is None:
                raise CommError(f"shm transport on rank {self.rank}: rank {self.ranks[req.peer]} "
                                f"sent from its segment {seg}, which this rank has not mapped")
            src = view[req.off:req.off + req.nbytes]
        src = src.view(buf.dtype).reshape(buf.shape)
        if req.reduce is None:
            self._copy(buf, src)
        else:
            _reduce(req, buf, src, 0)
        self._after_consume()
        return True

    def _pull(self, req: _Recv) -> bool:
        """Empty a pipe's cells into ``req``'s buffer for as long as they keep coming (pipe.py).
        Only comm.send pipes, so this is a plain receive (a reduction never gets here)."""
        if req.pipe is None:
            view = self._peers.get((req.peer, self._pool_seg.seg_id))
            if view is None or req.reduce is not None:
                raise CommError(f"shm transport on rank {self.rank}: rank {self.ranks[req.peer]} sent "
                                f"through a pipe this receive cannot read")
            dst = req.buf if req.buf.flags.c_contiguous else np.empty(req.buf.shape, req.buf.dtype)
            req.tmp = (view[req.off:req.off + pipe.RING_BYTES], dst)
            req.pipe = pipe.descriptor(req.tmp[0], dst)
        ring, dst = req.tmp
        if not pipe.pull(req.pipe, ring, dst, tuple(r.pipe for r in self._pipes), self._pipe_spin):
            return False
        if dst is not req.buf:
            req.buf[...] = dst
        return True

    def probe(self, source, tag=None, context=0, skip=0):
        """The first published message nobody has posted a copy-receive for (Transport.probe);
        with no ``tag``, only messages of communicator ``context`` (tag >> 32), none with a bit
        of ``skip``."""
        if source is None:
            peers = self.others
        elif source in self.local and self.local[source] != self.me:
            peers = [self.local[source]]
        else:
            return None
        with self._lock:
            if self._closed:
                return None
            for p in peers:
                self._discover(p)
                inc, plain = self._in[p], self._plain[p]
                for (t, o), slot in inc.arrived.items():
                    if (t == tag if tag is not None else t >> 32 == context and not t & skip) and (t, o) not in plain:
                        return self.ranks[p], t, inc.fields(slot)[2]
        return None


def _covers(ranges: list, addr: int, nbytes: int) -> bool:
    """Whether one of the [start, end) ``ranges`` (staged arrays) holds ``nbytes`` at ``addr``."""
    return any(start <= addr and addr + nbytes <= end for start, end in ranges)


def _reduce(req: _Recv, dst, msg, start: int) -> None:
    """dst = dst OP msg, or own OP msg when the receive has an own operand; ``dst`` starts at
    element ``start`` of the receive buffer (reductions out of CMA reads go in chunks)."""
    if req.own is None:
        req.reduce(dst, msg)
    else:
        req.reduce(dst, msg, req.own[start:start + dst.size])


def _bytes(buf):
    return buf.reshape(-1).view(np.uint8)
