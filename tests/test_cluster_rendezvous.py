"""The nodes of a job meet in a shared job directory: every node learns every
node's address and the one secret; missing nodes, stale files of an earlier
run and directories that are not private are clear errors."""
from __future__ import annotations

import json
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tiering.cluster.identity import NodeIdentity
from tiering.cluster.rendezvous import JobDirectory, Meeting, RendezvousError

NAMES = ("n0", "n1", "n2")


def node(base: Path, rank: int, count: int = 3, job: str = "slurm-7.0") -> JobDirectory:
    return JobDirectory(base, NodeIdentity(job, rank, count, node_names=NAMES[:count], source="slurm"), poll=0.02)


def meet_all(nodes: list[JobDirectory], timeout: float = 30) -> list[Meeting]:
    with ThreadPoolExecutor(len(nodes)) as pool:
        futures = [pool.submit(n.meet, f"10.0.0.{n.ident.node_rank + 1}:{5000 + n.ident.node_rank}", timeout)
                   for n in nodes]
        return [f.result() for f in futures]


def test_every_node_learns_every_address_and_the_one_secret(tmp_path):
    nodes = [node(tmp_path, r) for r in range(3)]
    meetings = meet_all(nodes)
    assert len({m.secret for m in meetings}) == 1 and len(meetings[0].secret) == 32
    assert all(m.peers == meetings[0].peers for m in meetings)
    assert [(p.rank, p.address) for p in meetings[0].peers] == [(0, "10.0.0.1:5000"), (1, "10.0.0.2:5001"),
                                                                (2, "10.0.0.3:5002")]
    job_dir = nodes[0].path
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((job_dir / "secret").stat().st_mode) == 0o600
    assert bytes.fromhex((job_dir / "secret").read_text()) == meetings[0].secret
    assert meetings[0].secret.hex() not in "".join(os.environ.values())
    for n in nodes:
        n.close()
    assert not job_dir.exists()


@pytest.mark.slow
def test_a_node_that_does_not_show_up_is_named_after_the_timeout(tmp_path):
    nodes = [node(tmp_path, 0), node(tmp_path, 2)]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(n.meet, "h:1", 1.0) for n in nodes]
        errors = []
        for f in futures:
            with pytest.raises(RendezvousError) as e:
                f.result()
            errors.append(str(e.value))
    for err in errors:
        assert "after 1 s still waiting for node 1 (n1) (2 of 3 nodes met in" in err
        assert "shared by every node" in err or "node-local file system" in err


@pytest.mark.slow
def test_without_node_0_the_secret_is_missing(tmp_path):
    with pytest.raises(RendezvousError, match=r"node 0 \(n0\) has not written the job's secret"):
        node(tmp_path, 1).meet("h:1", 0.5)


@pytest.mark.slow
def test_files_of_an_earlier_run_of_the_same_job_are_never_used(tmp_path):
    old = [node(tmp_path, r, 2) for r in range(2)]
    old_meeting = meet_all(old)[0]
    stale = tmp_path / "stale"
    shutil.copytree(old[0].path, stale)            # as a crashed run leaves it
    # node 1 of the new run starts first: the old secret and entries are there, but no ack of its nonce
    with pytest.raises(RendezvousError, match="still waiting for node 0"):
        node(tmp_path, 1, 2).meet("10.9.9.9:1", 0.5)
    shutil.rmtree(old[0].path)
    shutil.copytree(stale, old[0].path)
    new = meet_all([node(tmp_path, r, 2) for r in range(2)])
    assert new[0].secret == new[1].secret != old_meeting.secret
    assert [p.address for p in new[1].peers] == ["10.0.0.1:5000", "10.0.0.2:5001"]


@pytest.mark.slow
def test_an_entry_without_a_valid_proof_is_ignored(tmp_path):
    n0 = node(tmp_path, 0, 2)
    n0.path.mkdir(mode=0o700, parents=True)
    fake = n0.path / "node-1.json"
    fake.write_text(json.dumps({"rank": 1, "host": "x", "address": "6.6.6.6:1", "nonce": "n", "proof": "00" * 32}))
    os.chmod(fake, 0o600)
    with pytest.raises(RendezvousError, match=r"still waiting for node 1 \(n1\)"):
        n0.meet("h:1", 0.5)


def test_directories_and_files_that_are_not_private_are_refused(tmp_path):
    open_base = tmp_path / "open"
    open_base.mkdir()
    os.chmod(open_base, 0o777)
    with pytest.raises(RendezvousError, match="written by other users without the sticky bit"):
        node(open_base, 0).meet("h:1", 1)
    planted = node(tmp_path, 1)
    planted.path.mkdir(mode=0o700)
    os.chown(planted.path, 65534, 65534)
    with pytest.raises(RendezvousError, match="is not a private directory of this user"):
        planted.meet("h:1", 1)
    os.chown(planted.path, os.getuid(), os.getgid())
    (planted.path / "secret").write_text("ab" * 32)
    os.chmod(planted.path / "secret", 0o644)
    with pytest.raises(RendezvousError, match="is not a private file of this user"):
        planted.meet("h:1", 1)


def test_a_job_id_is_needed(tmp_path):
    with pytest.raises(RendezvousError, match="needs a job id"):
        JobDirectory(tmp_path, NodeIdentity("", 0, 2))


def test_every_node_learns_every_node_s_budget_and_an_altered_one_is_not_proven(tmp_path):
    nodes = [node(tmp_path, r, 2) for r in range(2)]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(n.meet, f"10.0.0.{r + 1}:5000", 30, None, (r + 1) << 30) for r, n in enumerate(nodes)]
        meetings = [f.result() for f in futures]
    assert [[p.budget for p in m.peers] for m in meetings] == [[1 << 30, 2 << 30]] * 2
    entry = json.loads((nodes[0].path / "node-1.json").read_text())
    assert JobDirectory._proven(entry, meetings[0].secret)
    for budget in (3 << 30, -1, "1", None, True):
        assert not JobDirectory._proven({**entry, "budget": budget}, meetings[0].secret)
    for n in nodes:
        n.close()
