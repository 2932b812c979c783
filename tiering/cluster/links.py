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
from dataclasses import dataclass, field

from .peer import Counters, Network, PeerClient


@dataclass
class PeerLinks:
    node_rank: int
    nodes: int
    network: Network
    clients: dict[int, PeerClient] = field(default_factory=dict)   # other nodes, by node rank
    counters: Counters = field(default_factory=Counters)           # the client side: fetched, bytes, absent, ...
    ready: threading.Event = field(default_factory=threading.Event)

    def client(self, node_rank: int) -> PeerClient | None:
        """The client of another node once the nodes have met, else None."""
        if node_rank == self.node_rank or not self.ready.is_set():
            return None
        return self.clients.get(node_rank)
