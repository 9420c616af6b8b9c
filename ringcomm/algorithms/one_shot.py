"""One-shot all-reduce through a shared window: every rank reads every input and reduces it.

Each round, every rank copies a piece of its vector into its window slot and posts the round;
once all have posted, each rank computes x0 OP x1 OP ... OP x(n-1) for that piece straight out of
the slots, always in rank order. Every rank runs the same operations on the same operands in the
same order, so all end with the same bits (unlike "add the others to mine", whose order, and so
whose rounding, would depend on the rank). Vectors longer than the window go in pieces, one
round each.

Steps: one synchronisation per piece of C bytes (C = window capacity), no messages.
Bytes per rank: S written, (n-1) S read. Cost: ceil(S/C) alpha_w + S beta_w + (n-1) S (beta_w + gamma)
on the window link (Network.window). Needs ranks that share memory: the transport must offer a
window (shm on one node, threads). It wins for small vectors, where one flag store and n-1 flag
loads replace log2(n) message round trips through the executor; it loses once the (n-1) S of
reads outweigh those round trips, which the cost model finds.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..selection.cost import Network
from .base import WindowAlgorithm

STALL_CHECK = 0.05   # seconds a round may wait before the stall is diagnosed (and every so often after)


class OneShot(WindowAlgorithm):
    name = "one_shot"
    collective = "all_reduce"

    def cost(self, nbytes, net: Network) -> float:
        window, capacity = net.window, net.window_bytes
        if window is None or capacity <= 0 or net.nodes > 1:
            return math.inf
        size = net.size
        if size == 1 or nbytes == 0:
            return 0.0
        pieces = math.ceil(nbytes / capacity)
        return pieces * window.alpha + nbytes * window.beta + (size - 1) * nbytes * (window.beta + net.gamma)

    def run(self, window, src: np.ndarray, dst: np.ndarray, reduce, combine, stamp: int,
            trouble: Callable) -> None:
        """All-reduce ``src`` (non-empty, on 2 or more ranks) into ``dst`` (``src`` itself for an
        in-place call). ``reduce(dst, src)`` and ``combine(out, a, b)`` are the op's kernels
        (ops.py); ``trouble()`` returns the guard that explains a stalled round
        (``stalled(peer, piece, pieces)``, raising at the deadline) or a peer in another
        collective (``mismatch(peer, stamp)``, which raises)."""
        n, per = window.size, window.capacity // src.itemsize
        pieces = -(-src.size // per)
        for i in range(pieces):
            piece = src if pieces == 1 else src[i * per:(i + 1) * per]
            k, slots = window.post(piece, stamp)
            if window.lagging(k) is not None and window.wait(k, STALL_CHECK) is not None:
                guard = trouble()   # slow path: from here on, explain the stall or time out
                peer = window.lagging(k)
                while peer is not None:
                    guard.stalled(peer, i, pieces)
                    peer = window.wait(k, STALL_CHECK)
            odd = window.odd_stamp(k, stamp)
            if odd is not None:
                trouble().mismatch(odd, window.stamp(odd, k))
            out = dst if pieces == 1 else dst[i * per:(i + 1) * per]
            combine(out, slots[0], slots[1])   # rank order: x0 OP x1 OP x2 ...
            for r in range(2, n):
                reduce(out, slots[r])
