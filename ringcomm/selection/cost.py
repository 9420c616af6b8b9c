"""The alpha-beta-gamma cost model every algorithm states its time in.

alpha: seconds per message (latency plus per-message software overhead)
beta:  seconds per byte moved over the link
gamma: seconds per byte reduced (a local read-modify-write)

A job runs over two kinds of link: the one between ranks of one node (shared memory, or MPI's
own shared-memory channel) and the one between nodes. ``Network`` bundles both with the shape of
the job (ranks on each node). Flat algorithms (ring, tree, ...) take it as if it were one Link:
their steps are synchronous across ranks, so every step runs at the pace of its slowest link,
which is the inter-node one as soon as there are two nodes. Topology-aware algorithms
(hierarchical) read ``intra``, ``inter`` and ``local_sizes`` and price each phase on its own link.
Where every rank shares memory with every other, the transport may also offer a window (a
mailbox per rank that all read in place); ``window`` prices one round of it for the one-shot
algorithms, which are impossible (infinitely expensive) without one. Where ranks can also read
each other's memory (CMA), ``direct`` prices one such read: alpha per read, beta per byte. Where
the window's all-reduce round is compiled for the call's dtype, ``round`` prices that round;
where the direct all-to-all's rounds and reads are compiled too, ``direct_round`` prices them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Link:
    alpha: float
    beta: float
    gamma: float
    call: float = 0.0   # seconds a schedule algorithm pays once per call on this link (selector.predict)

    def with_gamma(self, gamma: float) -> "Link":
        return replace(self, gamma=gamma)


# Defaults measured on a 2-core x86 box over MPICH's shared-memory channel from Python
# (per-message cost includes the Python executor's overhead). `ringcomm.tune` replaces them.
DEFAULT_LINK = Link(alpha=15e-6, beta=1 / 3.0e9, gamma=1 / 5.0e9)


@dataclass(frozen=True)
class Network:
    """The links a collective runs over and how its ranks sit on nodes (hashable: costs cache)."""
    intra: Link
    inter: Link
    local_sizes: tuple   # ranks on each node, e.g. (8, 8) for 2 nodes of 8
    nics: int = 0        # network cards per node that ranks share; 0: each rank has its own path
    window: Optional[Link] = None   # a shared window among all ranks (one node), if the transport has one
    window_bytes: int = 0           # its capacity per rank and round
    direct: Optional[Link] = None   # reading peers' memory in place through that window (CMA), if possible
    round: Optional[Link] = None    # the compiled all-reduce round on that window (core/_round.c), if built;
                                    # it reduces as it reads, so its beta carries the reduction (gamma 0)
    crowding: float = 1.0           # ranks per core on the busiest host (> 1: oversubscribed); see crowded()
    window_cached: Optional[Link] = None   # the window while the collective's buffers fit the cache
    cache_bytes: int = 0                   # the node's last-level cache (0: unknown); see window_beta()
    fast_reads: bool = False               # ``direct`` is the fast-read hosts' link (Tuning.direct_name)
    direct_round: Optional[Link] = None    # the compiled direct all-to-all (core/_round.c), where it runs
    round_cached: Optional[Link] = None    # the compiled all-reduce round while its vectors fit the cache

    @property
    def size(self) -> int:
        return sum(self.local_sizes)

    def window_rounds(self, nbytes: float) -> int:
        """Rounds of the shared window that carry ``nbytes`` per rank, ``window_bytes`` a round."""
        return math.ceil(nbytes / self.window_bytes)

    def window_beta(self, nbytes: float) -> float:
        """Seconds per byte a one-shot algorithm copies through the window, for ``nbytes`` per
        rank. While every rank's vector fits in half the node's last-level cache (the rest holds
        the window's slots and whatever else the ranks touch), the copies run from cache, several
        times faster than from memory; a direct read by CMA does not (it pins every page it reads,
        whatever the cache holds), so without this the model sent in-cache broadcasts and
        reduce-scatters to the direct algorithms, 1.1-1.8x slower there; all_to_all alike
        (direct 1.1-1.8x slower at 4-8 MiB), except where reads are fast (``fast_reads``:
        one_shot_all_to_all.py prices itself plainly there). all_gather keeps the plain price:
        its direct algorithm, which writes each part once, tied or beat one_shot in cache
        (docs/selection.md)."""
        if self.window_cached is not None and self.in_cache(nbytes):
            return self.window_cached.beta
        return self.window.beta

    def round_beta(self, nbytes: float) -> float:
        """Seconds per byte of the compiled all-reduce round (one_shot) for ``nbytes`` per rank:
        from cache while every rank's vector fits half of it, like ``window_beta``. Priced from
        memory throughout, the model sent 4-8 MiB all-reduces of ordinary arrays to direct, whose
        CMA reads pin every page: 1.1-1.6x slower than one_shot there and above MPI_Allreduce at
        4 MiB (docs/selection.md). Not on hosts whose reads are fast (``round_cached`` is None
        there: direct beat one_shot on them from 1 MiB), nor where a tuning file measured the
        round (Tuning.guessed)."""
        if self.round_cached is not None and self.in_cache(nbytes):
            return self.round_cached.beta
        return self.round.beta

    def in_cache(self, nbytes: float) -> bool:
        """Whether every rank's ``nbytes`` together fit in half the node's last-level cache."""
        return self.size * nbytes <= self.cache_bytes / 2

    @property
    def nodes(self) -> int:
        return len(self.local_sizes)

    @property
    def link(self) -> Link:
        """The one link a flat algorithm sees: its slowest. A flat algorithm does not coordinate
        who crosses between nodes when, so where ranks share network cards it is priced as if all
        of a node's ranks crossed at once (exact for recursive doubling and Rabenseifner's long
        rounds, pessimistic for a ring whose neighbours sit on the same node)."""
        if self.nodes == 1:
            return self.intra
        if self.nics:
            share = max(1.0, max(self.local_sizes) / self.nics)
            return replace(self.inter, beta=self.inter.beta * share)
        return self.inter

    # A Network stands in for a Link wherever a flat algorithm's cost() expects one.
    @property
    def alpha(self) -> float:
        return self.link.alpha

    @property
    def beta(self) -> float:
        return self.link.beta

    @property
    def gamma(self) -> float:
        return self.link.gamma

    @property
    def call(self) -> float:
        return self.link.call


# What one synchronising step costs on top of alpha when ranks outnumber cores: the waiter polls
# its short budget (transport/polling.py: 50 us), sleeps, and the peer it waits for gets the core
# (a wake-up ~80 us on this kind of machine). Fitted to 4 ranks on 2 cores (docs/selection.md).
HANDOFF = 100e-6


def crowded(link: Optional[Link], ranks_per_core: float) -> Optional[Link]:
    """``link`` as ranks see it when ``ranks_per_core`` > 1 of them share each core: every byte
    copied or reduced gets that share of a core, and every step that waits for a peer pays a
    hand-off (the peer must be scheduled). So oversubscription favours few steps (one_shot, recursive
    doubling) well past the sizes where a dedicated core favours bandwidth (ring, Rabenseifner)."""
    if link is None or ranks_per_core <= 1:
        return link
    return Link(link.alpha + HANDOFF, link.beta * ranks_per_core, link.gamma * ranks_per_core,
                link.call * ranks_per_core)


def crowded_window(link: Optional[Link], ranks_per_core: float) -> Optional[Link]:
    """The shared window as oversubscribed ranks see it: every round still waits for every rank
    to be scheduled (a hand-off), but its per-byte work is not slowed by the share of a core the
    way a message's is (4 ranks on 2 cores, docs/perf/r2_4ranks_*.json: pricing it like a message
    link ran recursive doubling at 256 KiB, 1.5x slower than one_shot)."""
    if link is None or ranks_per_core <= 1:
        return link
    return Link(link.alpha + HANDOFF, link.beta, link.gamma, link.call)


def crowded_round(link: Optional[Link], ranks_per_core: float) -> Optional[Link]:
    """The compiled all-reduce round as oversubscribed ranks see it: crowded like a message link
    (its copies and reductions are CPU work on a share of a core), but a round waits for every
    rank of the node, not for one peer, so it pays a hand-off per rank sharing a core. With one
    hand-off, 4 ranks on 2 cores ran one_shot at 1 MiB, measured 1.2-1.8x slower than direct in
    four launches (two rounds of 512 KiB: 1.08-1.90 ms against 0.90-1.29; docs/selection.md)."""
    crowd = crowded(link, ranks_per_core)
    if crowd is None or ranks_per_core <= 1:
        return crowd
    return Link(crowd.alpha + HANDOFF * (ranks_per_core - 1), crowd.beta, crowd.gamma, crowd.call)


def crowded_reads(link: Optional[Link], ranks_per_core: float) -> Optional[Link]:
    """Direct reads of peers' memory as oversubscribed ranks see them: all CPU work on a share of
    a core (a system call and a copy), but no hand-off: a read waits for no peer (the window
    rounds around it do, and pay theirs in ``crowded_window``)."""
    if link is None or ranks_per_core <= 1:
        return link
    c = ranks_per_core
    return Link(link.alpha * c, link.beta * c, link.gamma * c, link.call * c)


def as_network(link, size: int) -> Network:
    """A plain Link means one node of ``size`` ranks on that link."""
    if isinstance(link, Network):
        return link
    return Network(link, link, (size,))


def uniform(intra: Link, inter: Link, ranks_per_node: int, size: int, nics: int = 0) -> Network:
    """``size`` ranks packed ``ranks_per_node`` to a node (the last node may hold fewer)."""
    full, rest = divmod(size, ranks_per_node)
    return Network(intra, inter, (ranks_per_node,) * full + ((rest,) if rest else ()), nics)


def log2_ceil(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def flat(link: Link, size: int) -> Network:
    """``size`` ranks on one node joined by ``link``: how one phase of a composite algorithm (a
    ring inside a node, a ring across nodes) is priced on its own link."""
    return Network(link, link, (size,))
