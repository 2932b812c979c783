"""The peer tier of one node in a job: the peer service on this node's
address, the rendezvous with the other nodes in a background thread, and the
PeerLinks the daemon fetches through ("Integration" in docs/design.md,
NOTE [peer tier in the job]).

The job never waits for and never fails because of this part: the server
starts with no secret (a call waits for it up to peer.EARLY_WAIT, then ends
as "early") and the nodes meet while COMMAND runs, each publishing its
budget for home files; until they have met there are no homes (the node
plans as a single node; a copy that may come from a peer waits for the
outcome in the job's first PeerLinks.link_wait seconds), and for good when
they cannot (a warning), the daemon reads the PFS.  Once they have met,
this thread computes the homes from every node's budget (NOTE [home
nodes]).
"""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog import Catalog
from ..placement.index import SharedIndex, fingerprint
from ..placement.tiers import TierState
from ..profile.model import Network
from .identity import NodeIdentity
from .links import PeerLinks
from .peer import (
    CLIENT_COUNTS,
    SERVER_COUNTS,
    Counters,
    Lookup,
    PeerClient,
    PeerError,
    PeerServer,
    Published,
    interface_address,
)
from .rendezvous import DEFAULT_RENDEZVOUS_TIMEOUT, JobDirectory, RendezvousError, RendezvousStopped, default_base

log = logging.getLogger("tiering")

CLOSE_WAIT = 5.0                      # seconds close() waits for the rendezvous thread to notice


def index_lookup(index: SharedIndex, catalog: Catalog, tiers: Sequence[TierState]) -> Lookup:
    """(data-root id, relative path) -> the published copy, through the
    index's own path table (the probe the shim makes: NOTE [peer tier in the
    job]), so the lookup costs no memory per file."""
    entries = index.entries
    mask = int(index.header.nslots) - 1
    files = catalog.files

    def lookup(root: int, rel: str) -> Published | None:
        lo, hi = fingerprint(root, rel)
        s = lo & mask
        while True:
            e = entries[s]
            if e.fp_lo == lo and e.fp_hi == hi:
                break
            if not e.fp_lo and not e.fp_hi:
                return None
            s = (s + 1) & mask
        state, k = int(e.state), int(e.file)
        if not 1 <= state <= len(tiers) or not 0 <= k < len(files):
            return None     # not published (or written to: invalid)
        f = files[k]
        if f.root != root or f.rel != rel:
            return None
        return Published(str(tiers[state - 1].copy_path(f)), f.size, f.mtime_ns, k)

    return lookup


def listen_host(network: Network) -> str:
    """The profile's interface's address, else the address the host name resolves to."""
    if network.interface:
        return interface_address(network.interface)
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise PeerError(f"the host name {name!r} does not resolve ({e}); give network.interface in the "
                        "profile") from None


@dataclass
class PeerTier:
    """This node's side of the peer tier, from start() (after COMMAND was
    started: it makes threads) to close()."""
    ident: NodeIdentity
    network: Network
    lookup: Lookup
    timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT
    links: PeerLinks = field(init=False)
    server: PeerServer | None = None
    address: str = ""
    met: bool = False
    error: str | None = None
    _directory: JobDirectory | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.links = PeerLinks(self.ident.node_rank, self.ident.node_count, self.network)

    def start(self) -> None:
        """Listens (every call ends as "early" until the nodes met) and starts the
        rendezvous; a problem is a warning: the job reads the PFS."""
        base = Path(self.ident.rendezvous) if self.ident.rendezvous else default_base()
        try:
            self._directory = JobDirectory(base, self.ident)
            self.server = PeerServer(listen_host(self.network), None, self.lookup)
            self.server.served = self._served
            self.address = self.server.start()
        except (PeerError, RendezvousError) as e:
            self._give_up(str(e))
            return
        self._thread = threading.Thread(target=self._meet, name="tiering-rendezvous", daemon=True)
        self._thread.start()

    def _served(self, file: int) -> None:
        """The server handed a copy out: reported to the relay rule
        (PeerLinks.served, NOTE [relay]), once the daemon has one."""
        served = self.links.served
        if served is not None:
            served.append(file)

    def _meet(self) -> None:
        assert self._directory is not None and self.server is not None
        try:
            meeting = self._directory.meet(self.address, self.timeout, self._stop, self.links.budget)
        except RendezvousStopped:
            return
        except (RendezvousError, OSError) as e:
            self._give_up(str(e))
            return
        with self._lock:
            if self._stop.is_set():
                return
            self.server.secret = meeting.secret
            for p in meeting.peers:
                if p.rank != self.ident.node_rank:
                    self.links.clients[p.rank] = PeerClient(p.address, meeting.secret, self.links.counters)
            self.met = True
            self.links.ready.set()
        log.info("peer tier: %d nodes met; this node serves on %s", self.ident.node_count, self.address)
        if not self._stop.is_set():
            self.links.plan_homes([p.budget for p in meeting.peers])   # after ready: the homes name met nodes only
        self.links.settle()

    def _give_up(self, why: str) -> None:
        """One warning; no peer tier for this job (nothing listens, nothing is left in the job directory)."""
        log.warning("peer tier off, this node reads the PFS only (the job goes on): %s", why)
        self._shut()
        self.error = why     # last: whoever sees the error (the report, a test) sees the peer tier shut

    def _shut(self) -> None:
        self.links.settle()
        with self._lock:
            self._stop.set()
            self.links.ready.clear()
            if self.server is not None:
                self.server.stop(0.5)
            for c in self.links.clients.values():
                c.close()
            self.links.clients.clear()
            if self._directory is not None:
                self._directory.close()
                self._directory = None

    def close(self) -> None:
        """Stops listening and leaves the job directory (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT)
        self._shut()

    def report(self) -> dict[str, Any]:
        """The JSON ``peer`` object: this node, whether the nodes met, and the
        counters of its server and of its clients (never the secret)."""
        return {
            "node_rank": self.ident.node_rank,
            "nodes": self.ident.node_count,
            "job_id": self.ident.job_id,
            "address": self.address or None,
            "met": self.met,
            "secret": self.server is not None and self.server.secret is not None,
            "error": self.error,
            "network": {"bandwidth": self.network.bandwidth, "latency_ms": self.network.latency_ms,
                        "interface": self.network.interface},
            "server": (self.server.counters if self.server is not None else Counters()).report(SERVER_COUNTS),
            "client": self.links.counters.report(CLIENT_COUNTS),
        }


def peer_summary(p: dict[str, Any]) -> str:
    """The summary's line about the peer tier: every count of the server,
    the client's fetches and the daemon's PFS copies in their stead by reason."""
    s = p["server"]
    if not p["met"]:
        return (f"  peers    node {p['node_rank']} of {p['nodes']}: the nodes did not meet, no peer tier"
                + (f" ({p['error']})" if p.get("error") else ""))
    c = p["client"]
    refusals = ", ".join(f"{s.get(k, 0):,} {k}" for k in SERVER_COUNTS[2:])
    fallbacks = p.get("fallbacks") or {}
    instead = ("; from the PFS instead: " + ", ".join(f"{n:,} {r}" for r, n in sorted(fallbacks.items()))
               if fallbacks else "")
    return (f"  peers    node {p['node_rank']} of {p['nodes']} on {p['address']}: served {s['served']:,} copies "
            f"({s['bytes']:,} B), {refusals}; fetched {c.get('fetched', 0):,} ({c.get('bytes', 0):,} B){instead}")
