"""The daemon's peer tier with real peer services on loopback: a file the
node-aware plan places on another node is fetched from it instead of the
PFS; any failure of the peer (absent, stopped, stalled, refused) costs a PFS
copy of the same bytes, counted by reason; no peer before the nodes met, and
no copy ever waits for them."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_daemon import Setup
from test_event_batches import post
from test_node_plans import stream_time

from helpers import Entered, make_data, staged, wait_for
from tiering.clairvoyant.feeds import ListFeed
from tiering.clairvoyant.nodes import NodePlans, NodeStreams, home_budget
from tiering.clairvoyant.policy import Clairvoyant
from tiering.clairvoyant.samplers import SamplerSpec
from tiering.cluster.links import PeerLinks
from tiering.cluster.peer import Network, PeerClient, PeerServer, Published
from tiering.placement.api import Policy
from tiering.placement.daemon import Daemon
from tiering.placement.index import lib
from tiering.report import JobRecord, to_json

SECRET = bytes(range(32))
FILES = {"a/x.bin": 5000, "a/y.bin": 100_000, "b/z.bin": 1, "e.bin": 0, "big.bin": 3 * (1 << 20) + 17}
FAST = Network(bandwidth=1000.0, latency_ms=0.1)


class CountingDaemon(Daemon):
    """Counts the copies read from the PFS, one at a time (_copy) or in
    batches (_copy_many: also in `batched`)."""

    def __init__(self, *args, **kw):  # type: ignore[no-untyped-def]
        self.pfs_copies: list[str] = []
        self.batched: list[str] = []
        super().__init__(*args, **kw)

    def _copy(self, src, f, t):  # type: ignore[no-untyped-def]
        self.pfs_copies.append(f.rel)
        return super()._copy(src, f, t)

    def _copy_many(self, ids, t, done):  # type: ignore[no-untyped-def]
        rels = [self.files[i].rel for i in ids.tolist()]
        self.pfs_copies += rels
        self.batched += rels
        return super()._copy_many(ids, t, done)


class Holders:
    """A node-aware plan that names node 1 for the files given; node 0's home
    files are those it names no node for."""

    def __init__(self, files: set[int] | None = None, n: int = len(FILES)):
        self.files = files
        self.n = n

    def holder(self, f: int, epoch: int | None = None) -> int | None:
        return 1 if self.files is None or f in self.files else None

    def pinned(self, node: int | None = None) -> np.ndarray:
        return np.array([self.holder(f) is None for f in range(self.n)])

    def counts(self) -> list[int]:
        mine = int(self.pinned().sum())
        return [mine, self.n - mine]


class Pins(Policy):
    """A policy that notes the pins it is given, and where."""

    def __init__(self, placement: object):
        super().__init__(placement)  # type: ignore[arg-type]
        self.pins: list[tuple[list[int], str]] = []

    def pin(self, pinned: np.ndarray) -> None:
        self.pins.append((np.flatnonzero(pinned).tolist(), threading.current_thread().name))


class Peer:
    """Node 1: a peer service serving its copies of the data set (the same
    bytes: make_data is deterministic) under the PFS files' identity."""

    def __init__(self, tmp: Path, files: dict[str, int]):
        self.copies = tmp / "peer-tier"
        self.contents = make_data(self.copies, files)
        self.pfs = tmp / "pfs"
        self.absent: set[str] = set()
        self.stall = threading.Event()     # set: lookups wait until released
        self.stalled = threading.Event()   # a lookup is waiting
        self.release = threading.Event()
        self.server = PeerServer("127.0.0.1", SECRET, self.lookup)
        self.address = self.server.start()

    def lookup(self, root: int, rel: str) -> Published | None:
        if self.stall.is_set():
            self.stalled.set()
            self.release.wait(60)
        if root != 0 or rel in self.absent or not (self.copies / rel).is_file():
            return None
        st = os.stat(self.pfs / rel)
        return Published(str(self.copies / rel), st.st_size, st.st_mtime_ns)

    def close(self) -> None:
        self.release.set()
        self.server.stop(0)


@pytest.fixture
def setups(tmp_path):
    """Daemons on one data set (test_daemon.Setup), stopped at the end."""
    made: list[Setup] = []

    def make(**kw) -> Setup:  # type: ignore[no-untyped-def]
        made.append(Setup(tmp_path, **kw))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.fixture
