"""A real torchrun training (gloo, DistributedDataParallel) across emulated
nodes under tier-run, with the peer tier: each node a network namespace on
one bridge with its own tiers, every node reading one slowfs PFS
(tests/multinode.py).  The same training without tier-run is the reference:
every rank reads the same samples with the same bytes in every epoch and
ends with the same weights; the nodes fetch copies from each other; and the
PFS traffic tier-run reports is what the PFS itself counted."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import multinode
import pytest

import netns
from helpers import REPO, make_data, wait_for

sys.path.insert(0, str(REPO))
from bench.slowfs import SlowFs, SlowFsOptions  # noqa: E402
from tiering.clairvoyant.nodes import home_budget  # noqa: E402

REASON = netns.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.fuse,
              pytest.mark.skipif(REASON is not None, reason=f"no emulated nodes: {REASON}")]

FILES, SIZE, EPOCHS = 80, 16384, 3
D = FILES * SIZE
PFS = SlowFsOptions(meta_latency_ms=0.2, read_latency_ms=0.2, bandwidth_mbps=0, max_inflight=16)


@pytest.fixture
def pfs(tmp_path: Path):
    """The data set on a slowfs mount: (mount point, source directory)."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    make_data(src, {f"c{i % 4}/f{i:03d}.bin": SIZE for i in range(FILES)}, seed=9)
    mnt.mkdir()
    with SlowFs(src, mnt, PFS) as fs:
        yield fs


def spec(tmp: Path, data: Path, mode: str, tag: str, nodes: int = 2, **kw) -> multinode.JobSpec:
    # each node's tier holds 3/4 of the data set: the nodes together hold it, one alone does not
    return multinode.JobSpec(data, tmp / tag, nodes, mode=mode, capacity=3 * D // 4, epochs=EPOCHS, batch=4,
                             step_ms=150, job_id=f"mn{tag}{os.getpid()}", port=29500, timeout=400, **kw)


def run(fs: SlowFs, s: multinode.JobSpec, net: netns.Network,
        during=None) -> tuple[multinode.JobResult, dict[str, int]]:
    before = fs.stats()
    result = multinode.run_job(s, net, during)
    after = fs.stats()
    assert result.codes == [0] * len(result.codes), "\n".join(e[-3000:] for e in result.errors)
    return result, {k: after[k] - before[k] for k in ("opens", "bytes")}


def samples(result: multinode.JobResult) -> list[list[tuple[int, str]]]:
    """Per rank, per epoch: the samples read and the digest of their indexes and bytes."""
    return [[(e["samples"], e["digest"]) for e in r["epochs"]] for r in result.ranks]


