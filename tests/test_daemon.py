"""The placement daemon on its own: publishing, capacity, changed sources,
invalidation races, failures and the PFS concurrency bound."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import make_data, private_dir
from tiering.catalog import scan
from tiering.placement.api import allocation
from tiering.placement.daemon import Daemon
from tiering.placement.index import Root, SharedIndex, lib
from tiering.placement.policies import POLICIES
from tiering.placement.tiers import TierState


def allocated_on_disk(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


class Setup:
    def __init__(self, tmp: Path, files: dict[str, int], capacity: int = 1 << 30, tier_dir: Path | None = None,
                 pfs_threads: int = 4, threads: int = 2, daemon_cls: type[Daemon] = Daemon,
                 links: dict[str, str] | None = None):
        self.data = tmp / "pfs"
        self.contents = make_data(self.data, files)
        for name, target in (links or {}).items():  # "@x": a symlink to x, else a hard link
            if target.startswith("@"):
                (self.data / name).symlink_to(target[1:])
            else:
                os.link(self.data / target, self.data / name)
        self.catalog = scan([str(self.data)])
        run = private_dir(tmp / "run")
        root = tier_dir if tier_dir is not None else tmp / "tier"
        (root / "data").mkdir(parents=True)
        (root / "staging").mkdir()
        self.tier = TierState("ram", "memory", root, capacity, threads)
        self.index, slots = SharedIndex.create(
            run / "index", [Root(self.catalog.roots[0], 0)], [str(self.tier.data)],
            [f.rel for f in self.catalog.files], [0] * len(self.catalog.files),
            [f.size for f in self.catalog.files], [f.mtime_ns for f in self.catalog.files],
            devs=[f.dev for f in self.catalog.files], inos=[f.ino for f in self.catalog.files])
        self.d = daemon_cls(self.index, self.catalog, slots, [self.tier], pfs_threads, POLICIES["off"])
        self.i = {f.rel: k for k, f in enumerate(self.catalog.files)}
        self.d.start()

    def wait(self) -> None:
        deadline = time.monotonic() + 30
        while self.d.copies_in_flight() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self.d.copies_in_flight()

    def state(self, rel: str) -> int:
        return self.index.state(self.d.slots[self.i[rel]])

    def close(self) -> None:
        if not self.d.stopping:
            self.d.stop()
            self.index.close()


@pytest.fixture
def setup_factory(tmp_path):
    made: list[Setup] = []

    def make(**kw) -> Setup:
        s = Setup(tmp_path, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


FILES = {"a/x.bin": 5000, "a/y.bin": 100_000, "b/z.bin": 1, "e.bin": 0, "big.bin": 9_000_000}


def test_placed_copies_are_published_with_exact_accounting(setup_factory):
    s = setup_factory(files=FILES)
    for rel in FILES:
        assert s.d.place(s.i[rel], 0)
    s.wait()
    for rel, data in s.contents.items():
        assert s.state(rel) == 1
        assert (s.tier.data / "0" / rel).read_bytes() == data
    assert s.tier.files == len(FILES)
    assert s.tier.placed_bytes == sum(FILES.values())
    assert s.tier.used == allocated_on_disk(s.tier.data)   # bytes really used, not estimates
    assert s.d.stats.pfs_opens == len(FILES) and s.d.stats.pfs_bytes == sum(FILES.values())
    assert list((s.tier.staging).iterdir()) == []
    # a second place of a placed file is refused
    assert not s.d.place(s.i["a/x.bin"], 0)


def test_eviction_unpublishes_then_deletes(setup_factory):
    s = setup_factory(files=FILES)
    s.d.place(s.i["a/y.bin"], 0)
    s.wait()
    assert s.d.evict(s.i["a/y.bin"])
    assert s.state("a/y.bin") == lib.TIERING_STATE_NONE
    assert not (s.tier.data / "0" / "a/y.bin").exists()
    assert (s.tier.used, s.tier.files, s.tier.placed_bytes) == (0, 0, 0)
    assert not s.d.evict(s.i["a/y.bin"])


def test_source_changed_since_the_scan_is_not_published(setup_factory):
    s = setup_factory(files=FILES)
    src = s.data / "a/x.bin"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))   # same size, new mtime
    (s.data / "b/z.bin").write_bytes(b"longer now")                        # new size
    for rel in ("a/x.bin", "b/z.bin", "a/y.bin"):
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.state("a/x.bin") == s.state("b/z.bin") == lib.TIERING_STATE_NONE
    assert s.state("a/y.bin") == 1
    assert s.d.stats.changed_sources == 2
    assert not (s.tier.data / "0" / "a/x.bin").exists() and not (s.tier.data / "0" / "b/z.bin").exists()
    assert s.tier.used == allocated_on_disk(s.tier.data)


def test_write_invalidation_wins_over_a_copy_in_flight(setup_factory):
    s = setup_factory(files=FILES)
    slot = s.d.slots[s.i["big.bin"]]
    # the shim marks the entry invalid (a write open) before the copy publishes
    assert s.index.cas_state(slot, 0, lib.TIERING_STATE_INVALID)
    assert s.d.place(s.i["big.bin"], 0)
    s.wait()
    assert s.index.state(slot) == lib.TIERING_STATE_INVALID
    assert not (s.tier.data / "0" / "big.bin").exists()
    assert s.tier.used == 0 and s.tier.files == 0


def test_write_event_drops_an_existing_copy(setup_factory):
    s = setup_factory(files=FILES)
    s.d.place(s.i["a/x.bin"], 0)
    s.wait()
    slot = s.d.slots[s.i["a/x.bin"]]
    # what the shim does on a write open: invalidate, then post the event
    s.index.entries[slot].state = lib.TIERING_STATE_INVALID
    r = subprocess.run(["python3", "-c", "pass"])  # something else runs meanwhile
    assert r.returncode == 0
    from tiering.placement.index import Event
    s.d._handle([Event(lib.TIERING_EV_WRITE, slot, 1, 0)])
    assert not (s.tier.data / "0" / "a/x.bin").exists()
    assert s.d.stats.invalidated == 1 and s.tier.used == 0
    assert not s.d.place(s.i["a/x.bin"], 0)


def test_a_write_event_drops_the_copies_of_every_path_of_the_file(setup_factory):
    """NOTE [alias invalidation]: the shim posts one event for the file; the
    daemon drops the copies of its hard links and symlinks too."""
    s = setup_factory(files={"real.bin": 5000, "other.bin": 100},
                      links={"hard.bin": "real.bin", "link.bin": "@real.bin"})
    for rel in ("real.bin", "hard.bin", "link.bin", "other.bin"):
        assert s.d.place(s.i[rel], 0)
    s.wait()
    from tiering.placement.index import Event
    s.d._handle([Event(lib.TIERING_EV_WRITE, s.d.slots[s.i["hard.bin"]], 1, 0)])
    for rel in ("real.bin", "hard.bin", "link.bin"):
        assert not (s.tier.data / "0" / rel).exists(), rel
        assert not s.d.place(s.i[rel], 0), rel
    assert (s.tier.data / "0" / "other.bin").read_bytes() == s.contents["other.bin"]
    assert s.d.stats.invalidated == 3 and s.tier.files == 1


def test_capacity_is_never_exceeded(setup_factory):
    cap = allocation(100_000) + allocation(5000)
    s = setup_factory(files=FILES, capacity=cap)
    assert s.d.fastest_with_room(s.i["big.bin"]) is None
    assert not s.d.place(s.i["big.bin"], 0)
    assert s.d.place(s.i["a/y.bin"], 0) and s.d.place(s.i["a/x.bin"], 0)
    assert not s.d.place(s.i["b/z.bin"], 0)  # reservations count before the copies finish
    s.wait()
    assert s.tier.used <= cap and s.tier.files == 2


def test_vanished_source_is_a_failure_not_a_crash(setup_factory):
    s = setup_factory(files=FILES)
    (s.data / "a/x.bin").unlink()
    s.d.place(s.i["a/x.bin"], 0)
    s.d.place(s.i["a/y.bin"], 0)
    s.wait()
    assert s.d.stats.copy_failures == 1 and s.tier.failures == 1
    assert "a/x.bin" in s.d.stats.errors[0]
    assert s.state("a/y.bin") == 1 and s.tier.used == allocated_on_disk(s.tier.data)


def test_full_device_leaves_no_partial_copy(tmp_path, setup_factory):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"this test mounts a small tmpfs and needs root: {r.stderr}"
    try:
        # the profile claims far more room than the device has
        s = setup_factory(files=FILES, tier_dir=mnt / "tier", capacity=1 << 30)
        for rel in FILES:
            s.d.place(s.i[rel], 0)
        s.wait()
        assert s.state("big.bin") == lib.TIERING_STATE_NONE
        assert s.d.stats.copy_failures >= 1
        assert not (s.tier.data / "0" / "big.bin").exists()
        assert list(s.tier.staging.iterdir()) == []
        for rel in ("a/x.bin", "a/y.bin"):
            if s.state(rel) == 1:
                assert (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert s.tier.used == allocated_on_disk(s.tier.data)
        s.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


class SlowDaemon(Daemon):
    """Counts how many copies read the PFS at once."""
    active = 0
    peak = 0
    guard = threading.Lock()

    def _copy(self, *args):  # type: ignore[no-untyped-def]
        with SlowDaemon.guard:
            SlowDaemon.active += 1
            SlowDaemon.peak = max(SlowDaemon.peak, SlowDaemon.active)
        time.sleep(0.05)  # a slow PFS read, so that the copies overlap
        try:
            return super()._copy(*args)
        finally:
            with SlowDaemon.guard:
                SlowDaemon.active -= 1


def test_pfs_reads_are_bounded_by_the_profile(setup_factory):
    SlowDaemon.active = SlowDaemon.peak = 0
    files = {f"f{i}": 100 for i in range(12)}
    s = setup_factory(files=files, pfs_threads=2, threads=6, daemon_cls=SlowDaemon)
    for rel in files:
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.tier.files == 12
    assert SlowDaemon.peak == 2


def test_stop_cancels_queued_copies_and_releases_their_room(setup_factory):
    files = {f"f{i}": 50_000 for i in range(40)}
    s = setup_factory(files=files, pfs_threads=1, threads=1, daemon_cls=SlowDaemon)
    for rel in files:
        s.d.place(s.i[rel], 0)
    s.d.stop()
    assert not s.d.copies_in_flight()
    assert s.tier.files < 40
    assert s.tier.used == allocated_on_disk(s.tier.data)
    assert not s.d.place(s.i["f39"], 0)


def test_pfs_concurrency_is_reached_with_few_tier_threads(setup_factory):
    SlowDaemon.active = SlowDaemon.peak = 0
    files = {f"f{i}": 100 for i in range(12)}
    s = setup_factory(files=files, pfs_threads=4, threads=1, daemon_cls=SlowDaemon)
    for rel in files:
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.tier.files == 12
    assert SlowDaemon.peak == 4


class HungDaemon(Daemon):
    """Its copies block in the PFS read until released, as on a hung file system."""
    release = threading.Event()
    entered = threading.Event()

    def _copy(self, *args):  # type: ignore[no-untyped-def]
        HungDaemon.entered.set()
        HungDaemon.release.wait()
        return super()._copy(*args)


def test_stop_gives_up_on_a_copy_blocked_in_a_pfs_read(setup_factory):
    HungDaemon.release.clear()
    HungDaemon.entered.clear()
    files = {f"f{i}": 10_000 for i in range(3)}
    s = setup_factory(files=files, pfs_threads=1, threads=1, daemon_cls=HungDaemon)
    for rel in files:
        assert s.d.place(s.i[rel], 0)
    assert HungDaemon.entered.wait(30)  # the first copy is in its read
    try:
        t0 = time.monotonic()
        assert s.d.stop(timeout=0.5) is False
        assert time.monotonic() - t0 < 5
        assert s.d.stuck == 1                   # the queued two were cancelled
        assert s.d.copies_in_flight() == 1
    finally:
        HungDaemon.release.set()                # the read returns: the copy sees the stop
    deadline = time.monotonic() + 10
    while s.d.copies_in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not s.d.copies_in_flight()
    assert s.tier.files == 0 and s.tier.used == 0
    assert allocated_on_disk(s.tier.root) == 0  # no partial copy left
    assert all(s.state(rel) == lib.TIERING_STATE_NONE for rel in files)


def test_stop_returns_true_when_copies_end(setup_factory):
    s = setup_factory(files=FILES)
    for rel in FILES:
        s.d.place(s.i[rel], 0)
    assert s.d.stop() is True and s.d.stuck == 0
