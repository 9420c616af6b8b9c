"""One-shot barrier through a shared window: every rank posts a round and waits for all.

One flag store and n-1 flag loads, no messages: the round's wait is the barrier. Cost: alpha_w.
"""
from __future__ import annotations

from ..selection.cost import Network
from ._rounds import sync
from .base import WindowAlgorithm


class OneShotBarrier(WindowAlgorithm):
    name = "one_shot"
    collective = "barrier"

    def cost(self, nbytes, net: Network) -> float:
        return super().cost(1, net)   # a barrier moves no bytes but still takes its round

    def seconds(self, nbytes, net: Network) -> float:
        return net.window.alpha

    def has_work(self, shape) -> bool:
        return shape.size > 1

    def run(self, window, src, dst, shape, reducer, stamp, word, trouble) -> None:
        sync(window, stamp, word, trouble, 0, 1)
