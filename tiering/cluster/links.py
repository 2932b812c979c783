"""What the placement daemon is given to fetch copies from the other nodes of
a job (the peer tier, NOTE [peer protocol] and "Integration" in
docs/design.md).

The job's set-up (tier-run, or the node service in launch form 2) makes one
PeerLinks per node when the job spans several nodes: it starts the
PeerServer, meets the other nodes in the job directory in a background
thread and, once they have met, fills ``clients`` (one PeerClient per other
node, by node rank), sets ``ready`` and computes the homes from every
node's published budget (``plans``, NOTE [home nodes]).  Until then, and for
good when the rendezvous fails, there are no homes: the daemon plans as a
single node and reads the PFS; nothing ever waits for the nodes to meet.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..profile.model import DEFAULT_PFS_MB_S
from .peer import Counters, Network, PeerClient

log = logging.getLogger("tiering")


class Homes(Protocol):
    """Which other node holds a file, and the files this node keeps for the
    others (clairvoyant/nodes.py, NOTE [node-aware plan], NOTE [home nodes])."""

    def holder(self, f: int) -> int | None: ...

    def pinned(self, node: int | None = None) -> np.ndarray: ...


class Planning(Protocol):
    """The homes, once every node's budget is known (nodes.HomePlanning)."""

    def plans(self, budgets: Sequence[int]) -> Homes: ...


def pfs_stream_rate(bandwidth: Mapping[int, float]) -> float:
    """One stream's PFS rate (MB/s) from the profile's ``pfs.bandwidth`` by
    thread count: the rate at the fewest threads given, per thread."""
    if not bandwidth:
        return DEFAULT_PFS_MB_S
    threads = min(bandwidth)
    return bandwidth[threads] / max(1, threads)


@dataclass
class PeerLinks:
    node_rank: int
    nodes: int
    network: Network
    clients: dict[int, PeerClient] = field(default_factory=dict)   # other nodes, by node rank
    counters: Counters = field(default_factory=Counters)           # the client side: fetched, bytes, absent, ...
    ready: threading.Event = field(default_factory=threading.Event)
    planning: Planning | None = None           # None: this job has no node-aware plan (no peer fetch)
    budget: int = 0                            # this node's budget for home files, published at the rendezvous
    plans: Homes | None = None                 # the homes, once the nodes met; None: no peer fetch
    budgets: list[int] | None = None           # every node's published budget, once the nodes met
    pfs_bandwidth: float = DEFAULT_PFS_MB_S    # one PFS stream (pfs_stream_rate of the profile), MB/s
    pfs_latency_ms: float = 0.0                # the profile's pfs.latency_ms

    def plan_homes(self, budgets: Sequence[int]) -> None:
        """Called once the nodes have met, with every node's budget (node
        rank order): the homes every node computes alike.  A failure is a
        warning: no homes, no peer fetch (the job goes on)."""
        self.budgets = [int(b) for b in budgets]
        if self.planning is None:
            return
        try:
            self.plans = self.planning.plans(self.budgets)
        except Exception as e:
            log.warning("the nodes' homes cannot be computed (%r): no copies from peers", e)

    def client(self, node_rank: int) -> PeerClient | None:
        """The client of another node once the nodes have met, else None."""
        if node_rank == self.node_rank or not self.ready.is_set():
            return None
        return self.clients.get(node_rank)