def peer(tmp_path):
    p = Peer(tmp_path, FILES)
    yield p
    p.close()


def links_to(peer: Peer, plans: object, secret: bytes = SECRET, ready: bool = True,
             pfs_mb_s: float = 1.0, pfs_latency_ms: float = 1.0) -> PeerLinks:
    links = PeerLinks(0, 2, FAST, plans=plans, pfs_bandwidth=pfs_mb_s, pfs_latency_ms=pfs_latency_ms)  # type: ignore[arg-type]
    links.clients[1] = PeerClient(peer.address, secret, links.counters)
    if ready:
        links.ready.set()
    return links


def with_peers(links: PeerLinks, policy: Callable | None = None) -> Callable:  # type: ignore[type-arg]
    def make(index, catalog, slots, tiers, pfs_threads, off):  # type: ignore[no-untyped-def]
        return CountingDaemon(index, catalog, slots, tiers, pfs_threads, policy or off, peers=links)
    return make


def place_all(s: Setup) -> None:
    for rel in FILES:
        assert s.d.place(s.i[rel], 0)
    s.wait()


def assert_same_bytes_published(s: Setup) -> None:
    for rel, data in s.contents.items():
        assert s.state(rel) == 1
        assert (s.tier.data / "0" / rel).read_bytes() == data
    assert staged(s.tier.staging) == []


def test_a_file_planned_at_a_peer_is_fetched_from_it_and_not_from_the_pfs(setups, peer):
    links = links_to(peer, Holders())
    s = setups(files=FILES, daemon_cls=with_peers(links))
    assert peer.contents == s.contents
    place_all(s)
    assert_same_bytes_published(s)
    d = s.d
    assert d.pfs_copies == [] and d.stats.pfs_opens == 0 and d.stats.pfs_bytes == 0   # PFS never opened
    assert (d.stats.peer_fetches, d.stats.peer_bytes) == (len(FILES), sum(FILES.values()))
    assert d.stats.peer_fallbacks == {}
    assert links.counters.snapshot() == {"fetched": len(FILES), "bytes": sum(FILES.values())}
    assert peer.server.counters.snapshot() == {"served": len(FILES), "bytes": sum(FILES.values())}
    assert (d.stats.copies, s.tier.files, s.tier.placed_bytes) == (len(FILES), len(FILES), sum(FILES.values()))
    d.stop()
    record = to_json(JobRecord("off", 0, ["true"], "p", [str(s.data)], len(FILES), 1, daemon=d.stats))   # the job's JSON: a peer object
    assert record["peer"]["fetches"] == len(FILES) and record["peer"]["client"]["fetched"] == len(FILES)
    assert record["peer"]["fallbacks"] == {} and record["peer"]["linked"] is True


def _absent(peer: Peer, links: PeerLinks) -> None:
    peer.absent.update(FILES)


def _stopped(peer: Peer, links: PeerLinks) -> None:
    peer.server.stop(0)


def _stalled(peer: Peer, links: PeerLinks) -> None:
    peer.stall.set()


def _refused(peer: Peer, links: PeerLinks) -> None:
    links.clients[1] = PeerClient(peer.address, b"another job's secret" + bytes(12), links.counters)


@pytest.mark.parametrize("fault, reason", [(_absent, "absent"), (_stopped, "error"),
                                           pytest.param(_stalled, "deadline", marks=pytest.mark.slow),  # waits it out
                                           (_refused, "refused")])
def test_a_peer_that_cannot_serve_costs_a_pfs_copy_of_the_same_bytes_counted_by_reason(
        setups, peer, fault, reason):
    links = links_to(peer, Holders())
    fault(peer, links)
    s = setups(files=FILES, daemon_cls=with_peers(links), threads=len(FILES), pfs_threads=len(FILES))
    place_all(s)
    assert_same_bytes_published(s)
    d = s.d
    assert sorted(d.pfs_copies) == sorted(FILES) and d.stats.pfs_opens == len(FILES)
    assert d.stats.peer_fetches == 0 and d.stats.peer_fallbacks == {reason: len(FILES)}
    assert links.counters.snapshot() == {reason: len(FILES)}
    assert s.d.peer_report()["fallbacks"] == {reason: len(FILES)}


