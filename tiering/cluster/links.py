"""What the placement daemon is given to fetch copies from the other nodes of
a job (the peer tier, NOTE [peer protocol] and "Integration" in
docs/design.md).

The job's set-up (tier-run, or the node service in launch form 2) makes one
PeerLinks per node when the job spans several nodes: it starts the
PeerServer, meets the other nodes in the job directory in a background
thread and, once they have met, fills ``clients`` (one PeerClient per other
node, by node rank) and sets ``ready``.  Until then, and for good when the
rendezvous fails, the daemon reads the PFS: the job never waits for a peer.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..profile.model import DEFAULT_PFS_MB_S
from .peer import Counters, Network, PeerClient

LINK_WAIT = 5.0            # seconds after the start in which a copy planned at a peer waits for the nodes to meet


class Homes(Protocol):
    """Which other node holds a file now, and the files this node keeps for the
    others (clairvoyant/nodes.py, NOTE [node-aware plan], NOTE [home nodes])."""

    def holder(self, f: int) -> int | None: ...

    def follow(self, policy: object) -> None: ...

    def pinned(self, node: int | None = None) -> np.ndarray: ...


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
    plans: Homes | None = None                 # the other nodes' plans; None: no peer fetch
    pfs_bandwidth: float = DEFAULT_PFS_MB_S    # one PFS stream (pfs_stream_rate of the profile), MB/s
    pfs_latency_ms: float = 0.0                # the profile's pfs.latency_ms
    link_wait: float = LINK_WAIT
    started: float = field(default_factory=time.monotonic)

    def linked(self) -> bool:
        """Whether the nodes have met.  Until link_wait seconds after the
        links were made (the job's start) the caller waits for them: the
        copies a node plans at the start for later epochs are of files its
        peers are fetching then (NOTE [home nodes]); after that, or once the
        rendezvous gave up, nobody waits."""
        if self.ready.is_set():
            return True
        left = self.started + self.link_wait - time.monotonic()
        return left > 0 and self.ready.wait(left)

    def client(self, node_rank: int) -> PeerClient | None:
        """The client of another node once the nodes have met, else None."""
        if node_rank == self.node_rank or not self.ready.is_set():
            return None
        return self.clients.get(node_rank)
