"""Private directories: which parents are safe to make them in (NOTE [tier
directories]), the owner records, and the sweep of dead jobs' leftovers."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import (
    OTHER_UID,
    as_other_user,
    dataset,
    dead_job_dirs,
    rewrite_owner,
    sweep_with_boot_time_off,
    tier_run,
    wait_for,
)
from tiering import rundirs
from tiering.rundirs import (
    UnsafeParent,
    make_private_dir,
    parent_problem,
    remove_in_background,
    start_ticks,
    still_runs,
    sweep_leftovers,
)


def mkdir(path: Path, mode: int) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A directory whose ancestors are all safe (pytest's tmp_path)."""
    assert parent_problem(str(tmp_path)) is None
    return tmp_path


# -- which parents are safe ------------------------------------------------------

def test_a_private_or_sticky_parent_is_safe(base):
    assert parent_problem(str(mkdir(base / "private", 0o700))) is None
    assert parent_problem(str(mkdir(base / "sticky", 0o1777))) is None
    assert parent_problem(str(mkdir(base / "shared-readable", 0o755))) is None


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(base, mode):
    hostile = mkdir(base / "hostile", mode)
    problem = parent_problem(str(hostile))
    assert problem == f"{hostile} is writable by other users and has no sticky bit (mode {mode:04o})"
    # an ancestor counts as much as the parent itself
    inner = mkdir(hostile / "mine", 0o700)
    assert parent_problem(str(inner)) == problem
    with pytest.raises(UnsafeParent, match="use a sticky directory such as /tmp"):
        make_private_dir(str(inner), "u")
    assert list(inner.iterdir()) == []


def test_a_parent_of_another_user_is_refused(base):
    theirs = mkdir(base / "theirs", 0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert parent_problem(str(theirs / ".")) == f"{theirs} belongs to uid {OTHER_UID}"
    assert parent_problem(str(theirs)) == f"{theirs} belongs to uid {OTHER_UID}"


def test_symlinks_on_the_way_are_followed_and_must_be_trusted(base):
    hostile = mkdir(base / "hostile", 0o777)
    mine = mkdir(base / "mine", 0o700)
    (base / "to-hostile").symlink_to(hostile / ".." / "hostile")
    assert "hostile is writable by other users" in parent_problem(str(base / "to-hostile"))
    (base / "to-mine").symlink_to("mine")
    assert parent_problem(str(base / "to-mine")) is None
    (base / "their-link").symlink_to(mine)
    os.lchown(base / "their-link", OTHER_UID, OTHER_UID)
    assert parent_problem(str(base / "their-link")) == f"{base / 'their-link'} is a symlink that belongs to uid {OTHER_UID}"
    (base / "loop").symlink_to("loop")
    assert "too many symlinks" in parent_problem(str(base / "loop"))
    assert "No such file" in parent_problem(str(base / "missing" / "x"))


def test_why_a_hostile_parent_is_refused(base):
    """The attack: another user renames a live private directory away and
    plants a look-alike.  Possible in a parent others can write to without the
    sticky bit, impossible with it."""
    for mode, possible in ((0o777, True), (0o1777, False)):
        parent = mkdir(base / f"parent-{mode:o}", mode)
        live = parent / "tiering-u-1-live"
        live.mkdir(mode=0o700)

        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)   # the other user may not search tmp_path

        def swap(fd: int = fd, name: str = live.name) -> None:
            os.rename(name, "moved-away", src_dir_fd=fd, dst_dir_fd=fd)
            os.mkdir(name, dir_fd=fd)

        try:
            assert (as_other_user(swap) == 0) is possible
        finally:
            os.close(fd)
        assert (parent / "moved-away").exists() is possible and live.exists()
        assert (parent_problem(str(parent)) is None) is not possible


# -- owner records and the sweep -------------------------------------------------

def test_owner_record_has_the_exact_start_time(base):
    d = make_private_dir(str(base), "u")
    assert d.name.startswith(f"tiering-u-{os.getpid()}-") and (d.stat().st_mode & 0o777) == 0o700
    owner = json.loads((d / "owner.json").read_text())
    assert owner["pid"] == os.getpid() and owner["start"] == start_ticks(os.getpid()) is not None
    assert owner["host"] == socket.gethostname()
    assert owner["made_by"] == "tier-run" and owner["name"] == d.name and owner["inode"] == d.stat().st_ino
    assert sorted(p.name for p in d.iterdir()) == ["owner.json"]