@pytest.mark.parametrize("nodes", [2, 3])
def test_torchrun_across_nodes_reads_the_same_bytes_and_fetches_from_peers(tmp_path: Path, pfs: SlowFs, nodes: int):
    with netns.emulated_nodes(nodes, net=35 + nodes) as net:
        ref, ref_pfs = run(pfs, spec(tmp_path, pfs.path, "pfs", "ref", nodes), net)
        got, got_pfs = run(pfs, spec(tmp_path, pfs.path, "peers", "peers", nodes), net)
    # the training itself: same samples, same bytes, same weights, on every rank
    share = -(-FILES // nodes)      # DistributedSampler pads the last share
    assert samples(got) == samples(ref) == multinode.expected_samples(pfs.source, nodes, EPOCHS, 11)
    assert all(len(r) == EPOCHS and all(n == share for n, _ in r) for r in samples(ref))
    assert len({r["weights"] for r in ref.ranks + got.ranks}) == 1
    assert ref_pfs == {"opens": EPOCHS * nodes * share, "bytes": EPOCHS * nodes * share * SIZE}
    peers = [s["peer"] for s in got.stats]
    assert [(p["met"], p["linked"], p["planned"], p["node_rank"]) for p in peers] == [
        (True, True, True, n) for n in range(nodes)]
    # the peer path was used: copies moved between the nodes, what the nodes served the others fetched
    assert sum(p["bytes"] for p in peers) > 0
    assert sum(p["bytes"] for p in peers) == sum(p["server"]["bytes"] for p in peers)
    assert all(p["fetches"] * SIZE == p["bytes"] and p["server"]["refused"] == 0 for p in peers), peers
    # tier-run's PFS traffic is what the PFS counted (whole files are read), and every copy came
    # from the PFS or a peer
    pfs_bytes = [s["pfs"]["bytes"] for s in got.stats]
    assert sum(pfs_bytes) == got_pfs["bytes"]
    assert sum(s["pfs"]["opens"] for s in got.stats) == got_pfs["opens"]
    for s in got.stats:
        assert s["placement"]["copies"] + s["placement"]["copy_failures"] == (
            s["pfs"]["opens_by_daemon"] + s["peer"]["fetches"])
    # the home rule: a node's tiers hold more than its share, so every file has a home, which
    # reads it from the PFS once and keeps it; the others ask it.  From the third epoch the relay
    # rule: the node that read a file in the second epoch holds it until its next reader fetched
    # it (NOTE [relay]).  The daemons read each file from the PFS once, plus one for each fetch a
    # peer could not serve (counted by reason)
    relays = [p["relay"] for p in peers]
    assert all(r is not None for r in relays), relays
    assert sum(r["holds"] for r in relays) > 0 and sum(r["handed"] for r in relays) > 0, relays
    fallbacks = sum(sum(p["fallbacks"].values()) for p in peers)
    daemon_opens = sum(s["pfs"]["opens_by_daemon"] for s in got.stats)
    assert daemon_opens == FILES + fallbacks, [(p["fallbacks"], s["epochs"]) for p, s in zip(peers, got.stats)]
    assert fallbacks <= FILES // 4
    # and the job reads the PFS about once per file: those, and the reads that came before their copy
    assert got_pfs["bytes"] <= 5 * D // 4, [s["epochs"] for s in got.stats]
    wait_for(lambda: all(multinode.tier_files(tmp_path / "peers", n) == 0 for n in range(nodes)), "tiers removed")
    # torchrun's scratch went to each node's TMPDIR under the test's directory, not /tmp
    assert all(multinode.torchelastic_dirs(tmp_path / tag, n) for tag in ("ref", "peers") for n in range(nodes))


def test_one_tier_run_per_rank_two_ranks_on_each_of_two_nodes(tmp_path: Path, pfs: SlowFs):
    """Launch form 2: no torchrun, each rank started with torchrun's variables
    under its own tier-run; the two tier-runs of a node share one service
    (each node has a /dev/shm of its own, as real nodes do)."""
    kw = dict(form=2, ranks_per_node=2)
    with netns.emulated_nodes(2, net=32) as net:
        ref, ref_pfs = run(pfs, spec(tmp_path, pfs.path, "pfs", "ref2", **kw), net)
        got, got_pfs = run(pfs, spec(tmp_path, pfs.path, "peers", "peers2", **kw), net)
    assert len(got.codes) == 4
    assert samples(got) == samples(ref) == multinode.expected_samples(pfs.source, 4, EPOCHS, 11)
    assert all(len(r) == EPOCHS and all(n == FILES // 4 for n, _ in r) for r in samples(ref))
    assert len({r["weights"] for r in ref.ranks + got.ranks}) == 1
    assert ref_pfs == {"opens": EPOCHS * FILES, "bytes": EPOCHS * D}
    services = [s["node_service"] for s in got.stats]
    assert services[0]["pid"] == services[1]["pid"] != services[2]["pid"] == services[3]["pid"]
    assert [s["started_here"] for s in services[:2]].count(True) == 1
    assert [s["started_here"] for s in services[2:]].count(True) == 1
    peers = [s["peer"] for s in got.stats]
    assert [(p["met"], p["linked"], p["planned"], p["node_rank"]) for p in peers] == (
        [(True, True, True, 0)] * 2 + [(True, True, True, 1)] * 2)
    # the node's counters (the service's, all ranks'), in the snapshot of the member that ended last
    node_peer = [max(peers[:2], key=lambda p: p["bytes"]), max(peers[2:], key=lambda p: p["bytes"])]
    assert sum(p["bytes"] for p in node_peer) > 0
    assert all(p["fetches"] * SIZE == p["bytes"] == p["client"].get("bytes", 0) for p in node_peer)
    assert got_pfs["bytes"] < 2 * D
    wait_for(lambda: all(multinode.tier_files(tmp_path / "peers2", n) == 0 for n in range(2)), "tiers removed")
    assert [list((tmp_path / "peers2" / f"shm{n}").iterdir()) for n in range(2)] == [[], []]


# -- faults across nodes ------------------------------------------------------------------

def nodes_met(work: Path, nodes: int = 2) -> bool:
    """Every node's entry, with its proof, is in the job directory."""
    entries = list((work / "rdzv").glob("tiering-job-*/node-*.json"))
    try:
        return len(entries) == nodes and all(json.loads(e.read_text()).get("proof") for e in entries)
    except (OSError, ValueError):
        return False


def service_pid(work: Path, node: int) -> int | None:
    """The pid of node `node`'s service (launch form 2), once it is ready."""
    for rec in (work / f"shm{node}").glob("tiering.node-*/service.json"):
        try:
            info = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if info.get("ready"):
            return int(info["pid"])
    return None


def test_a_node_whose_service_is_killed_leaves_the_others_on_the_pfs(tmp_path: Path, pfs: SlowFs):
    """Node 1's service is SIGKILLed once the nodes have met: node 0's fetches
    from it fail at once and are read from the PFS, node 1's ranks read the
    PFS; every rank reads the same bytes and the job finishes."""
    s = spec(tmp_path, pfs.path, "peers", "kill", form=2, ranks_per_node=2)
    killed: list[int] = []

    def fault(procs) -> None:
        wait_for(lambda: nodes_met(s.work), "the nodes' rendezvous")
        pid = wait_for(lambda: service_pid(s.work, 1), "node 1's service")
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    with netns.emulated_nodes(2, net=33) as net:
        got, got_pfs = run(pfs, s, net, during=fault)
    assert killed
    assert samples(got) == multinode.expected_samples(pfs.source, 4, EPOCHS, s.seed)
    assert len({r["weights"] for r in got.ranks}) == 1
    node0 = max((st["peer"] for st in got.stats[:2]), key=lambda p: sum(p["fallbacks"].values()))
    assert node0["bytes"] == 0 and sum(node0["fallbacks"].values()) > 0, node0
    assert set(node0["fallbacks"]) <= {"error", "absent", "deadline"}, node0
    assert node0["server"]["refused"] == 0


def test_a_stopped_node_costs_the_others_a_deadline_per_file_then_the_pfs(tmp_path: Path, pfs: SlowFs):
    """Node 1's tier-run (its peer server) is SIGSTOPped once the nodes have
    met (its COMMAND runs on), and continued when node 0's tier-run has
    finished: node 0 gives up each fetch from it at the deadline and reads the
    PFS; the job finishes with the same bytes."""
    s = spec(tmp_path, pfs.path, "peers", "stop")
    stopped: list[int] = []

    def fault(procs) -> None:
        wait_for(lambda: nodes_met(s.work), "the nodes' rendezvous")
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped.append(procs[1].pid)
        try:
            wait_for(lambda: (s.work / "stats-0.json").exists(), "node 0's tier-run to finish", timeout=300)
        finally:
            os.kill(procs[1].pid, signal.SIGCONT)

    with netns.emulated_nodes(2, net=34) as net:
        got, got_pfs = run(pfs, s, net, during=fault)
    assert stopped
    assert samples(got) == multinode.expected_samples(pfs.source, 2, EPOCHS, s.seed)
    assert len({r["weights"] for r in got.ranks}) == 1
    node0 = got.stats[0]["peer"]
    assert node0["bytes"] == 0 and node0["fallbacks"].get("deadline", 0) > 0, node0
    assert node0["client"].get("deadline", 0) == node0["fallbacks"]["deadline"]


def test_nodes_whose_tiers_differ_agree_on_the_homes(tmp_path: Path, pfs: SlowFs):
    """Node 0's tier is half node 1's, below what it reads in the first
    epoch: each node publishes its own budget, both compute the homes from
    both budgets, so node 1 never asks node 0 for a file node 0 does not
    keep (no "absent"), and the training reads the same samples."""
    with netns.emulated_nodes(2, net=39) as net:
        got, got_pfs = run(pfs, spec(tmp_path, pfs.path, "peers", "uneven", capacities=[D // 2, D]), net)
    assert samples(got) == multinode.expected_samples(pfs.source, 2, EPOCHS, 11)
    peers = [s["peer"] for s in got.stats]
    budgets = [p["budget"] for p in peers]
    # each node's tiers less its window, from the data set's mean allocation (SIZE: whole blocks)
    assert budgets == [home_budget([D // 2], SIZE), home_budget([D], SIZE)]
    assert budgets[0] < D // 2 < budgets[1]                      # node 0 cannot home all it reads first
    assert [p["budgets"] for p in peers] == [budgets, budgets]   # every node knows every node's
    homes = peers[0]["homes"]
    assert peers[1]["homes"] == homes and 0 < homes[0] < FILES // 2 == homes[1]   # the same homes on both
    assert all(p["planned"] and p["linked"] for p in peers)
    assert sum(p["bytes"] for p in peers) > 0
    assert all(p["fallbacks"].get("absent", 0) <= 2 for p in peers), [p["fallbacks"] for p in peers]
    wait_for(lambda: all(multinode.tier_files(tmp_path / "uneven", n) == 0 for n in range(2)), "tiers removed")