def test_no_peer_is_asked_and_no_copy_waits_while_the_nodes_are_not_linked(setups, peer):
    """Homes known but the nodes not linked (the peer tier closed): the PFS
    copies of files the plan places on a peer are counted as "unlinked", at
    once: no copy worker waits."""
    links = links_to(peer, Holders(), ready=False)
    links.ready, links._wake = Entered(), Entered()
    s = setups(files=FILES, daemon_cls=with_peers(links))
    place_all(s)
    assert_same_bytes_published(s)
    assert sorted(s.d.pfs_copies) == sorted(FILES)
    assert links.counters.snapshot() == {} and peer.server.counters.snapshot() == {}
    assert s.d.stats.peer_fallbacks == {"unlinked": len(FILES)}
    assert not links.ready.waiting.is_set() and not links._wake.waiting.is_set()


def test_before_the_homes_are_known_the_daemon_reads_the_pfs_and_asks_no_peer(setups, peer):
    """The nodes have not met: no homes, so every copy is a PFS copy, not a
    peer fallback; once the homes are known the policy is given this node's
    home files, once, in the event thread (the policy's), and the files
    homed elsewhere come from their home."""
    links = links_to(peer, None, ready=False)
    policies: list[Pins] = []

    def pins(d: Daemon) -> Pins:
        policies.append(Pins(d))
        return policies[-1]

    s = setups(files=FILES, daemon_cls=with_peers(links, pins))
    assert s.d.place(s.i["a/x.bin"], 0)
    s.wait()
    assert s.d.pfs_copies == ["a/x.bin"] and s.d.stats.peer_fallbacks == {} and policies[0].pins == []
    plans = Holders({s.i["a/y.bin"], s.i["big.bin"]})
    links.ready.set()
    links.plans = plans
    wait_for(lambda: policies[0].pins, "the home files pinned")
    home = sorted(s.i[r] for r in ("a/x.bin", "b/z.bin", "e.bin"))
    assert policies[0].pins == [(home, "tiering-events")]
    for rel in ("a/y.bin", "big.bin", "b/z.bin"):
        assert s.d.place(s.i[rel], 0)
    s.wait()
    assert sorted(s.d.pfs_copies) == ["a/x.bin", "b/z.bin"] and s.d.stats.peer_fetches == 2
    s.d.stop()
    assert len(policies[0].pins) == 1    # once, however many turns the event thread made


class Candidates:
    """A planning whose first readers are node 1 for the files given."""

    def __init__(self, files: set[int] | None = None):
        self.files = files

    def elsewhere(self, f: int) -> bool:
        return self.files is None or f in self.files

    def plans(self, budgets: list[int]) -> Holders:
        return Holders(self.files)


def waiting_links(peer: Peer, files: set[int] | None = None, **kw) -> PeerLinks:  # type: ignore[no-untyped-def]
    """Links whose nodes have not met yet: no homes, a planning, a long
    link_wait, and a wake event that tells when a copy waits on it."""
    links = links_to(peer, None, ready=False, **kw)
    links.planning, links.link_wait, links._wake = Candidates(files), 3600.0, Entered()
    return links


def test_a_copy_before_the_nodes_met_waits_for_the_homes_then_comes_from_its_home(setups, peer):
    """A copy of a file another node reads first, planned before the nodes
    met, waits for the rendezvous's outcome and then comes from the peer,
    not the PFS."""
    links = waiting_links(peer)
    s = setups(files=FILES, daemon_cls=with_peers(links))
    assert s.d.place(s.i["a/x.bin"], 0)
    wait_for(links._wake.waiting.is_set, "the copy waiting for the homes")
    assert s.d.stats.copies == 0 and s.d.stats.pfs_opens == 0
    links.ready.set()
    links.plan_homes([1, 1])
    links.settle()
    s.wait()
    assert s.state("a/x.bin") == 1 and (s.tier.data / "0" / "a/x.bin").read_bytes() == s.contents["a/x.bin"]
    assert s.d.stats.peer_fetches == 1 and s.d.stats.pfs_opens == 0 and s.d.stats.peer_fallbacks == {}


def test_a_waiting_copy_reads_the_pfs_at_once_when_the_rendezvous_gives_up(setups, peer):
    links = waiting_links(peer)
    s = setups(files=FILES, daemon_cls=with_peers(links))
    assert s.d.place(s.i["a/x.bin"], 0)
    wait_for(links._wake.waiting.is_set, "the copy waiting for the homes")
    links.settle()     # given up (peering._give_up): no homes, ever
    s.wait()           # long before link_wait (an hour)
    assert s.d.pfs_copies == ["a/x.bin"] and s.d.stats.peer_fetches == 0 and s.d.stats.peer_fallbacks == {}
    assert s.state("a/x.bin") == 1