def test_still_runs_knows_a_reused_pid_and_a_zombie():
    me = os.getpid()
    assert still_runs(me, start_ticks(me)) and not still_runs(me, start_ticks(me) - 1)
    assert not still_runs(me, None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = start_ticks(child.pid)
    assert start is not None
    wait_for(lambda: rundirs._proc_stat(child.pid)[0] == "Z", "the child to exit")   # a zombie until waited for
    assert start_ticks(child.pid) == start and not still_runs(child.pid, start)
    child.wait()
    assert not still_runs(child.pid, start)


def test_a_live_job_survives_a_sweep_that_sees_boot_time_one_second_off(base):
    """Another tier-run of the same user sweeps while this job runs, and its
    clock puts the boot (and so every process's start) one second later:
    /proc/stat's btime is recomputed from the wall clock at every read, so an
    NTP step moves it.  Start times in clock ticks do not move."""
    live = make_private_dir(str(base), "u")
    assert sweep_with_boot_time_off(base, "u") == [] and live.exists()


def write_owner(d: Path, **record: object) -> Path:
    """A directory with an owner record written by hand, as older versions wrote it (no marker)."""
    d.mkdir(mode=0o700)
    (d / "owner.json").write_text(json.dumps(record))
    return d


def test_the_sweep_removes_dead_jobs_only(base):
    dead, reused, last_boot, no_start, other_host, other_pidns, dead_no_start = dead_job_dirs(base, "u", 7)
    dead_pid = json.loads((dead / "owner.json").read_text())["pid"]
    me = {"pid": os.getpid(), "start": start_ticks(os.getpid())}
    keep = [
        make_private_dir(str(base), "u"),                                            # this process
        rewrite_owner(other_host, host="elsewhere"),
        rewrite_owner(other_pidns, pidns=-1),
        rewrite_owner(no_start, pid=os.getpid(), start=None),                        # no start: the pid alone
        mkdir(base / "tiering-u-1-being-made", 0o700),                               # no record yet
    ]
    gone = [
        dead,
        rewrite_owner(reused, **{**me, "start": int(me["start"]) - 1}),               # type: ignore[call-overload]
        rewrite_owner(last_boot, **me, boot="another-boot"),
        rewrite_owner(dead_no_start, start=None),
    ]
    assert all(json.loads((d / "owner.json").read_text())["pid"] == dead_pid for d in (other_host, dead_no_start))
    (base / "tiering-u-1-partial").mkdir(mode=0o700)
    (base / "tiering-u-1-partial" / "owner.json").write_text('{"pid": ')          # being written
    keep.append(base / "tiering-u-1-partial")
    (base / "tiering-u-1-a-file").write_text("not a directory")
    removed = sweep_leftovers([str(base), str(base)], "u")
    assert sorted(removed) == sorted(gone)
    assert all(d.exists() for d in keep) and not any(d.exists() for d in gone)
    assert (base / "tiering-u-1-a-file").exists()


def _tree(d: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def test_a_directory_tier_run_did_not_provably_make_is_never_swept(base):
    """Only a directory whose owner record carries the marker, and names
    that directory itself (its name and inode), is tier-run's: whatever the
    name and age of any other, it stays."""
    hour_ago = time.time() - 3600
    staged = base / "tiering-u-mydata"                         # a data set staged by hand
    dataset(staged, n=5)
    lost = mkdir(base / "tiering-u-1-lost-record", 0o700)      # a forged-looking name, no record
    first = dead_job_dirs(base, "u")[0]
    dead_pid = json.loads((first / "owner.json").read_text())["pid"]
    older = write_owner(base / f"tiering-u-{dead_pid}-oldversion", pid=dead_pid, start=1,
                        **{k: rundirs._where()[k] for k in ("host", "boot", "pidns")})
    (older / "data").mkdir()
    (older / "data" / "keep.bin").write_bytes(b"k" * 10)
    a, b, c = dead_job_dirs(base, "u", 3)
    copied = base / "tiering-u-1-copied"                       # a copy of a dead job's directory
    shutil.copytree(a, copied)
    elsewhere = mkdir(base / "elsewhere", 0o700)
    shutil.copytree(b, elsewhere / b.name)                     # same name, another inode
    renamed = base / "tiering-u-mydata2"                       # a dead job's directory renamed
    os.rename(c, renamed)
    strays = [staged, lost, older, copied, elsewhere / b.name, renamed]
    for d in strays:
        os.utime(d, (hour_ago, hour_ago))
    before = {d: _tree(d) for d in strays}
    assert sorted(sweep_leftovers([str(base), str(elsewhere)], "u")) == sorted([first, a, b])
    assert {d: _tree(d) for d in strays} == before


def test_an_owner_record_that_is_not_a_plain_file_is_not_read(base):
    """A fifo where the record would be: a sweep that opened it would wait forever."""
    d = mkdir(base / "tiering-u-1-fifo", 0o700)
    os.mkfifo(d / "owner.json")
    dead = dead_job_dirs(base, "u")
    assert sweep_with_boot_time_off(base, "u", 0.0) == [str(dead[0])]
    assert (d / "owner.json").exists()


def test_the_sweep_leaves_data_roots_and_what_holds_them_or_is_in_them(base):
    a, b, c, d = dead_job_dirs(base, "u", 4)
    (base / "to-c").symlink_to(c)
    assert sweep_leftovers([str(base)], "u", data=[str(base)]) == []             # every candidate is in it
    assert sweep_leftovers([str(base)], "u", data=["/"]) == []
    data = [str(a), str(b / "data"), str(base / "to-c")]                         # is one; holds one; one by a link
    assert sweep_leftovers([str(base)], "u", data=data) == [d]
    assert all((p / "data" / "copy.bin").read_bytes() == b"x" * 100 for p in (a, b, c))


def test_the_index_goes_to_the_first_safe_writable_parent(base, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", None)         # gettempdir() reads TMPDIR again
    real = rundirs.parent_problem
    monkeypatch.setattr(rundirs, "parent_problem", lambda p: "unsafe" if p == "/dev/shm" else real(p))
    assert rundirs.index_parent() == str(base)
    monkeypatch.setattr(rundirs, "parent_problem", lambda p: "unsafe")
    assert rundirs.index_parent() == "/dev/shm"            # none is safe: make_private_dir says why
    with pytest.raises(UnsafeParent, match="^/dev/shm: unsafe: another user could rename"):
        make_private_dir(rundirs.index_parent(), "u")


def test_tier_run_refuses_a_hostile_tier_parent_before_the_command_runs(base):
    data = base / "pfs"
    dataset(data, n=2)
    hostile = mkdir(base / "shared", 0o777)
    prof = base / "p.yaml"
    prof.write_text(f"name: t\ntiers:\n  - {{name: ssd, kind: filesystem, path: {hostile}, capacity: 1MiB}}\n")
    ran = base / "ran"
    r = tier_run(["--profile", str(prof), "--data", str(data), "--", "touch", str(ran)])
    assert r.returncode == 2 and not ran.exists()
    assert f"tiers[0].path: path {hostile} is not safe for a private directory" in r.stderr
    assert "use a sticky directory such as /tmp" in r.stderr
    assert list(hostile.iterdir()) == []


# -- background removal (NOTE [background teardown]) ----------------------------

def _fill(d: Path, n: int = 200) -> None:
    for k in range(n):
        f = d / "data" / f"c{k % 7}" / f"f{k}.bin"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * k)
    (d / "staging").mkdir()


def test_background_removal_removes_everything(tmp_path: Path) -> None:
    a, b = make_private_dir(str(tmp_path), "me"), make_private_dir(str(tmp_path), "me")
    _fill(a)
    _fill(b, 3)
    proc = remove_in_background([a, b])
    assert proc is not None
    assert proc.wait(timeout=120) == 0
    assert list(tmp_path.iterdir()) == []


def test_a_running_remover_is_left_alone_and_a_killed_ones_leftovers_are_swept(tmp_path: Path) -> None:
    d = make_private_dir(str(tmp_path), "me")
    _fill(d)
    # a remover that has taken the directory over, stopped before it removed anything
    code = ("import sys, time; from pathlib import Path; from tiering.rundirs import _take_over\n"
            "assert _take_over(Path(sys.argv[1])); print('taken', flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"taken\n"
        assert json.loads((d / "owner.json").read_text())["pid"] == p.pid
        assert sweep_leftovers([str(tmp_path)], "me") == []      # alive: not another job's to remove
        assert (d / "data").is_dir()
    finally:
        p.kill()
        p.wait()
    assert sweep_leftovers([str(tmp_path)], "me") == [d]         # killed: swept like a dead job
    assert list(tmp_path.iterdir()) == []


def test_the_remover_leaves_other_users_and_non_directories_alone(tmp_path: Path) -> None:
    f = tmp_path / "tiering-me-1-file"
    f.write_text("not a directory")
    other = tmp_path / "tiering-me-2-other"
    other.mkdir()
    (other / "keep").write_text("k")
    os.chown(other, 54321, 54321)
    unmarked = tmp_path / "tiering-me-3-unmarked"       # the user's, but tier-run did not make it
    unmarked.mkdir()
    (unmarked / "keep").write_text("k")
    proc = remove_in_background([f, other, unmarked])
    assert proc is not None and proc.wait(timeout=120) == 0
    assert f.read_text() == "not a directory" and (other / "keep").read_text() == "k"
    assert sorted(p.name for p in unmarked.iterdir()) == ["keep"]
