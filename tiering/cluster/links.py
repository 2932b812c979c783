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
single node and reads the PFS.  Only a copy of a file another node reads
first (its home may be there) waits for the rendezvous's outcome, in the
job's first ``link_wait`` seconds, and no longer than the outcome (met, or
given up) or the daemon's stop.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..profile.model import DEFAULT_PFS_MB_S
from .peer import Counters, Network, PeerClient

log = logging.getLogger("tiering")


class Homes(Protocol):
    """Which other node holds a file, and the files this node keeps for the
    others (clairvoyant/nodes.py, NOTE [node-aware plan], NOTE [home nodes])."""

    def holder(self, f: int, epoch: int | None = None) -> int | None: ...

    def pinned(self, node: int | None = None) -> np.ndarray: ...

    def counts(self) -> list[int]: ...


class Planning(Protocol):
    """The homes, once every node's budget is known (nodes.HomePlanning)."""

    def elsewhere(self, f: int) -> bool: ...

    def plans(self, budgets: Sequence[int]) -> Homes: ...


LINK_WAIT = 5.0   # seconds after the start in which a copy that may come from a peer waits for the homes


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
    homes: list[int] | None = None             # each node's number of home files, once computed
    pfs_bandwidth: float = DEFAULT_PFS_MB_S    # one PFS stream (pfs_stream_rate of the profile), MB/s
    pfs_latency_ms: float = 0.0                # the profile's pfs.latency_ms
    link_wait: float = LINK_WAIT
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    served: deque[int] | None = None           # the files this node's server hands out, for the relay rule
    settled: bool = False                      # the rendezvous has an outcome: the homes known, or none ever
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)

    def settle(self) -> None:
        """The rendezvous has its outcome (the nodes met and the homes are
        computed, or it gave up, or the peer tier closed): no copy waits."""
        self.settled = True
        self._wake.set()

    def wake(self) -> None:
        """The daemon stops: copies waiting for the homes go on at once."""
        self._wake.set()

    def await_homes(self, f: int) -> Homes | None:
        """The homes, waiting for them when they are not known yet and f may
        have its home at another node, until the rendezvous's outcome, the
        daemon's stop (wake) or link_wait seconds after the start, whichever
        comes first.  None: no homes (yet, or ever)."""
        if self._before_homes(f):
            left = self.started + self.link_wait - self.clock()
            if left > 0:
                self._wake.wait(left)
        return self.plans

    def _before_homes(self, f: int) -> bool:
        """The homes are not known yet (nor given up) and another node reads f
        first: its home may be there.  (planning is read first: plan_homes
        sets plans before it lets planning go.)"""
        planning = self.planning
        return self.plans is None and not self.settled and planning is not None and planning.elsewhere(f)

    def may_serve(self, f: int, epoch: int | None = None) -> bool:
        """Whether a copy of f for this node's read in `epoch` may come from a
        peer (any thread): its holder is another node, or its home may be
        another node's once the homes are known.  The daemon copies the
        other files in batches (NOTE [batch copy]): a copy from a peer is
        one file at a time."""
        if self._before_homes(f):
            return True
        plans = self.plans
        return plans is not None and plans.holder(f, epoch) is not None

    def plan_homes(self, budgets: Sequence[int]) -> None:
        """Called once the nodes have met, with every node's budget (node
        rank order): the homes every node computes alike.  A failure is a
        warning: no homes, no peer fetch (the job goes on)."""
        self.budgets = [int(b) for b in budgets]
        if self.planning is None:
            return
        try:
            self.plans = self.planning.plans(self.budgets)
            self.homes = self.plans.counts()
            self.planning = None   # its first readers are not needed any more
        except Exception as e:
            log.warning("the nodes' homes cannot be computed (%r): no copies from peers", e)

    def client(self, node_rank: int) -> PeerClient | None:
        """The client of another node once the nodes have met, else None."""
        if node_rank == self.node_rank or not self.ready.is_set():
            return None
        return self.clients.get(node_rank)