def test_a_waiting_copy_ends_when_the_daemon_stops(setups, peer):
    links = waiting_links(peer)
    s = setups(files=FILES, daemon_cls=with_peers(links))
    assert s.d.place(s.i["a/x.bin"], 0)
    wait_for(links._wake.waiting.is_set, "the copy waiting for the homes")
    assert s.d.stop() is True              # every copy ended (not after link_wait: an hour)
    assert s.state("a/x.bin") == lib.TIERING_STATE_NONE and s.d.stats.peer_fetches == 0


@pytest.mark.parametrize("case", ["late", "own file", "slower"])
def test_copies_that_need_no_homes_never_wait(setups, peer, case):
    """After link_wait (a clock past it), for a file this node reads first,
    or of a size the network does not serve faster than the PFS: the copy
    reads the PFS at once."""
    kw = {"pfs_mb_s": 1e6, "pfs_latency_ms": 0.0} if case == "slower" else {}
    links = waiting_links(peer, set() if case == "own file" else None, **kw)
    if case == "late":
        links.clock = lambda: links.started + links.link_wait + 1
    s = setups(files=FILES, daemon_cls=with_peers(links))
    place_all(s)
    assert_same_bytes_published(s)
    assert not links._wake.waiting.is_set()
    assert sorted(s.d.pfs_copies) == sorted(FILES) and s.d.stats.peer_fallbacks == {}
    assert peer.server.counters.snapshot() == {}


def test_only_files_the_plan_places_on_a_peer_are_asked_for(setups, peer):
    links = links_to(peer, None)
    s = setups(files=FILES, daemon_cls=with_peers(links))
    links.plans = Holders({s.i["a/y.bin"], s.i["big.bin"]})
    place_all(s)
    assert_same_bytes_published(s)
    assert sorted(s.d.pfs_copies) == sorted(set(FILES) - {"a/y.bin", "big.bin"})
    assert s.d.stats.peer_fetches == 2 and peer.server.counters.snapshot()["served"] == 2


def test_files_no_peer_may_serve_are_copied_in_batches(setups, peer):
    """This node's own files and those without a home (no peer holds them)
    go through the batch copy (NOTE [batch copy]) as on a single node; a
    file homed at a peer is fetched on its own; so is a file another node
    reads first while the homes are not known (it waits for them); once the
    rendezvous gave up, nothing is fetched and every small file is batched."""
    links = links_to(peer, None)
    s = setups(files=FILES, daemon_cls=with_peers(links))
    links.plans = Holders({s.i["a/y.bin"], s.i["big.bin"]})
    place_all(s)
    assert_same_bytes_published(s)
    assert sorted(s.d.batched) == ["a/x.bin", "b/z.bin", "e.bin"]      # big.bin: too large for a batch anyway
    assert sorted(s.d.pfs_copies) == sorted(s.d.batched) and s.d.stats.peer_fetches == 2
    waiting = waiting_links(peer, {s.i["a/x.bin"]})
    assert waiting.may_serve(s.i["a/x.bin"]) and not waiting.may_serve(s.i["b/z.bin"])
    waiting.settle()         # gave up: no homes, ever
    assert not waiting.may_serve(s.i["a/x.bin"])
    assert not links_to(peer, None).may_serve(s.i["a/x.bin"])           # no node-aware plan at all


def test_a_peer_slower_than_the_pfs_is_not_asked(setups, peer):
    links = links_to(peer, Holders(), pfs_mb_s=1e6, pfs_latency_ms=0.0)   # a PFS faster than the network
    s = setups(files=FILES, daemon_cls=with_peers(links))
    place_all(s)
    assert_same_bytes_published(s)
    assert sorted(s.d.pfs_copies) == sorted(FILES) and s.d.stats.peer_fallbacks == {"slower": len(FILES)}
    assert peer.server.counters.snapshot() == {}


