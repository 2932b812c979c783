"""One placement service per node: several tier-runs of one job on one node
elect it, attach to it, and it outlives every member but the last, whoever
exits or is killed first."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import EVENT_TIMEOUT
from tiering.cluster import nodelock

NODE = Path(__file__).resolve().parent / "cluster_node.py"


class Member:
    """A member process: it joins at start and leaves when told."""

    def __init__(self, tmp: Path, job: str = "job1", fail: bool = False):
        args = [sys.executable, str(NODE), "member", "--parent", str(tmp / "node"), "--job", job,
                "--tier-parent", str(tmp / "tiers"), "--log", str(tmp / "service.log")]
        self.proc = subprocess.Popen(args + (["--fail"] if fail else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self._joined: dict | None = None

    @property
    def joined(self) -> dict:
        if self._joined is None:
            assert self.proc.stdout is not None
            self._joined = json.loads(self.proc.stdout.readline())
        return self._joined

    def leave(self) -> None:
        out, _ = self.proc.communicate("leave\n", timeout=60)
        assert json.loads(out.splitlines()[-1]) == {"left": True}
        assert self.proc.returncode == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def workdir(tmp_path: Path):
    (tmp_path / "node").mkdir()
    (tmp_path / "tiers").mkdir()
    members: list[Member] = []
    yield tmp_path, members
    for m in members:
        if m.proc.poll() is None:
            m.kill()
    for line in _log(tmp_path):   # no service outlives the test
        pid = int(line.split()[1])
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)


def _log(tmp: Path) -> list[str]:
    path = tmp / "service.log"
    return path.read_text().splitlines() if path.exists() else []


def _wait_gone(pid: int) -> None:
    """Until pid has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs after 30 s")


@pytest.mark.slow
def test_one_service_serves_every_member_and_outlives_all_but_the_last(workdir):
    tmp, members = workdir
    members += [Member(tmp) for _ in range(4)]
    joined = [m.joined for m in members]
    assert sum(j["started"] for j in joined) == 1
    assert len({j["service_pid"] for j in joined}) == 1
    tier = Path(joined[0]["info"]["tier"])
    assert all(j["info"] == {"tier": str(tier)} for j in joined)
    service_pid = joined[0]["service_pid"]
    assert service_pid not in [m.proc.pid for m in members]      # a process of its own

    starter = next(m for m, j in zip(members, joined) if j["started"])
    starter.kill()                                   # the first one dies early
    late = Member(tmp)                               # a member joining now finds the same service
    members.append(late)
    assert late.joined["service_pid"] == service_pid and not late.joined["started"]
    others = [m for m in members if m is not starter]
    others[0].kill()                                 # another one is killed
    assert (tier / "copy.bin").read_bytes() == b"x" * 100
    for m in others[1:-1]:
        m.leave()
    assert psutil.pid_exists(service_pid) and tier.exists()
    others[-1].leave()                               # the last one out
    _wait_gone(service_pid)
    assert not tier.exists()
    assert not Path(joined[0]["dir"]).exists()       # the node directory is gone too
    assert _log(tmp) == [f"start {service_pid}", f"stop {service_pid} unused"]


@pytest.mark.slow
def test_the_service_stops_when_every_member_is_killed(workdir):
    tmp, members = workdir
    members += [Member(tmp) for _ in range(3)]
    pid = members[0].joined["service_pid"]
    tier = Path(members[0].joined["info"]["tier"])
    assert all(m.joined["service_pid"] == pid for m in members)
    for m in members:
        m.kill()
    _wait_gone(pid)
    assert not tier.exists()
    assert _log(tmp) == [f"start {pid}", f"stop {pid} unused"]


@pytest.mark.slow
def test_a_dead_service_is_replaced_by_the_next_member(workdir):
    tmp, members = workdir
    members.append(Member(tmp))
    first = members[0].joined["service_pid"]
    os.kill(first, signal.SIGKILL)
    _wait_gone(first)
    members.append(Member(tmp))
    second = members[1].joined
    assert second["started"] and second["service_pid"] != first
    for m in members:
        m.leave()
    _wait_gone(second["service_pid"])
    assert _log(tmp)[-1] == f"stop {second['service_pid']} unused"


@pytest.mark.slow
def test_a_stopped_service_withdraws_and_members_carry_on(workdir):
    tmp, members = workdir
    members += [Member(tmp), Member(tmp)]
    pid = members[0].joined["service_pid"]
    assert members[1].joined["service_pid"] == pid
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    assert _log(tmp)[-1] == f"stop {pid} stopped"
    assert all(m.proc.poll() is None for m in members)
    members.append(Member(tmp))                      # a newcomer starts a new service
    assert members[2].joined["started"] and members[2].joined["service_pid"] != pid
    for m in members:
        m.leave()


@pytest.mark.slow
def test_a_member_joining_while_the_last_one_leaves_never_gets_a_withdrawn_service(workdir):
    tmp, members = workdir
    for _ in range(4):
        first = Member(tmp)
        members.append(first)
        assert first.joined["alive"]
        second = Member(tmp)                         # joins while the first leaves
        members.append(second)
        first.leave()
        assert second.joined["alive"], second.joined  # attached to a service in force
        tier = Path(second.joined["info"]["tier"])
        assert (tier / "copy.bin").exists()
        second.leave()
        _wait_gone(second.joined["service_pid"])
    starts = [line for line in _log(tmp) if line.startswith("start")]
    stops = [line for line in _log(tmp) if line.startswith("stop")]
    assert len(starts) == len(stops) and 4 <= len(starts) <= 8


