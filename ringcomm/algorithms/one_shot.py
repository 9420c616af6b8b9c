"""One-shot all-reduce through a shared window: every rank reads every input and reduces it.

Each round, every rank copies a piece of its vector into its window slot and posts the round;
once all have posted, each rank computes x0 OP x1 OP ... OP x(n-1) for that piece straight out of
the slots, always in rank order. Every rank runs the same operations on the same operands in the
same order, so all end with the same bits (unlike "add the others to mine", whose order, and so
whose rounding, would depend on the rank). Vectors longer than the window go in pieces, one
round each.

Steps: one synchronisation per piece of C bytes (C = window capacity), no messages.
Bytes per rank: S written, (n-1) S read. Cost: ceil(S/C) alpha_w + S beta_w + (n-1) S (beta_w + gamma)
on the window link (Network.window); where the round is compiled (core/_round.c, Network.round),
ceil(S/C) alpha_r + n S beta_r: it reduces as it reads (beta_r from cache while the vectors fit
it: Network.round_beta). Needs ranks that share memory: the transport must offer a window (shm on
one node, threads). It wins for small vectors, where one flag store and n-1 flag
loads replace log2(n) message round trips through the executor; it loses once the (n-1) S of
reads outweigh those round trips, which the cost model finds.
"""
from __future__ import annotations

import numpy as np

from ..selection.cost import Network
from ._rounds import pieces_of, settle, sync
from .base import WindowAlgorithm


class OneShot(WindowAlgorithm):
    name = "one_shot"
    collective = "all_reduce"

    def seconds(self, nbytes, net: Network) -> float:
        window = net.window
        pieces = net.window_rounds(nbytes)
        if net.round is not None:   # compiled: S written, (n-1) S read and reduced as they are read
            return pieces * net.round.alpha + net.size * nbytes * net.round_beta(nbytes)
        return pieces * window.alpha + nbytes * window.beta + (net.size - 1) * nbytes * (window.beta + net.gamma)

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        """All-reduce ``src`` (non-empty) into ``dst`` (``src`` itself for an in-place call)."""
        core, code = window.core, reducer.code
        if core is None or code < 0 or type(src) is not np.ndarray:
            core = None
        elif src.nbytes <= window.capacity:   # the small call, first and shortest
            compiled_round(window, core, src, dst, code, stamp, word, trouble, 0, 1)
            return
        n, per = window.size, window.capacity // src.itemsize
        pieces = pieces_of(src.size, per)
        reduce, combine = reducer.reduce, reducer.combine
        for i in range(pieces):
            piece = src if pieces == 1 else src[i * per:(i + 1) * per]
            out = dst if pieces == 1 else dst[i * per:(i + 1) * per]
            if core is not None:
                compiled_round(window, core, piece, out, code, stamp, word, trouble, i, pieces)
                continue
            slots = window.views(window.round + 1, piece.dtype, piece.size)
            slots[window.rank][...] = piece
            sync(window, stamp, word, trouble, i, pieces)
            combine(out, slots[0], slots[1])   # rank order: x0 OP x1 OP x2 ...
            for r in range(2, n):
                reduce(out, slots[r])


def compiled_round(window, core, piece, out, code, stamp, word, trouble, i, pieces) -> None:
    """The same round, compiled (core/_round.c): it returns with the result, or with a late or
    odd peer, which the Python wait explains or raises for before the slots are reduced."""
    k = window.round + 1
    late = core.all_reduce(k, piece, out, code, stamp, word, window.spin)
    window.round = k
    if late:
        settle(window, k, stamp, word, trouble, i, pieces)
        core.reduce(k, out, code)