def test_an_invalidated_file_fetched_from_a_peer_is_not_published(setups, peer):
    """A peer copy is published exactly as a PFS copy: a write open of the
    file meanwhile wins."""
    links = links_to(peer, Holders())
    peer.stall.set()   # the fetch waits at the peer
    s = setups(files={"a/x.bin": 5000}, daemon_cls=with_peers(links))
    i = s.i["a/x.bin"]
    assert s.d.place(i, 0)
    wait_for(peer.stalled.is_set, "the fetch at the peer")
    s.d._invalidate(i)   # a write open while the copy is in flight
    peer.release.set()
    s.wait()
    assert s.state("a/x.bin") == lib.TIERING_STATE_NONE
    assert not (s.tier.data / "0" / "a/x.bin").exists() and s.tier.used == 0
    assert s.d.stats.peer_fetches == 1 and s.d.stats.copies == 0


def test_the_node_aware_plan_sends_the_daemon_to_each_file_s_home(tmp_path, setups):
    """Node 0's clairvoyant daemon, its home files pinned (everything fits:
    its home is all it reads in epoch 0): once it follows the order it
    places epochs 0 and 1, its own home files from the PFS and the others,
    node 1's home files, from node 1; the new files of epoch 2 come from
    node 1 too, and the PFS is read only for node 0's home files."""
    n = 60
    files = {f"d/f{k:02d}.bin": 1000 + 37 * k for k in range(n)}
    peer = Peer(tmp_path, files)
    try:
        spec = SamplerSpec("distributed", seed=5, num_replicas=4, rank=0)
        streams = NodeStreams(spec, 2, np.arange(n, dtype=np.int64))   # catalog ids are sorted paths: d/fNN
        sizes = [files[rel] for rel in sorted(files)]
        capacity = 1 << 30
        plans = NodePlans.of_streams(streams, 2, 0, sizes, [home_budget([capacity])] * 2)
        links = links_to(peer, plans)
        links.budget = home_budget([capacity])

        def clairvoyant(d: Daemon) -> Clairvoyant:
            return Clairvoyant(d, ListFeed(iter([streams(0, e) for e in range(3)])), pinned=plans.pinned())

        s = setups(files=files, capacity=capacity, daemon_cls=with_peers(links, clairvoyant))
        mine = set(streams(0, 0).tolist())
        first = mine | set(streams(0, 1).tolist())
        assert set(np.flatnonzero(plans.home == 0).tolist()) == mine and first - mine
        wait_for(lambda: s.d.stats.copies == len(first), "epochs 0 and 1 placed")
        assert s.d.stats.pfs_opens == len(mine) and s.d.stats.peer_fetches == len(first - mine)
        post(s.index, [(lib.TIERING_EV_OPEN_TIER, s.d.slots[f], 4242, 0) for f in streams(0, 0).tolist()])
        wait_for(lambda: stream_time(s.d.policy) == (1, 0), "the reader in epoch 1")
        third = set(streams(0, 2).tolist()) - first
        assert third and all(plans.holder(f) == 1 for f in third)   # two nodes: what node 0 did not read, node 1 did
        wait_for(lambda: s.d.stats.copies == len(first | third), "epoch 2 placed")
        rel = sorted(files)
        assert sorted(s.d.pfs_copies) == sorted(rel[f] for f in mine)
        from_peer = (first | third) - mine
        assert s.d.stats.peer_fetches == len(from_peer) and s.d.stats.peer_fallbacks == {}
        assert peer.server.counters.snapshot()["served"] == len(from_peer)
        for f in first | third:
            assert (s.tier.data / "0" / rel[f]).read_bytes() == s.contents[rel[f]]
        # the relay rule (NOTE [relay]): what node 0 reads in epoch 1 it holds for epoch 2's readers,
        # pinned in its plan, until its server hands the copy out
        relay = s.d._relay
        assert relay is not None and links.served is relay.served
        e1 = streams(0, 1)
        post(s.index, [(lib.TIERING_EV_OPEN_TIER, s.d.slots[f], 4242, 0) for f in e1.tolist()])
        wait_for(lambda: stream_time(s.d.policy) == (2, 0), "the reader in epoch 2")
        wait_for(lambda: s.d.policy.pinned[e1].all(), "epoch 1's reads held")
        assert s.d.policy.planner._pin[e1].all() and (relay.kept_in[e1] == 1).all()
        links.served.extend(e1[:3].tolist())
        wait_for(lambda: not s.d.policy.pinned[e1[:3]].any(), "the copies handed out let go")
        assert not s.d.policy.planner._pin[e1[:3]].any() and s.d.policy.pinned[e1[3:]].all()
    finally:
        peer.close()