def test_the_last_member_out_sees_itself_last_while_the_service_withdraws(tmp_path, monkeypatch):
    """The service withdraws holding elect.lock and members.lock while it
    removes the node directory's files (elect.lock last): the last member
    leaving at that moment is the last one, and waits for the service's
    clean-up; another member's shared lock still means it is not.  The
    service here withdraws once the member has found elect.lock held."""
    d = tmp_path / "node"
    d.mkdir(mode=0o700)
    for name in ("elect.lock", "members.lock"):
        (d / name).touch()
    m = nodelock.Membership(d, False, os.getpid(), {})
    other = nodelock._Flock(d / "members.lock", fcntl.LOCK_SH, None, "")
    assert not m._no_member_left()
    other.release()
    elect, members = nodelock._try_exclusive(d / "elect.lock"), nodelock._try_exclusive(d / "members.lock")
    assert elect is not None and members is not None

    found_held = threading.Event()   # the member tried elect.lock while the service holds it
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        try:
            real_flock(fd, op)
        except BlockingIOError:
            if os.readlink(f"/proc/self/fd/{fd}").endswith("/elect.lock"):
                found_held.set()
            raise
    monkeypatch.setattr(nodelock.fcntl, "flock", flock)

    def withdraw() -> None:
        assert found_held.wait(EVENT_TIMEOUT)   # the member looks meanwhile (after this, it finds the files gone)
        (d / "members.lock").unlink()
        (d / "elect.lock").unlink()
        members.release()
        elect.release()
    t = threading.Thread(target=withdraw)
    t.start()
    try:
        assert m._no_member_left()
    finally:
        t.join()
    assert found_held.is_set()


@pytest.mark.slow
def test_other_jobs_get_their_own_service(workdir):
    tmp, members = workdir
    members += [Member(tmp, job="a"), Member(tmp, job="b")]
    assert members[0].joined["started"] and members[1].joined["started"]
    assert members[0].joined["service_pid"] != members[1].joined["service_pid"]
    for m in members:
        m.leave()


def test_a_service_that_fails_to_start_is_a_clear_error(workdir):
    tmp, members = workdir
    members.append(Member(tmp, fail=True))
    err = members[0].joined["error"]
    assert "exited before it was ready" in err and "service set-up failed: no room" in err
    assert members[0].proc.wait(30) == 1


def _exited_at_once(directory: Path) -> int:
    """A starter whose service wrote its job file and log and exited (reaped)
    before join looks at it."""
    (directory / nodelock.JOB_FILE).write_text("{}")
    with open(directory / nodelock.LOG_FILE, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no room on the tier')"], stderr=log)
    assert proc.wait(60) == 1
    return proc.pid


def _failed_spawn(directory: Path) -> int:
    (directory / nodelock.JOB_FILE).write_text("{}")
    (directory / nodelock.LOG_FILE).write_text("sh: tiering.cluster.service: not found\n")
    raise nodelock.NodeLockError("cannot start the node's tiering service")


@pytest.mark.parametrize("start, message", [(_exited_at_once, "exited at once: no room on the tier"),
                                            (_failed_spawn, "cannot start")])
def test_a_failed_start_leaves_no_node_directory(tmp_path, start, message):
    key = nodelock.NodeKey("tester", "job1", ("/pfs",))
    with pytest.raises(nodelock.NodeLockError, match=message):
        nodelock.join(key, start, timeout=30, parent=str(tmp_path))
    assert not nodelock.node_dir(key, str(tmp_path)).exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["mode", "owner", "symlink"])
def test_a_node_directory_not_private_to_the_user_is_refused(tmp_path, how):
    key = nodelock.NodeKey("tester", "job1", ("/pfs",))
    path = nodelock.node_dir(key, str(tmp_path))
    if how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir(mode=0o755 if how == "mode" else 0o700)
        os.chmod(path, 0o755 if how == "mode" else 0o700)
        if how == "owner":
            os.chown(path, 65534, 65534)
    with pytest.raises(nodelock.NodeLockError, match="is not a private directory of this user.*remove it"):
        nodelock.join(key, nodelock.spawn_detached(["false"]), timeout=5, parent=str(tmp_path))


def test_the_key_covers_user_job_and_data_roots():
    a = nodelock.NodeKey("u", "j", ("/a", "/b"))
    assert a.digest() == nodelock.NodeKey("u", "j", ("/b", "/a")).digest()
    assert len({a.digest(), nodelock.NodeKey("v", "j", ("/a", "/b")).digest(),
                nodelock.NodeKey("u", "k", ("/a", "/b")).digest(),
                nodelock.NodeKey("u", "j", ("/a",)).digest()}) == 4


@pytest.mark.slow
def test_a_member_that_waits_too_long_for_the_groups_lock_gets_a_clear_error(tmp_path):
    key = nodelock.NodeKey("tester", "job1", ("/pfs",))
    path = nodelock.node_dir(key, str(tmp_path))
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    fd = os.open(path / "elect.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)          # a member that hangs while holding it
    try:
        with pytest.raises(nodelock.NodeLockError, match="waiting for this node's tiering service: .* stayed locked"):
            nodelock.join(key, nodelock.spawn_detached(["false"]), timeout=0.5, parent=str(tmp_path))
    finally:
        os.close(fd)
