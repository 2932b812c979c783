"""The placement daemon on its own: publishing, capacity, changed sources,
invalidation races, failures and the PFS concurrency bound."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import EVENT_TIMEOUT, make_data, private_dir, staged, sweep_with_boot_time_off, tmpfs_mounted
from tiering.catalog import scan
from tiering.placement.api import allocation
from tiering.placement.daemon import Daemon
from tiering.placement.index import Root, SharedIndex, ffi, lib
from tiering.placement.policies import POLICIES
from tiering.placement.tiers import BATCH_BYTES, TierState
from tiering.rundirs import make_private_dir


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
        root = tier_dir if tier_dir is not None else private_dir(tmp / "tier")
        self.tier = TierState("ram", "memory", root, capacity, threads)   # makes data/ and staging/
        self.index, slots = SharedIndex.create(
            run / "index", [Root(self.catalog.roots[0], 0)], [str(self.tier.data)],
            [f.rel for f in self.catalog.files], [0] * len(self.catalog.files),
            [f.size for f in self.catalog.files], [f.mtime_ns for f in self.catalog.files],
            devs=[f.dev for f in self.catalog.files], inos=[f.ino for f in self.catalog.files])
        self.d = daemon_cls(self.index, self.catalog, slots, [self.tier], pfs_threads, POLICIES["off"])
        self.i = {f.rel: k for k, f in enumerate(self.catalog.files)}
        self.d.start()

    def wait(self) -> None:
        deadline = time.monotonic() + 120
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
    assert staged(s.tier.staging) == []
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


def test_a_source_renamed_over_while_copied_is_a_changed_source(setup_factory, monkeypatch, reliability):
    """NOTE [renamed while copied]: another process renames a new file over
    a/x.bin while its batch copies it (from the copy's progress call, after
    its bytes were read); the old bytes are not published."""
    import tiering.placement.tiers as tiers
    s = setup_factory(files=FILES)
    src = s.data / "a/x.bin"
    real = tiers._transfer_many

    @ffi.callback("int(void *, uint64_t)")
    def progress(arg, n):  # type: ignore[no-untyped-def]
        if src.read_bytes() != b"new bytes":
            (s.data / "a/x.tmp").write_bytes(b"new bytes")
            os.replace(s.data / "a/x.tmp", src)
        return 0

    def transfer_many(b, files, n):  # type: ignore[no-untyped-def]
        b.progress = progress
        return real(b, files, n)
    monkeypatch.setattr(tiers, "_transfer_many", transfer_many)
    assert s.d.place(s.i["a/x.bin"], 0)
    s.wait()
    assert s.state("a/x.bin") == lib.TIERING_STATE_NONE
    assert s.d.stats.changed_sources == 1
    assert not (s.tier.data / "0" / "a/x.bin").exists()
    assert s.tier.used == 0 and s.tier.files == 0
    reliability.survived("a data file renamed over while its copy was in flight (not published)")


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


RUNS = {"a/1.bin": 5000, "a/2.bin": 100, "a/3.bin": 200_000, "b/4.bin": 1, "b/5.bin": 0, "c/6.bin": 9000}


def test_place_many_decides_as_place_does_file_by_file(tmp_path):
    """place_many (the clairvoyant policy's runs of fetches) answers and
    reserves exactly what place() of each file in turn would: a file already
    copied, one queued, one written during the job, a repeat, one too large
    for the room left and a smaller one after it that still fits."""
    from tiering.placement.index import Event
    rels = ["a/1.bin", "a/3.bin", "a/2.bin", "a/1.bin", "b/4.bin", "b/5.bin", "c/6.bin", "a/3.bin"]
    room = sum(allocation(RUNS[r]) for r in ("a/1.bin", "a/2.bin", "b/4.bin", "c/6.bin"))
    results, used = [], []
    for how in ("one by one", "many"):
        s = Setup(private_dir(tmp_path / how), RUNS, capacity=room + allocation(RUNS["b/5.bin"]))
        try:
            assert s.d.place(s.i["b/5.bin"], 0)    # copied before: not placed again
            s.wait()
            slot = s.d.slots[s.i["c/6.bin"]]         # written during the job
            assert s.index.cas_state(slot, 0, lib.TIERING_STATE_INVALID)
            s.d._handle([Event(lib.TIERING_EV_WRITE, slot, 1, 0)])
            before = s.tier.used                      # the copy of b/5 (its blocks on this file system)
            with s.d._waking_later():                 # the copies wait until the block's end
                assert s.d.place(s.i["b/4.bin"], 0)   # queued: not placed again
                ids = [s.i[r] for r in rels]
                if how == "many":
                    got = s.d.place_many(np.array(ids, np.uint64), 0).tolist()
                else:
                    got = [s.d.place(i, 0) for i in ids]
                used.append(s.tier.used - before)
                # plain ints in the queue, not numpy's (the workers compare and look them up one by one)
                assert {type(i) for i, _ in s.d._queued[0]} == {int}
                assert s.d.copies_in_flight() == len(s.d._queued[0]) == 3
            results.append(got)
            s.wait()
            for rel in ("a/1.bin", "a/2.bin", "b/4.bin", "b/5.bin"):
                assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel], rel
            assert s.state("a/3.bin") == 0 and s.state("c/6.bin") == lib.TIERING_STATE_INVALID
            assert s.tier.used == allocated_on_disk(s.tier.data) <= s.tier.capacity
        finally:
            s.close()
    assert results[0] == results[1] == [True, False, True, False, False, False, False, False]
    assert used[0] == used[1] == sum(allocation(RUNS[r]) for r in ("a/1.bin", "a/2.bin", "b/4.bin"))


def test_place_many_matches_place_file_by_file_on_random_runs(tmp_path):
    """400 seeded random runs (files repeated, some queued, copied or written
    before, a tier that fills up part-way): place_many's answers, the
    reservations, the queue in its order and the copies in flight are those
    of place() called file by file from the same state."""
    rng = np.random.default_rng(7)
    sizes = {f"d{k % 3}/f{k}.bin": int(s) for k, s in enumerate(rng.choice([0, 1, 900, 5000, 70_000], 24))}
    s = Setup(tmp_path, sizes, capacity=1 << 40)
    try:
        s.d.close_pools()          # what is placed stays queued
        d, where = s.d, np.frombuffer(s.d._where, np.int8)
        ids_all = np.array([s.i[r] for r in sizes], np.int64)
        rels = {s.i[r]: r for r in sizes}
        for case in range(400):
            queued = rng.choice(ids_all, int(rng.integers(0, 4)), replace=False).tolist()
            copied = rng.choice(ids_all, int(rng.integers(0, 4)), replace=False).tolist()
            written = set(rng.choice(ids_all, int(rng.integers(0, 3)), replace=False).tolist())
            run = rng.choice(ids_all, int(rng.integers(0, 40))).tolist()
            room = int(rng.integers(0, sum(allocation(v) for v in sizes.values()) // 2))
            if case % 2:     # the room of some of the run's files exactly
                room = sum(allocation(sizes[rels[i]]) for i in set(run[:int(rng.integers(0, len(run) + 1))]))
            seen = []
            for how in ("one by one", "many"):
                with d._lock:
                    d._cancel_queued()
                where[:] = -1
                where[[i for i in copied if i not in queued]] = 0
                d._invalid = set(written)
                s.tier.capacity, s.tier.used = 1 << 40, 0
                for i in queued:
                    d.place(i, 0)
                s.tier.capacity = s.tier.used + room
                if how == "many":
                    got = d.place_many(np.array(run, np.int64), 0).tolist()
                else:
                    got = [d.place(i, 0) for i in run]
                seen.append((got, s.tier.used, list(d._queued[0]), d.copies_in_flight(), d._flight.tolist()))
            assert seen[0] == seen[1], case
        assert d.copies_in_flight() == len(d._queued[0])
    finally:
        with s.d._lock:
            s.d._cancel_queued()
        np.frombuffer(s.d._where, np.int8)[:] = -1
        s.d._invalid = set()
        s.close()


def test_place_many_places_nothing_once_the_daemon_stops(setup_factory):
    s = setup_factory(files=RUNS)
    s.d.stop()
    assert not s.d.place_many(np.array([s.i["a/1.bin"], s.i["a/2.bin"]]), 0).any()
    assert s.tier.used == 0


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
    with tmpfs_mounted(mnt, "2m"):
        # the profile claims far more room than the device has
        s = setup_factory(files=FILES, tier_dir=private_dir(mnt / "tier"), capacity=1 << 30)
        for rel in FILES:
            s.d.place(s.i[rel], 0)
        s.wait()
        assert s.state("big.bin") == lib.TIERING_STATE_NONE
        assert s.d.stats.copy_failures >= 1
        assert not (s.tier.data / "0" / "big.bin").exists()
        assert staged(s.tier.staging) == []
        for rel in ("a/x.bin", "a/y.bin"):
            if s.state(rel) == 1:
                assert (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert s.tier.used == allocated_on_disk(s.tier.data)
        s.close()


class SlowDaemon(Daemon):
    """Counts how many copies (a file, or a batch of small ones) read the
    PFS at once.  Each copy waits in its PFS read, bounded, until `target`
    copies have been in it together once; after that, each lingers a little,
    so that a copy beyond the bound would show in the peak (a busy host can
    only hide an overlap then, never make one up)."""
    active = 0
    peak = 0
    target = 1
    cond = threading.Condition()

    @classmethod
    def reset(cls, target: int) -> None:
        cls.active, cls.peak, cls.target = 0, 0, target

    def _copy(self, *args):  # type: ignore[no-untyped-def]
        return self._slowly(super()._copy, *args)

    def _copy_many(self, *args):  # type: ignore[no-untyped-def]
        return self._slowly(super()._copy_many, *args)

    @staticmethod
    def _slowly(copy, *args):  # type: ignore[no-untyped-def]
        c = SlowDaemon
        with c.cond:
            c.active += 1
            c.peak = max(c.peak, c.active)
            c.cond.notify_all()
            if c.peak < c.target:   # a slow PFS read: until target copies are in it at once
                if not c.cond.wait_for(lambda: c.peak >= c.target, timeout=EVENT_TIMEOUT):
                    c.target = 0    # never reached: the peak says so, the other copies do not wait
            else:
                c.cond.wait_for(lambda: c.active > c.target, timeout=0.05)
        try:
            return copy(*args)
        finally:
            with c.cond:
                c.active -= 1


def test_pfs_reads_are_bounded_by_the_profile(setup_factory):
    SlowDaemon.reset(target=2)
    files = {f"f{i}": 100 for i in range(12)}
    s = setup_factory(files=files, pfs_threads=2, threads=6, daemon_cls=SlowDaemon)
    for rel in files:
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.tier.files == 12
    assert SlowDaemon.peak == 2


class StopGatedDaemon(Daemon):
    """Its copies wait in their PFS read (bounded) until stop() was called."""

    def _copy(self, *args):  # type: ignore[no-untyped-def]
        self._stop.wait(EVENT_TIMEOUT)
        return super()._copy(*args)

    def _copy_many(self, *args):  # type: ignore[no-untyped-def]
        self._stop.wait(EVENT_TIMEOUT)
        return super()._copy_many(*args)


def test_stop_cancels_queued_copies_and_releases_their_room(setup_factory):
    files = {f"f{i}": 50_000 for i in range(40)}
    s = setup_factory(files=files, pfs_threads=1, threads=1, daemon_cls=StopGatedDaemon)
    for rel in files:
        s.d.place(s.i[rel], 0)
    s.d.stop()
    assert not s.d.copies_in_flight()
    assert s.tier.files < 40
    assert s.tier.used == allocated_on_disk(s.tier.data)
    assert not s.d.place(s.i["f39"], 0)


def test_pfs_concurrency_is_reached_with_few_tier_threads(setup_factory):
    SlowDaemon.reset(target=4)
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

    def _copy_many(self, *args):  # type: ignore[no-untyped-def]
        HungDaemon.entered.set()
        HungDaemon.release.wait()
        return super()._copy_many(*args)


@pytest.mark.slow
def test_stop_gives_up_on_a_copy_blocked_in_a_pfs_read(setup_factory):
    HungDaemon.release.clear()
    HungDaemon.entered.clear()
    files = {f"f{i}": 10_000 for i in range(3)}
    s = setup_factory(files=files, pfs_threads=1, threads=1, daemon_cls=HungDaemon)
    assert s.d.place(s.i["f0"], 0)
    assert HungDaemon.entered.wait(30)  # the first copy is in its read; the others queue behind it
    for rel in ("f1", "f2"):
        assert s.d.place(s.i[rel], 0)
    try:
        t0 = time.monotonic()
        assert s.d.stop(timeout=0.5) is False
        assert time.monotonic() - t0 < 120   # it did not wait for the blocked copy
        assert s.d.stuck == 1                   # the queued two were cancelled
        assert s.d.copies_in_flight() == 1
    finally:
        HungDaemon.release.set()                # the read returns: the copy sees the stop
    deadline = time.monotonic() + 120
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


# -- a copy is bounded by what was catalogued -------------------------------------

SMALL = {"s/src.bin": 10_000, "s/other.bin": 3000}


def _swap(path: Path, kind: str) -> None:
    """Replaces the catalogued regular file at path after the scan."""
    st = path.stat()
    path.unlink()
    if kind == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)                 # an open without O_NONBLOCK would wait for a writer
    elif kind == "directory":
        path.mkdir()
    elif kind == "larger file, same mtime":
        path.write_bytes(b"x" * (5 << 20))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "symlink to a file of the same size and mtime":
        other = path.parent / "elsewhere"
        other.write_bytes(b"y" * st.st_size)
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.symlink(other, path)
    else:
        raise AssertionError(kind)


def _assert_refused(s: Setup, rel: str) -> None:
    size = s.catalog.files[s.i[rel]].size
    assert s.state(rel) == lib.TIERING_STATE_NONE
    assert s.d.stats.changed_sources == 1 and s.d.stats.copy_failures == 0
    assert s.d.stats.pfs_bytes <= size + 1
    assert not os.path.lexists(s.tier.copy_path(s.catalog.files[s.i[rel]]))
    assert staged(s.tier.staging) == []
    assert s.tier.used == allocated_on_disk(s.tier.data) == 0 and s.tier.files == 0


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "fifo", "directory", "larger file, same mtime",
                                  "symlink to a file of the same size and mtime"])
def test_a_source_replaced_after_the_scan_is_refused_without_reading_it(setup_factory, kind):
    s = setup_factory(files=SMALL)
    _swap(s.data / "s/src.bin", kind)
    assert s.d.place(s.i["s/src.bin"], 0)
    s.wait()
    _assert_refused(s, "s/src.bin")
    assert s.d.stats.pfs_bytes == 0
    # the other file is copied as usual
    assert s.d.place(s.i["s/other.bin"], 0)
    s.wait()
    assert s.state("s/other.bin") == 1 and s.tier.files == 1
    assert (s.tier.data / "0/s/other.bin").read_bytes() == s.contents["s/other.bin"]


class GrowingDaemon(Daemon):
    """The source grows by 5 MiB after the copy's first read, as a file still
    being written would: a file copied on its own counts its read in Python,
    a small one in a batch reports it to the C routine's progress function
    (NOTE [batch copy]), replaced here by one that makes the file grow."""
    grow: Path | None = None

    def __init__(self, *args, **kw):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self._grow_cb = ffi.callback("int(void *, uint64_t)", lambda arg, n: self._grown(n) or 0)
        self._batch.fields.update(progress=self._grow_cb, arg=ffi.NULL)

    def _count_read(self, n: int) -> None:
        super()._count_read(n)
        self._grown(n)

    @staticmethod
    def _grown(n: int) -> None:
        if GrowingDaemon.grow is not None:
            with open(GrowingDaemon.grow, "ab") as f:
                f.write(b"z" * (5 << 20))
            GrowingDaemon.grow = None


@pytest.mark.parametrize("size", [10_000, BATCH_BYTES + 10_000], ids=["in a batch", "on its own"])
def test_a_source_growing_while_copied_is_refused_after_one_byte_more(setup_factory, size):
    s = setup_factory(files={**SMALL, "s/grows.bin": size}, daemon_cls=GrowingDaemon)
    GrowingDaemon.grow = s.data / "s/grows.bin"
    assert s.d.place(s.i["s/grows.bin"], 0)
    s.wait()
    assert GrowingDaemon.grow is None           # it did grow
    _assert_refused(s, "s/grows.bin")
    assert s.d.stats.pfs_bytes == size + 1


def test_a_catalogued_symlink_is_copied_through_and_checked_all_the_same(tmp_path, setup_factory):
    pfs = tmp_path / "pfs"
    target = tmp_path / "target.bin"
    target.write_bytes(os.urandom(7000))
    (pfs / "s").mkdir(parents=True)
    os.symlink(target, pfs / "s/link.bin")
    s = setup_factory(files=SMALL)
    f = s.catalog.files[s.i["s/link.bin"]]
    assert f.link and not s.catalog.files[s.i["s/src.bin"]].link
    assert s.d.place(s.i["s/link.bin"], 0)
    s.wait()
    assert s.state("s/link.bin") == 1
    assert (s.tier.data / "0/s/link.bin").read_bytes() == target.read_bytes()
    # the link now points at /dev/zero: refused, nothing read
    s.d.evict(s.i["s/link.bin"])
    (pfs / "s/link.bin").unlink()
    os.symlink("/dev/zero", pfs / "s/link.bin")
    before = s.d.stats.pfs_bytes
    assert s.d.place(s.i["s/link.bin"], 0)
    s.wait()
    assert s.state("s/link.bin") == lib.TIERING_STATE_NONE
    assert s.d.stats.changed_sources == 1 and s.d.stats.pfs_bytes == before


# -- the tier's directories ------------------------------------------------------

MANY = {f"d{k % 10}/sub/f{k}.bin": 100 + k for k in range(30)}


def test_a_vanished_staging_directory_is_made_again(setup_factory):
    s = setup_factory(files=MANY)
    assert s.d.place(s.i["d0/sub/f0.bin"], 0)
    s.wait()
    shutil.rmtree(s.tier.staging)
    for rel in MANY:
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.d.stats.copy_failures == 0 and s.tier.files == len(MANY)
    assert all(s.state(rel) == 1 for rel in MANY)
    assert s.tier.staging.is_dir() and staged(s.tier.staging) == []


def test_each_copying_thread_writes_in_a_staging_directory_of_its_own_made_again_if_gone(setup_factory):
    """NOTE [staging files]: the workers write their copies in directories
    of their own in staging/ (threads that create and rename in one
    directory queue on its lock); a thread's directory removed between
    copies is made again, and nothing is left behind."""
    s = setup_factory(files=MANY, threads=3, pfs_threads=3)
    for rel in list(MANY)[:10]:
        assert s.d.place(s.i[rel], 0)
    s.wait()
    mine = [p for p in s.tier.staging.iterdir()]
    assert mine and all(p.is_dir() and p.stat().st_mode & 0o777 == 0o700 for p in mine) and len(mine) <= 3
    for p in mine:
        p.rmdir()
    for rel in list(MANY)[10:]:
        assert s.d.place(s.i[rel], 0)
    s.wait()
    assert s.d.stats.copy_failures == 0 and s.tier.files == len(MANY)
    for rel in MANY:
        assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
    assert staged(s.tier.staging) == [] and all(p.is_dir() for p in s.tier.staging.iterdir())


def test_copies_go_on_while_another_job_of_the_user_sweeps_with_its_clock_off(tmp_path, setup_factory):
    """Another tier-run of the same user starts on the node while this one
    copies under lru, and its view of the boot time is one second off (an NTP
    step between the two reads of /proc/stat's btime).  Its sweep of leftovers
    removed this job's live tier directory, and every later copy failed with
    ENOENT on staging/<tid>-<pid>.part."""
    parent = private_dir(tmp_path / "tiers")
    s = setup_factory(files=MANY, tier_dir=make_private_dir(str(parent), "u"))
    s.d.place(s.i["d0/sub/f0.bin"], 0)
    s.wait()
    assert sweep_with_boot_time_off(parent, "u") == []
    for rel in MANY:
        s.d.place(s.i[rel], 0)
    s.wait()
    assert s.d.stats.copy_failures == 0, s.d.stats.errors
    assert s.tier.files == len(MANY)
    for rel in MANY:
        assert (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]


def test_directory_fds_stay_within_their_bound(setup_factory):
    s = setup_factory(files=MANY)
    s.tier.dirs.data.limit = 4
    for rel in MANY:
        assert s.d.place(s.i[rel], 0)
    s.wait()
    assert s.tier.files == len(MANY) and s.d.stats.copy_failures == 0
    assert len(s.tier.dirs.data) <= 4
    for rel in MANY:
        assert (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert s.d.evict(s.i[rel])            # also through directories whose fds were closed
    assert [p for p in s.tier.data.rglob("*") if p.is_file()] == []
    assert s.tier.used == 0 and len(s.tier.dirs.data) <= 4


def test_a_symlink_inside_the_tier_is_never_followed(tmp_path, setup_factory):
    s = setup_factory(files=MANY)
    outside = private_dir(tmp_path / "outside")
    (s.tier.data / "0").symlink_to(outside)
    s.d.place(s.i["d1/sub/f1.bin"], 0)
    s.wait()
    assert s.d.stats.copy_failures == 1 and s.state("d1/sub/f1.bin") == lib.TIERING_STATE_NONE
    assert list(outside.iterdir()) == [] and staged(s.tier.staging) == []


@pytest.mark.slow
def test_published_copies_cost_the_daemon_no_python_object_each(setup_factory):
    """The bookkeeping of a published copy is a slot in per-file arrays (at
    1.28 M files a dict entry per copy was ~130 MiB): the memory the daemon
    keeps after 3,000 copies is a few bytes each; evicting them all gives
    every byte of the tier back."""   # placed 100 at a time: the copies in flight are bounded
    import gc
    import tracemalloc
    n = 3000
    s = setup_factory(files={f"d{k % 30}/f{k}.bin": 10 for k in range(n)}, threads=4)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(n):   # at most 100 in flight, as a policy bounds them
            assert s.d.place(k, 0)
            if k % 100 == 99:
                s.wait()
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert s.tier.files == n and s.d.stats.copies == n
    assert kept < 24 * n, f"{kept / n:.0f} bytes kept per copy"
    for k in range(n):
        assert s.d.evict(k)
    assert s.tier.files == 0 and s.tier.used == 0


def test_a_copy_makes_no_catalog_file_object(setup_factory, monkeypatch):
    """NOTE [copy in C]: a small file's copy reads what it needs from the
    catalog's arrays (a CopyOf, the same fields as the CatalogFile) instead
    of making a frozen CatalogFile, which cost ~10 us of the ~25 us of
    Python per copy; copies and evictions are as exact as before."""
    from tiering.catalog import FileTable
    from tiering.placement.tiers import CopyOf
    files = {f"d{k % 3}/f{k}.bin": 100 + k for k in range(40)}
    s = setup_factory(files=files)
    for i, f in enumerate(s.catalog.files):
        assert CopyOf.of(s.catalog.files, i) == (f.root, f.rel, f.size, f.mtime_ns, f.link)
    made = []
    real = FileTable.__getitem__
    monkeypatch.setattr(FileTable, "__getitem__", lambda self, i: made.append(i) or real(self, i))
    for i in range(len(files)):
        assert s.d.place(i, 0)
    s.wait()
    assert s.d.stats.copies == len(files) and made == []
    for rel, data in s.contents.items():
        assert (s.tier.data / "0" / rel).read_bytes() == data
    for i in range(len(files)):
        assert s.d.evict(i)
    assert made == [] and s.tier.files == 0 and s.tier.used == 0
    assert not any(p.is_file() for p in s.tier.data.rglob("*"))


class CountingLock:
    """The daemon's lock, counting the holds its copy workers take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holds = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got and threading.current_thread().name.startswith("tiering-ram-"):
            self.holds += 1
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class CountingDaemon(Daemon):
    def __init__(self, *args, **kw):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self._lock = CountingLock()   # type: ignore[assignment]
        self._work = [threading.Condition(self._lock) for _ in self.tiers]   # type: ignore[arg-type]
        self._quiet = threading.Condition(self._lock)   # type: ignore[arg-type]


def test_a_small_copy_takes_the_daemon_lock_five_times_in_its_worker(setup_factory):
    """NOTE [copy in C]: the copy worker's holds of the daemon's lock per copy
    of a small file: woken, PFS opened, PFS read done with the bytes read,
    published with the end of the job, back to waiting (not seven: the bytes
    read had a hold of their own, and the job's end another)."""
    files = {f"d/f{k}.bin": 1000 + k for k in range(20)}
    s = setup_factory(files=files, threads=1, pfs_threads=1, daemon_cls=CountingDaemon)
    lock = s.d._lock
    assert isinstance(lock, CountingLock)
    s.wait()
    lock.holds = 0
    for i in range(len(files)):
        assert s.d.place(i, 0)
        s.wait()
    assert s.d.stats.copies == len(files) and s.d.stats.pfs_bytes == sum(files.values())
    assert lock.holds <= 5 * len(files), f"{lock.holds / len(files):.1f} holds per copy"


def _nice_of_thread(tid: int | None) -> int | None:
    """The nice of this process's thread tid, from /proc (field 19 of its stat)."""
    try:
        return int(Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    except (OSError, TypeError):
        return None


def _may_raise_priority(by: int) -> bool:
    """Whether this system lets a thread lower its own nice by `by` (root
    with CAP_SYS_NICE, or RLIMIT_NICE): tried in a thread of its own."""
    got: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, base - by)
            got.append(base - by >= -20 and os.getpriority(os.PRIO_PROCESS, tid) == base - by)
        except OSError:
            got.append(False)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got[0]


def test_the_event_thread_runs_at_a_higher_priority_where_allowed_and_as_before_where_not(
        tmp_path, setup_factory, monkeypatch):
    """Readers that keep every core busy must not starve the thread that
    drains their events: it lowers its nice by EVENT_NICE where the system
    lets it; where it does not, the daemon runs all the same."""
    from tiering.placement import daemon as daemon_mod
    base = os.getpriority(os.PRIO_PROCESS, 0)
    allowed = _may_raise_priority(daemon_mod.EVENT_NICE)
    s = setup_factory(files={"a.bin": 10})
    deadline = time.monotonic() + 30
    while s.d.event_nice == 0 and allowed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.d.event_nice == (daemon_mod.EVENT_NICE if allowed else 0)
    assert _nice_of_thread(s.d._thread.native_id) == base - s.d.event_nice
    assert os.getpriority(os.PRIO_PROCESS, 0) == base   # the other threads keep theirs
    assert s.d.place(s.i["a.bin"], 0)
    s.wait()
    assert s.state("a.bin") == 1

    def refused(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(daemon_mod.os, "setpriority", refused)
    (tmp_path / "refused").mkdir()
    t = Setup(tmp_path / "refused", files={"b.bin": 20})
    try:
        assert t.d.place(t.i["b.bin"], 0)
        t.wait()
        assert t.state("b.bin") == 1 and t.d.event_nice == 0
        assert _nice_of_thread(t.d._thread.native_id) == base
    finally:
        t.close()


def long_rel(data_root: Path, leaf: str = "f.bin") -> str:
    """A relative path as long as the data root leaves room for (its absolute
    path 4,094 bytes), in components of at most 200 bytes."""
    n = 4094 - len(str(data_root)) - 1 - len(leaf)
    parts, left = [], n
    while left > 201:
        parts.append("d" * 200)
        left -= 201
    parts.append("e" * (left - 1))
    return "/".join(parts) + "/" + leaf


def test_a_path_too_long_for_the_tier_is_a_counted_failure_not_a_copy_never_served(tmp_path, setup_factory):
    rel = long_rel(tmp_path / "pfs")
    assert len(str(tmp_path / "pfs" / rel)) == 4094
    s = setup_factory(files={rel: 3000, "short.bin": 100})
    assert len(str(s.tier.data / "0" / rel)) >= 4096      # the shim could not serve it from there
    assert not s.d.place(s.i[rel], 0)
    assert not s.d.place(s.i[rel], 0)                     # asked again: counted once
    assert list(s.d.place_many(np.array([s.i[rel], s.i["short.bin"]]), 0)) == [False, True]
    s.wait()
    assert s.d.stats.copy_failures == 1 and s.tier.failures == 1
    assert s.d.stats.failure_reasons == {"path too long for the tier": 1}
    assert "PATH_MAX" in s.d.stats.errors[0]
    assert s.state(rel) == lib.TIERING_STATE_NONE and s.state("short.bin") == 1
    assert s.d.stats.pfs_opens == 1 and s.d.stats.copies == 1


def test_a_copy_that_finds_no_free_descriptor_is_counted_with_its_reason(setup_factory):
    import resource
    s = setup_factory(files=FILES)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)                 # the lowest free descriptor: none at or above the limit can be had
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        assert s.d.place(s.i["a/x.bin"], 0)
        s.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert s.d.stats.copy_failures == 1
    assert s.d.stats.failure_reasons == {"too many open files": 1}, s.d.stats.errors
    assert s.d.place(s.i["a/x.bin"], 0)          # descriptors again: the copy is made
    s.wait()
    assert s.state("a/x.bin") == 1 and s.d.stats.copy_failures == 1
