"""One PFS read per file (NOTE [one read per file]): an open that finds a
copy in flight waits for it (within the daemon's bound) instead of reading
the file a second time; a copy whose file was opened since it was queued is
not made then (the reader's read was the one), but later, for the file's
later uses; with both at once, every use is read from the PFS once, by the
copy or by the reader, never by both."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import PYTHON, make_data, private_dir, settle_access_times, wait_for
from tiering.catalog import scan
from tiering.placement import daemon as daemon_mod
from tiering.placement.daemon import Daemon
from tiering.placement.index import Root, SharedIndex, lib
from tiering.placement.policies import POLICIES
from tiering.placement.tiers import TierState
from tiering.shimlib import library_path

COPYING_RAM = lib.TIERING_STATE_COPYING | 1

# opens each path given on stdin (one per line, "" ends), prints where its
# descriptor points and a digest of what it read
READER = textwrap.dedent("""
    import hashlib, os, sys, json
    print("ready", flush=True)
    for line in sys.stdin:
        path = line.rstrip("\\n")
        if not path:
            break
        fd = os.open(path, os.O_RDONLY)
        where = os.readlink(f"/proc/self/fd/{fd}")
        with os.fdopen(fd, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        print(json.dumps([where, digest]), flush=True)
""")


class Job:
    """A scanned data root, one tier, the index, a daemon (policy off:
    the test places) and the shim's environment."""

    def __init__(self, tmp: Path, files: dict[str, int], threads: int = 2, start: bool = True,
                 capacity: int = 1 << 30, policy: type = POLICIES["off"]):
        self.root = tmp / "pfs"
        self.contents = make_data(self.root, files)
        settle_access_times(self.root)
        self.catalog = scan([str(self.root)])
        self.tier = TierState("ram", "memory", private_dir(tmp / "tier"), capacity, threads)
        self.index, slots = SharedIndex.for_catalog(private_dir(tmp / "run") / "index",
                                                    [Root(self.catalog.roots[0], 0)], [str(self.tier.data)],
                                                    self.catalog)
        self.i = {f.rel: k for k, f in enumerate(self.catalog.files)}
        self.slot = {f.rel: int(s) for f, s in zip(self.catalog.files, slots)}
        self.d = Daemon(self.index, self.catalog, slots, [self.tier], threads, policy)
        self.env = dict(os.environ, LD_PRELOAD=str(library_path()), TIERING_INDEX=str(self.index.path))
        self.env.pop("TIERING_DISABLE", None)
        if start:
            self.d.start()

    def reader(self) -> subprocess.Popen[str]:
        p = subprocess.Popen([PYTHON, "-c", READER], env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        return p

    def digest(self, rel: str) -> str:
        import hashlib
        return hashlib.sha256(self.contents[rel]).hexdigest()

    def close(self) -> None:
        if not self.d.stopping:
            self.d.stop()
        self.index.close()


def ask(p: subprocess.Popen[str], path: Path) -> None:
    assert p.stdin is not None
    p.stdin.write(f"{path}\n")
    p.stdin.flush()


def answer(p: subprocess.Popen[str]) -> tuple[str, str]:
    assert p.stdout is not None
    where, digest = json.loads(p.stdout.readline())
    return where, digest


def end(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("\n")
    p.stdin.close()
    assert p.wait(timeout=60) == 0


def test_an_open_waits_for_the_copy_in_flight_and_is_served_from_it(tmp_path):
    """The state word says a copy is in flight: the open waits (it is
    counted in copy_waits) and, when the copy is published and the waiters
    woken by the state's swap, opens the copy: the tier's bytes, one open
    counted, none from the PFS."""
    job = Job(tmp_path, {"a/one.bin": 5000, "a/two.bin": 300}, start=False)
    try:
        rel = "a/one.bin"
        job.index.set_copy_wait(120.0)     # far longer than the test: the wake ends the wait
        assert job.index.cas_state(job.slot[rel], lib.TIERING_STATE_NONE, COPYING_RAM)
        p = job.reader()
        ask(p, job.root / rel)
        wait_for(lambda: int(job.index.header.copy_waits) == 1, "the open to wait for the copy")
        copy = job.tier.data / "0" / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(job.contents[rel])
        assert job.index.cas_state(job.slot[rel], COPYING_RAM, 1)
        where, digest = answer(p)
        end(p)
        assert where == str(copy) and digest == job.digest(rel)
        c = job.index.counters()
        assert c["opens_tier"] == [1] and c["opens_pfs"] == 0 and c["copy_waits"] == 1
        assert int(job.index.opens[job.slot[rel]]) == 1
    finally:
        job.close()


def test_an_open_reads_the_pfs_when_the_copy_does_not_land_within_the_bound(tmp_path):
    """A copy in flight that does not end within copy_wait_ns: the open goes
    to the data file after the bound (the same bytes); with no bound set it
    does not wait at all."""
    job = Job(tmp_path, {"a/one.bin": 5000, "a/two.bin": 300}, start=False)
    try:
        for rel in job.contents:
            assert job.index.cas_state(job.slot[rel], lib.TIERING_STATE_NONE, COPYING_RAM)
        p = job.reader()
        ask(p, job.root / "a/one.bin")                 # no bound yet: straight to the PFS
        assert answer(p) == (str(job.root / "a/one.bin"), job.digest("a/one.bin"))
        assert int(job.index.header.copy_waits) == 0
        job.index.set_copy_wait(0.2)
        t0 = time.monotonic()
        ask(p, job.root / "a/two.bin")
        assert answer(p) == (str(job.root / "a/two.bin"), job.digest("a/two.bin"))
        waited = time.monotonic() - t0
        end(p)
        assert waited >= 0.2                            # it did wait, for the whole bound
        c = job.index.counters()
        assert c["copy_waits"] == 1 and c["opens_pfs"] == 2 and c["opens_tier"] == [0]
        assert [job.index.state(job.slot[r]) for r in sorted(job.contents)] == [COPYING_RAM] * 2
    finally:
        job.close()


def test_a_copy_of_a_file_opened_since_it_was_queued_waits_for_the_queue_to_empty(tmp_path):
    """The reader opened the file after its copy was queued and before the
    copy began: the copy claims, sees the open counter moved and gives the
    claim back (the reader's read was the file's read for this use); the
    copy is made again once the tier's queue is empty, for the file's later
    uses, after every other copy."""
    files = {f"d/f{k}.bin": 1000 + k for k in range(20)}
    job = Job(tmp_path, files, threads=1, start=False)
    try:
        for rel in files:
            assert job.d.place(job.i[rel], 0)
        read = "d/f7.bin"
        p = job.reader()
        ask(p, job.root / read)
        assert answer(p) == (str(job.root / read), job.digest(read))
        end(p)
        published: list[int] = []
        job.d._land = lambda ids, tier, ok: published.extend(np.asarray(ids)[np.asarray(ok, bool)].tolist())
        job.d.start()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert job.d.stats.claims_read == 1
        assert published[-1] == job.i[read] and sorted(published) == sorted(job.i.values())
        assert [job.index.state(job.slot[r]) for r in sorted(files)] == [1] * len(files)
        assert all((job.tier.data / "0" / r).read_bytes() == job.contents[r] for r in files)
        assert job.d.stats.copies == len(files) and job.d.stats.pfs_opens == len(files)
        assert job.d.stats.pfs_bytes == sum(files.values())
        assert job.tier.files == len(files) and job.tier.placed_bytes == sum(files.values())
    finally:
        job.close()


class PlansEachUse(POLICIES["off"]):  # type: ignore[misc,valid-type]
    defers_read_copies = False


@pytest.mark.parametrize("policy", [PlansEachUse, POLICIES["off"]])
def test_where_the_data_set_does_not_fit_a_policy_that_plans_each_use_is_told_the_copy_was_not_made(
        tmp_path, policy):
    """Tiers smaller than the data set and a policy that plans each use (as
    the clairvoyant one): the copy of a file the reader opened first is not
    made, its room is given back and the policy hears it was not published
    (it plans the file's next use itself).  A policy that places once (as
    stage) has it made after the others instead."""
    files = {f"d/f{k}.bin": 1000 + k for k in range(20)}
    job = Job(tmp_path, files, threads=1, start=False, capacity=12 * 4096, policy=policy)
    try:
        placed = [rel for rel in sorted(files) if job.d.place(job.i[rel], 0)]
        assert len(placed) == 12
        read = placed[3]
        p = job.reader()
        ask(p, job.root / read)
        assert answer(p) == (str(job.root / read), job.digest(read))
        end(p)
        landed: dict[int, bool] = {}
        job.d._land = lambda ids, tier, ok: landed.update(zip(np.asarray(ids).tolist(), np.asarray(ok).tolist()))
        job.d.start()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert job.d.stats.claims_read == 1
        if policy is not PlansEachUse:
            assert landed == {job.i[r]: True for r in placed} and job.d.stats.copies == 12
            assert job.index.state(job.slot[read]) == 1
            assert (job.tier.data / "0" / read).read_bytes() == job.contents[read]
            return
        assert landed == {job.i[r]: r != read for r in placed}
        assert job.d.stats.copies == 11 and job.d.stats.pfs_opens == 11
        assert job.index.state(job.slot[read]) == lib.TIERING_STATE_NONE and not (job.tier.data / "0" / read).exists()
        assert job.tier.files == 11 and job.tier.used == sum(
            f.stat().st_blocks * 512 for f in job.tier.data.rglob("*") if f.is_file())
    finally:
        job.close()


def test_a_reader_racing_the_copies_reads_each_file_from_the_pfs_once_with_them(tmp_path, monkeypatch):
    """Every file placed; a reader under the shim opens a fifth of them
    while the copies wait, then, once copies run, the rest from the other
    end: each file is read from the PFS exactly once, by its copy (then the
    reader opened the copy) or by the reader (then no copy of it was made),
    with the same bytes."""
    n = 1500
    files = {f"d{k % 10}/f{k}.bin": 2000 + (k * 37) % 3000 for k in range(n)}
    job = Job(tmp_path, files, threads=4, start=False)
    try:
        # a copy in flight is always waited for: the bound the daemon makes from its copies' times is this
        monkeypatch.setattr(daemon_mod, "COPY_WAIT_MIN", 120.0)
        monkeypatch.setattr(daemon_mod, "COPY_WAIT_MAX", 120.0)
        job.index.set_copy_wait(120.0)
        rels = sorted(files)
        order = rels[:n // 5] + list(reversed(rels[n // 5:]))
        assert job.d.place_many(np.array([job.i[r] for r in rels], np.int64), 0).all()
        p = job.reader()
        assert p.stdin is not None
        got = []
        for r in order[:n // 5]:
            ask(p, job.root / r)
            got.append(answer(p))
        job.d.start()
        wait_for(lambda: job.d.stats.copies, "a copy to land")
        p.stdin.write("".join(f"{job.root / r}\n" for r in order[n // 5:]) + "\n")
        p.stdin.flush()
        got += [answer(p) for _ in order[n // 5:]]
        p.stdin.close()
        assert p.wait(timeout=60) == 0
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        tier_root = str(job.tier.data)
        by_reader = {r for r, (where, _) in zip(order, got) if not where.startswith(tier_root)}
        served = {r for r, (where, _) in zip(order, got) if where.startswith(tier_root)}
        assert all(d == job.digest(r) for r, (_, d) in zip(order, got))
        # every file copied once: before the reader reached it (then served from the copy), or, when the
        # reader read it first, after, for its later uses (the claim saw the open: never both at once)
        assert {r for r in rels if job.d.where(job.i[r]) == 0} == set(rels)
        assert set(order[:n // 5]) <= by_reader and served and not (served & by_reader)
        assert job.d.stats.claims_read == len(by_reader)
        assert job.d.stats.pfs_opens == n and job.d.stats.pfs_bytes == sum(files.values())
    finally:
        job.close()


def test_an_open_does_not_wait_for_a_copy_it_could_not_be_served(tmp_path):
    """No wait when the copy could not serve the open anyway: the index
    disabled (the job ends), or the daemon that claimed it dead (its claim
    is never released); an open that waited out the bound leaves errno as
    the PFS open left it."""
    job = Job(tmp_path, {"a/one.bin": 5000, "a/two.bin": 300, "a/three.bin": 70}, start=False)
    try:
        for rel in job.contents:
            assert job.index.cas_state(job.slot[rel], lib.TIERING_STATE_NONE, COPYING_RAM)
        job.index.set_copy_wait(60.0)
        job.index.set_disabled(True)
        p = job.reader()
        ask(p, job.root / "a/one.bin")
        assert answer(p) == (str(job.root / "a/one.bin"), job.digest("a/one.bin"))
        end(p)
        job.index.set_disabled(False)
        dead = subprocess.Popen(["true"])
        dead.wait()
        alive = int(job.index.header.daemon_pid)
        job.index.header.daemon_pid = dead.pid
        p = job.reader()
        ask(p, job.root / "a/two.bin")
        assert answer(p) == (str(job.root / "a/two.bin"), job.digest("a/two.bin"))
        end(p)
        assert int(job.index.header.copy_waits) == 0
        job.index.header.daemon_pid = alive
        job.index.set_copy_wait(0.05)
        script = ("import ctypes, os, sys\n"
                  "libc = ctypes.CDLL(None, use_errno=True)\n"
                  "ctypes.set_errno(0)\n"
                  "fd = libc.open(sys.argv[1].encode(), os.O_RDONLY)\n"
                  "print(fd >= 0, ctypes.get_errno())\n")
        r = subprocess.run([PYTHON, "-c", script, str(job.root / "a/three.bin")], env=job.env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["True", "0"] and int(job.index.header.copy_waits) == 1
    finally:
        job.close()


def test_a_write_open_wakes_the_opens_waiting_for_the_copy(tmp_path):
    """A reader waits for a copy in flight; a write open invalidates the
    file: the reader wakes at once and reads the data file, not after the
    bound (two minutes here)."""
    job = Job(tmp_path, {"a/one.bin": 5000, "a/two.bin": 300}, start=False)
    try:
        rel = "a/one.bin"
        assert job.index.cas_state(job.slot[rel], lib.TIERING_STATE_NONE, COPYING_RAM)
        job.index.set_copy_wait(120.0)
        p = job.reader()
        ask(p, job.root / rel)
        wait_for(lambda: int(job.index.header.copy_waits) == 1, "the open to wait for the copy")
        t0 = time.monotonic()
        w = subprocess.run([PYTHON, "-c", f"import os; os.close(os.open({str(job.root / rel)!r}, os.O_WRONLY))"],
                           env=job.env, capture_output=True, text=True, timeout=60)
        assert w.returncode == 0, w.stderr
        assert answer(p) == (str(job.root / rel), job.digest(rel))
        assert time.monotonic() - t0 < 60      # woken, not after the two minutes of its bound
        end(p)
        assert job.index.state(job.slot[rel]) == lib.TIERING_STATE_INVALID
    finally:
        job.close()
