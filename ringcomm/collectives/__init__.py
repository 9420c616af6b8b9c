"""Every collective ringcomm offers, one object each (see base.py for what an object owns).

    from ringcomm.collectives import get
    get("all_reduce").bus_factor(8)       # 1.75
"""
from __future__ import annotations

from ..core.envelope import register_collective
from .all_gather import AllGather
from .all_reduce import AllReduce
from .all_to_all import AllToAll
from .barrier import Barrier
from .base import Call, Collective
from .broadcast import Broadcast
from .gather import Gather
from .reduce import Reduce
from .reduce_scatter import ReduceScatter
from .scatter import Scatter
from .send_recv import Recv, Send

ALL_REDUCE, BROADCAST, REDUCE = AllReduce(), Broadcast(), Reduce()
ALL_GATHER, REDUCE_SCATTER, BARRIER = AllGather(), ReduceScatter(), Barrier()
ALL_TO_ALL, GATHER, SCATTER = AllToAll(), Gather(), Scatter()
SEND, RECV = Send(), Recv()

# Collectives with algorithms (the selector chooses among them); send and recv have none.
BY_NAME = {c.name: c for c in (ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, BARRIER,
                               ALL_TO_ALL, GATHER, SCATTER)}
NAMES = tuple(BY_NAME)
POINT_TO_POINT = {c.name: c for c in (SEND, RECV)}

for _c in (*BY_NAME.values(), *POINT_TO_POINT.values()):
    register_collective(_c.code, _c.name)


def get(name: str) -> Collective:
    return BY_NAME.get(name) or POINT_TO_POINT[name]


__all__ = ["Call", "Collective", "NAMES", "BY_NAME", "POINT_TO_POINT", "get", "ALL_REDUCE", "BROADCAST",
           "REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BARRIER", "ALL_TO_ALL", "GATHER", "SCATTER",
           "SEND", "RECV"]
