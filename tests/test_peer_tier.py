"""A node's peer tier (cluster/peering.py) on loopback: the nodes meet in a
job directory, each publishing its budget for home files; every node then
computes the same homes from every node's budget, whatever its own tiers;
before that, and when the nodes never meet, there are no homes; every count
of the server and of the client reaches the job's record and its summary."""
from __future__ import annotations

import numpy as np
import pytest
from test_home_nodes import SIZES, streams_for

from helpers import private_dir, wait_for
from tiering.clairvoyant.nodes import HomePlanning, NodePlans, home_budget
from tiering.cluster.identity import NodeIdentity
from tiering.cluster.peer import CLIENT_COUNTS, SERVER_COUNTS, FileKey, PeerClient, PeerServer, PeerUnavailable
from tiering.cluster.peering import PeerTier, peer_summary
from tiering.profile.model import Network

LOOPBACK = Network(interface="lo")


def tier(tmp_path, rank: int, nodes: int, budget: int, timeout: float = 120.0) -> PeerTier:
    base = tmp_path / "rdzv"
    if not base.exists():
        private_dir(base)
    ident = NodeIdentity(f"homes-{tmp_path.name}", rank, nodes, rendezvous=str(base))
    t = PeerTier(ident, LOOPBACK, lambda root, rel: None, timeout)
    t.links.budget = budget
    t.links.planning = HomePlanning.of(streams_for(nodes), nodes, rank, SIZES)
    return t


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 3])
def test_nodes_whose_tiers_differ_compute_the_same_homes_once_they_met(tmp_path, nodes):
    per_node = int(SIZES.sum()) // nodes
    budgets = [home_budget([int(per_node * (0.3 + 0.4 * r))]) for r in range(nodes)]
    tiers = [tier(tmp_path, r, nodes, budgets[r]) for r in range(nodes)]
    try:
        assert all(t.links.plans is None and not t.links.settled for t in tiers)   # no homes before the nodes met
        for t in tiers:
            t.start()
        wait_for(lambda: all(t.links.plans is not None for t in tiers), "the homes")
        homes = [t.links.plans for t in tiers]
        assert all(isinstance(h, NodePlans) for h in homes)
        by_hand = NodePlans.of_streams(streams_for(nodes), nodes, 0, SIZES, budgets)
        for r, (t, h) in enumerate(zip(tiers, homes)):
            assert t.links.ready.is_set() and t.links.budgets == budgets and t.links.settled
            assert isinstance(h, NodePlans) and h.me == r and np.array_equal(h.home, by_hand.home)
        assert [int((by_hand.home == r).sum()) for r in range(nodes)] == sorted(
            int((by_hand.home == r).sum()) for r in range(nodes))   # the larger budgets home more
    finally:
        for t in tiers:
            t.close()


def test_nodes_that_never_meet_have_no_homes(tmp_path):
    alone = tier(tmp_path, 0, 2, 1 << 20, timeout=0.3)   # node 1 never comes
    alone.start()
    wait_for(lambda: alone.error is not None, "the rendezvous to give up")
    assert "still waiting for node 1" in alone.error
    assert alone.links.plans is None and alone.links.budgets is None and not alone.links.ready.is_set()
    assert alone.links.settled          # the copies waiting for the homes go on at once
    alone.close()


@pytest.mark.slow
def test_every_count_of_the_server_and_the_client_reaches_the_record_and_the_summary(tmp_path):
    t = tier(tmp_path, 0, 2, 0)
    t.server = PeerServer("127.0.0.1", None, lambda root, rel: None)
    t.address = t.server.start()
    t.met = True
    client = PeerClient(t.address, bytes(32), t.links.counters)
    with pytest.raises(PeerUnavailable):     # the server has not met the others: "early" at both ends
        client.fetch(FileKey(0, "x", 1, 1), tmp_path / "x.part", timeout=30)
    client.close()
    t.server.stop(0)
    report = t.report()
    assert report["server"] == {**dict.fromkeys(SERVER_COUNTS, 0), "early": 1}
    assert report["client"] == {**dict.fromkeys(CLIENT_COUNTS, 0), "early": 1}
    line = peer_summary({**report, "fallbacks": {"early": 1, "slower": 2}})
    for name in SERVER_COUNTS[2:]:
        assert f"0 {name}" in line or f"1 {name}" in line
    assert "1 early" in line and "from the PFS instead: 1 early, 2 slower" in line
