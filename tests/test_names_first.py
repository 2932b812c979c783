"""A cold start-up that lists names first and reads the sizes while COMMAND
runs (NOTE [names first] in docs/design.md): the shim passes every entry
that is not complete through, takes nothing from a record before its flag,
the files written during the fill are never served stale, and every path of
tier-run that runs during the fill (status, COMMAND's exit, a signal) copes.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    PYTHON,
    ShimEnv,
    age,
    private_dir,
    profile,
    read_line,
    running,
    settle_access_times,
    tier_run,
    wait_for,
    wait_job_dirs_removed,
)
from tiering.catalog import scan
from tiering.catalog.cache import cache_file, load_cache
from tiering.catalog.model import FILE_COLUMNS, Catalog
from tiering.catalog.scan import stat_deferred
from tiering.placement.index import Root, SharedIndex, lib
from tiering.shimlib import library_path

pytestmark = pytest.mark.usefixtures("no_leftovers")

FILES = {f"c{c}/f{i}.bin": bytes([65 + c]) * (10 + 7 * i + c) for c in range(3) for i in range(40)}

# Through the shim: for each path, its stat (size, mtime), a digest of what an
# open reads and whether the descriptor is on a tier copy.
PROBE = textwrap.dedent("""
    import hashlib, json, os, sys
    out = {}
    for p in sys.argv[2:]:
        st = os.stat(p)
        fd = os.open(p, os.O_RDONLY)
        data = os.read(fd, 1 << 20)
        where = os.readlink(f"/proc/self/fd/{fd}")
        os.close(fd)
        out[p] = [st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest(), where.startswith(sys.argv[1])]
    print(json.dumps(out))
""")


def sha(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def write_tree(root: Path, files: dict[str, bytes] = FILES) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def names_first_env(tmp_path: Path, root: Path) -> tuple[ShimEnv, Catalog, np.ndarray]:
    """An index written from a names-first scan of root (every entry
    incomplete, the index filling), one tier, every file placed by hand with
    poison as its copy (a redirected open reads poison)."""
    settle_access_times(root)
    cat = scan([str(root)], names_first=True)
    assert cat.deferred is not None and cat.deferred.pending.all()
    tier = private_dir(tmp_path / "tier")
    index, slots = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                           [str(tier)], cat, cat.deferred.pending)
    assert index.filling
    rels = [cat.files.rel(i) for i in range(len(cat.files))]
    env = dict(os.environ, LD_PRELOAD=str(library_path()), TIERING_INDEX=str(index.path))
    env.pop("TIERING_DISABLE", None)
    se = ShimEnv(root, tier, index, dict(zip(rels, slots.tolist())), {r: (root / r).read_bytes() for r in rels}, env)
    for rel in rels:
        se.place(rel, b"poison")
    return se, cat, slots


def probe(se: ShimEnv, rels: list[str]) -> dict[str, list]:
    r = se.run([PYTHON, "-c", PROBE, str(se.tier), *[str(se.root / rel) for rel in rels]])
    assert r.returncode == 0, r.stderr
    return {str(Path(p).relative_to(se.root)): v for p, v in json.loads(r.stdout).items()}


def complete_all(se: ShimEnv, cat: Catalog, slots: np.ndarray) -> None:
    assert stat_deferred(cat, 2, lambda filled, gone: se.index.complete(slots, cat, filled))


def test_an_incomplete_entry_is_passed_through_and_served_once_complete(tmp_path):
    """Before its stat an entry is not catalogued for the shim: the open
    reads the PFS (not the tier copy there is) and stat is the kernel's;
    once complete, both come from the index and the tier."""
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    rels = sorted(se.contents)[:5]
    os.utime(root / rels[0], ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    before = probe(se, rels)
    for rel in rels:
        real = os.stat(root / rel)
        assert before[rel] == [real.st_size, real.st_mtime_ns, sha(se.contents[rel]), False]
    complete_all(se, cat, slots)
    assert se.index.filled() == 0 and not se.index.filling
    recorded = os.stat(root / rels[0]).st_mtime_ns
    os.utime(root / rels[0], ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))   # after the stat
    after = probe(se, rels)
    for rel in rels:
        assert after[rel][0] == len(se.contents[rel])
        assert after[rel][2:] == [sha(b"poison"), True]      # redirected to the tier now
    assert after[rels[0]][1] == recorded                     # the index's answer, not the kernel's


def test_nothing_of_a_record_is_taken_before_its_complete_flag(tmp_path):
    """The record's fields written without TIERING_FILE_COMPLETE are not
    read (stat is the kernel's, no redirect); the flag alone makes the
    same fields the answer."""
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    rel = sorted(se.contents)[3]
    k = int(se.index.entries[se.slots[rel]].file)
    real = os.stat(root / rel)
    fake_mtime = 1_234_567_890_123_456_789
    rec = se.index.files[k]
    rec["ino"], rec["dev"], rec["mode"], rec["nlink"] = real.st_ino, real.st_dev, real.st_mode, 1
    rec["mtime_ns"] = fake_mtime
    se.index.entries[se.slots[rel]].size = len(se.contents[rel])
    se.index.files[k] = rec
    assert probe(se, [rel])[rel] == [real.st_size, real.st_mtime_ns, sha(se.contents[rel]), False]
    se.index.files["flags"][k] = lib.TIERING_FILE_COMPLETE | lib.TIERING_FILE_STAT | lib.TIERING_FILE_NO_LINK
    assert probe(se, [rel])[rel] == [real.st_size, fake_mtime, sha(b"poison"), True]


STAT_LOOP = textwrap.dedent("""
    import os, sys
    stop, paths, sizes = sys.argv[1], sys.argv[2::2], [int(s) for s in sys.argv[3::2]]
    rounds = bad = 0
    while not os.path.exists(stop) or rounds < 2:
        for p, n in zip(paths, sizes):
            st = os.stat(p)
            if st.st_size != n or st.st_mtime_ns == 0 or st.st_ino == 0 or st.st_mode == 0:
                bad += 1
        rounds += 1
    print(rounds, bad)
""")


def test_stats_while_the_records_are_filled_are_always_whole(tmp_path):
    """A process stats every file again and again while the records are
    filled one by one: every answer, the kernel's before and the index's
    after, is the whole stat (never a record whose flag came before its
    fields)."""
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    stop = tmp_path / "stop"
    rels = sorted(se.contents)
    args = [a for rel in rels for a in (str(root / rel), str(len(se.contents[rel])))]
    p = subprocess.Popen([PYTHON, "-c", STAT_LOOP, str(stop), *args], env=se.env, stdout=subprocess.PIPE, text=True)
    try:
        def one_by_one(filled: np.ndarray, gone: np.ndarray) -> None:
            for i in filled.tolist():
                se.index.complete(slots, cat, np.array([i]))
        assert stat_deferred(cat, 1, one_by_one)
        assert se.index.filled() == 0
        stop.touch()
        out, _ = p.communicate(timeout=120)
    finally:
        p.kill()
        p.wait()
    rounds, bad = map(int, out.split())
    assert rounds >= 2 and bad == 0


WRITER = textwrap.dedent("""
    import os, sys
    for p in sys.argv[1:]:
        fd = os.open(p, os.O_WRONLY)
        os.close(fd)
""")


def test_files_opened_for_writing_during_the_fill_are_invalidated_under_every_path(tmp_path):
    """Write opens during the fill through a hard link and a symlink outside
    the data root (no catalogued path, identity table still empty) are
    logged; once the table is whole every catalogued path of those files is
    invalid, and nothing else is."""
    root, outside = tmp_path / "pfs", tmp_path / "elsewhere"
    write_tree(root)
    outside.mkdir()
    os.link(root / "c0/f1.bin", root / "c2/zz-hard.bin")    # a second catalogued path of f1
    os.link(root / "c0/f1.bin", outside / "hard")
    os.symlink(root / "c1/f2.bin", outside / "link")
    se, cat, slots = names_first_env(tmp_path, root)
    r = se.run([PYTHON, "-c", WRITER, str(outside / "hard"), str(outside / "link")])
    assert r.returncode == 0, r.stderr
    assert int(se.index.header.wlog_head) == 2
    complete_all(se, cat, slots)
    assert se.index.filled() == 3
    invalid = {rel for rel in se.contents if se.state(rel) == lib.TIERING_STATE_INVALID}
    assert invalid == {"c0/f1.bin", "c2/zz-hard.bin", "c1/f2.bin"}
    got = probe(se, sorted(invalid))
    assert all(v[2:] == [sha(se.contents[rel]), False] for rel, v in got.items())


@pytest.mark.slow
def test_a_fill_whose_writes_cannot_be_known_says_so(tmp_path):
    """A log that overflowed (-2) or a writer that never finished its entry
    (-1): the caller disables the index (tiering.fill)."""
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    se.index.header.wlog_size = 1
    r = se.run([PYTHON, "-c", WRITER, str(root / "c0/f1.bin"), str(root / "c0/f2.bin")])
    assert r.returncode == 0, r.stderr
    complete_all(se, cat, slots)
    assert se.index.filled() == -2
    (tmp_path / "second").mkdir()
    se2, _, _ = names_first_env(tmp_path / "second", root)
    se2.index.header.fill_writers = 1
    assert se2.index.filled(wait=0.2) == -1


def test_a_names_first_scan_gives_the_catalog_of_a_full_scan(tmp_path):
    """Same paths, directories, symlinks, skipped entries and, once the
    stats are read, the same columns as a scan that stats everything."""
    root = tmp_path / "pfs"
    write_tree(root)
    os.symlink(root / "c0/f1.bin", root / "c1/zz-link.bin")
    os.symlink(root / "c0", root / "linked")
    os.symlink(root / "nowhere", root / "c2/dangling.bin")
    full = scan([str(root)])
    first = scan([str(root)], names_first=True)
    assert first.deferred is not None
    assert first.files.blob() == full.files.blob()
    assert (first.files.dir == full.files.dir).all()
    assert (first.dirs, first.aliases, first.skipped, first.dir_links) == \
        (full.dirs, full.aliases, full.skipped, full.dir_links)
    # before the stats: a deferred file is a regular file and zeros, the others as the full scan has them
    waiting = first.deferred.pending
    assert 0 < waiting.sum() < len(waiting)
    for k in FILE_COLUMNS:
        col = first.files.columns[k]
        assert (col[~waiting] == full.files.columns[k][~waiting]).all(), k
        assert (col[waiting] == (stat.S_IFREG if k == "mode" else 0)).all(), k
    calls: list[tuple[int, int]] = []
    assert stat_deferred(first, 3, lambda f, g: calls.append((len(f), len(g))))
    assert first.deferred is None and sum(c[0] for c in calls) == len(FILES)   # the symlink was stat'ed listed
    for k in FILE_COLUMNS:
        assert (first.files.columns[k] == full.files.columns[k]).all(), k


def test_a_listing_of_regular_files_shares_one_record_and_a_mixed_one_has_its_own(tmp_path):
    """Names first, memory: a directory of regular files by d_type holds no
    stat record per file (one read-only record through a zero stride); a
    directory with a symlink gets a record per entry, the link's stat'ed."""
    from tiering.catalog.scan import _listing, _stat_others
    root = tmp_path / "pfs"
    write_tree(root)
    os.symlink(root / "c0/f1.bin", root / "c1/zz-link.bin")
    recs, deferred = _stat_others(str(root / "c0"), _listing(str(root / "c0")))
    assert len(recs) == 40 and deferred.all() and recs.strides == (0,) and not recs.flags.writeable
    assert (recs["ok"] == 1).all() and (recs["mode"] == stat.S_IFREG).all() and (recs["size"] == 0).all()
    recs, deferred = _stat_others(str(root / "c1"), _listing(str(root / "c1")))
    assert len(recs) == 41 and deferred.sum() == 40 and recs.strides != (0,)
    assert recs["link"][~deferred].tolist() == [1] and recs["size"][~deferred].tolist() == [len(FILES["c0/f1.bin"])]
    assert (recs["mode"][deferred] == stat.S_IFREG).all() and (recs["size"][deferred] == 0).all()


# -- tier-run -------------------------------------------------------------------

READ_TWICE = textwrap.dedent("""
    import hashlib, os, sys
    h = hashlib.sha256()
    for rnd in range(2):
        for d, _, names in sorted(os.walk(sys.argv[1])):
            for n in sorted(names):
                with open(os.path.join(d, n), "rb") as f:
                    data = f.read()
                if rnd == 1:
                    h.update(data)
    print(h.hexdigest())
""")


def tree_digest(root: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            h.update(Path(d, n).read_bytes())
    return h.hexdigest()


@pytest.mark.slow
def test_a_cold_tier_run_starts_command_before_the_sizes_and_caches_the_full_catalog(tmp_path):
    """Cold: COMMAND starts while the sizes are read, reads the same bytes,
    the report counts every file and byte, and the cache written after the
    fill holds what a full scan finds (the next run starts from it)."""
    data, cache = tmp_path / "pfs", tmp_path / "cache"
    write_tree(data)
    age(data)
    settle_access_times(data)   # COMMAND's reads leave the atimes as they are
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    out = tmp_path / "stats.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(out), "--",
                  PYTHON, "-c", READ_TWICE, str(data)], env=env)
    assert r.returncode == 0, r.stderr
    assert "sizes read while COMMAND starts" in r.stderr
    assert r.stdout.strip() == tree_digest(data)
    stats = json.loads(out.read_text())
    assert stats["files"] == len(FILES) and stats["bytes"] == sum(map(len, FILES.values()))
    with ThreadPoolExecutor(2) as pool:
        cached = load_cache(cache / "tiering" / "catalogs", str(data), pool)
    assert cached is not None
    full = scan([str(data)])
    assert cached.files.blob() == full.files.blob()
    for k in FILE_COLUMNS:
        assert (cached.files.columns[k] == full.files.columns[k]).all(), k
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", PYTHON, "-c", READ_TWICE,
                  str(data)], env=env)
    assert r.returncode == 0 and "catalog from cache" in r.stderr and r.stdout.strip() == tree_digest(data)


@pytest.mark.slow
def test_command_exiting_during_the_fill_ends_the_job_cleanly(tmp_path):
    """COMMAND is done before a single size is read (the fill held back
    past the teardown's grace): its status is the job's, the report says
    which sizes are unknown, nothing is left behind, and a child reads the
    rest of the sizes and writes the whole catalog to the cache."""
    data, cache, gate = tmp_path / "pfs", tmp_path / "cache", tmp_path / "gate"
    write_tree(data)
    age(data)
    gate.touch()
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), TIERING_FILL_GATE=str(gate))
    out = tmp_path / "stats.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(out), "--",
                  PYTHON, "-c", READ_TWICE + "raise SystemExit(7)\n", str(data)], env=env)
    assert r.returncode == 7, r.stderr
    assert r.stdout.strip() == tree_digest(data)
    stats = json.loads(out.read_text())
    assert stats["exit_code"] == 7 and stats["files"] == len(FILES)
    assert stats["files_unsized"] == len(FILES) and stats["bytes"] == 0
    assert "COMMAND ended before the sizes of 120 files were read" in r.stderr
    assert stats["opens"]["total"] == 2 * len(FILES) and stats["opens"]["pfs"] == 2 * len(FILES)
    # the rest of the sizes and the cache: in a child nobody waited for
    # (the file under its own name: the writer's temporary also ends in .npz until it is renamed)
    wait_for(lambda: cache_file(cache / "tiering" / "catalogs", str(data)).exists(), "the cache written aside")
    with ThreadPoolExecutor(2) as pool:
        cached = load_cache(cache / "tiering" / "catalogs", str(data), pool)
    assert cached is not None and int(cached.files.size.sum()) == sum(map(len, FILES.values()))


@pytest.mark.slow
def test_a_signal_during_the_fill_reaches_command_and_everything_is_cleaned_up(tmp_path):
    data, gate = tmp_path / "pfs", tmp_path / "gate"
    write_tree(data)
    gate.touch()
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    env = dict(os.environ, TIERING_FILL_GATE=str(gate))
    with running([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                  "--", PYTHON, "-c", script], env=env) as p:
        assert read_line(p.stdout) == b"ready\n"
        wait_for(lambda: any(Path("/dev/shm").glob(f"*-{p.pid}-*/status.json")), "the status file")
        status = next(Path("/dev/shm").glob(f"*-{p.pid}-*/status.json"))
        st = json.loads(status.read_text())
        assert st["state"] == "scanning" and st["scan"]["phase"] == "reading sizes"
        assert st["scan"]["sized"] == 0 and st["scan"]["files"] == len(FILES)
        shown = subprocess.run([PYTHON, "-m", "tiering", "status", str(p.pid)], capture_output=True, text=True, timeout=120)
        assert "placement starts once the sizes are read: 0 of 120 files" in shown.stdout, shown
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=300)
    assert p.returncode == 42, err
    wait_job_dirs_removed(p.pid)


# Opens data files for writing through a hard link and a symlink outside the
# data set while the fill is held back, keeps the descriptors, lets the fill
# go, reads everything until placement has copied files (first touch), then
# writes new bytes of the same length through the kept descriptors and
# reads the catalogued paths: the new bytes, never a stale copy.
WRITE_DURING_FILL = textwrap.dedent("""
    import os, sys, time
    data, tier, gate, hard, link = sys.argv[1:6]
    targets = [os.path.join(data, "c0", "f1.bin"), os.path.join(data, "c1", "f2.bin")]
    fds = [os.open(hard, os.O_WRONLY), os.open(link, os.O_WRONLY)]
    os.unlink(gate)
    def read_all():
        tiered = 0
        for d in sorted(os.listdir(data)):
            for n in sorted(os.listdir(os.path.join(data, d))):
                fd = os.open(os.path.join(data, d, n), os.O_RDONLY)
                tiered += os.readlink(f"/proc/self/fd/{fd}").startswith(tier)
                os.close(fd)
        return tiered
    deadline = time.monotonic() + 120
    while read_all() < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_all() >= 100, "placement did not start"
    for fd in fds:
        size = os.fstat(fd).st_size
        os.pwrite(fd, b"N" * size, 0)
        os.close(fd)
    for t in targets:
        fd = os.open(t, os.O_RDONLY)
        where = os.readlink(f"/proc/self/fd/{fd}")
        got = os.read(fd, 1 << 20)
        os.close(fd)
        assert set(got) == {ord("N")}, (t, where, got[:20])
    print("new bytes")
""")


@pytest.mark.slow
def test_writes_during_the_fill_through_a_hard_link_and_a_symlink_are_never_served_stale(tmp_path):
    data, gate, outside = tmp_path / "pfs", tmp_path / "gate", tmp_path / "elsewhere"
    write_tree(data)
    outside.mkdir()
    os.link(data / "c0/f1.bin", outside / "hard")
    os.symlink(data / "c1/f2.bin", outside / "link")
    age(data)
    gate.touch()
    prof = profile(tmp_path)
    env = dict(os.environ, TIERING_FILL_GATE=str(gate))
    r = tier_run(["--profile", str(prof), "--data", str(data), "--policy", "first-touch", "--",
                  PYTHON, "-c", WRITE_DURING_FILL, str(data), "/dev/shm", str(gate), str(outside / "hard"),
                  str(outside / "link")], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "new bytes"


@pytest.mark.slow
@pytest.mark.parametrize("options", [["--policy", "stage"], ["--warm", "100"]], ids=["stage", "warm"])
def test_policies_that_copy_before_command_read_every_size_first(tmp_path, options):
    """--policy stage and --warm place before COMMAND starts: the scan stats
    everything first, as before names first (the scan line gives the bytes),
    and COMMAND reads the same bytes."""
    data = tmp_path / "pfs"
    write_tree(data)
    age(data)
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), *options, "--",
                  PYTHON, "-c", READ_TWICE, str(data)], env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert r.returncode == 0, r.stderr
    assert "sizes read" not in r.stderr
    assert f"scanned: {len(FILES)} files (17.3 KiB)" in r.stderr
    assert r.stdout.strip() == tree_digest(data)


def test_names_first_is_kept_for_single_node_jobs_that_place_after_command_starts():
    from tiering.cluster.identity import NodeIdentity
    from tiering.job import JobOptions, names_first
    from tiering.profile import load_profile
    prof = load_profile("auto")
    assert names_first(JobOptions(["/d"], ["true"], prof))
    assert names_first(JobOptions(["/d"], ["true"], prof, policy="first-touch"))
    assert not names_first(JobOptions(["/d"], ["true"], prof, policy="stage"))
    assert not names_first(JobOptions(["/d"], ["true"], prof, warm=50))
    assert not names_first(JobOptions(["/d"], ["true"], prof, node=NodeIdentity("job", 0, 2)))


def test_a_file_gone_or_replaced_by_a_directory_before_its_stat_stays_incomplete(tmp_path):
    """SizeFill on its own: a file removed and one replaced by a directory
    between the listing and the stat are never complete and never served
    (state invalid), the others are; `then` runs once, after the fill."""
    from tiering.fill import SizeFill
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    (root / "c0/f3.bin").unlink()
    (root / "c1/f4.bin").unlink()
    (root / "c1/f4.bin").mkdir()
    calls: list[bool] = []
    seen: list[tuple[int, int]] = []
    fill = SizeFill(cat, se.index, slots, 2, calls.append, lambda done, total, b: seen.append((done, total)))
    fill.start()
    assert fill.done.wait(60)
    assert fill.complete and calls == [True] and fill.gone == 2 and not se.index.filling
    assert seen[0] == (0, len(FILES)) and seen[-1] == (len(FILES), len(FILES))
    for rel in se.contents:
        k = int(se.index.entries[se.slots[rel]].file)
        complete = bool(se.index.files["flags"][k] & lib.TIERING_FILE_COMPLETE)
        gone = rel in ("c0/f3.bin", "c1/f4.bin")
        assert complete != gone, rel
        assert (se.state(rel) == lib.TIERING_STATE_INVALID) == gone, rel
    assert cat.files.rel(0) == "c0/f0.bin" and int(cat.files.size[0]) == len(FILES["c0/f0.bin"])


NOFOLLOW_PROBE = textwrap.dedent("""
    import errno, json, os, stat, sys
    p = sys.argv[1]
    st = os.lstat(p)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        got = os.read(fd, 1 << 20).decode("latin-1")
        os.close(fd)
    except OSError as e:
        got = errno.errorcode[e.errno]
    print(json.dumps([stat.S_ISLNK(st.st_mode), st.st_ino, got]))
""")


def test_a_file_replaced_by_a_symlink_before_its_stat_is_catalogued_as_a_link(tmp_path):
    """A regular file by d_type replaced by a symlink to a regular file
    between the listing and the stat: its record says symlink, so lstat and
    an O_NOFOLLOW open get the kernel's answers (a link, ELOOP), not the
    target's stat from the index or a tier copy."""
    root = tmp_path / "pfs"
    write_tree(root)
    se, cat, slots = names_first_env(tmp_path, root)
    rel = "c2/f5.bin"
    (root / rel).unlink()
    (root / rel).symlink_to(root / "c2/f6.bin")
    complete_all(se, cat, slots)
    assert se.index.filled() == 0
    r = se.run([PYTHON, "-c", NOFOLLOW_PROBE, str(root / rel)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [True, os.lstat(root / rel).st_ino, "ELOOP"]
    k = int(se.index.entries[se.slots[rel]].file)
    assert se.index.files["flags"][k] & lib.TIERING_FILE_COMPLETE
    assert not se.index.files["flags"][k] & lib.TIERING_FILE_NO_LINK
    i = next(k for k in range(len(cat.files)) if cat.files.rel(k) == rel)
    assert bool(cat.files.link[i]) and int(cat.files.size[i]) == len(FILES["c2/f6.bin"])


APPENDER = textwrap.dedent("""
    import sys
    for step in range(int(sys.argv[1])):
        for p in sys.argv[2:]:
            with open(p, "a") as f:     # a log appended to line by line, opened each time
                f.write(f"step {step}\\n")
""")


def test_files_opened_for_writing_again_and_again_during_the_fill_are_logged_once(tmp_path):
    """A program that opens the same files for writing at every step (logs
    appended line by line, one of them a hard link of a catalogued file)
    logs each file once per process, not once per open: a log of 32 entries
    holds 16 files opened 100 times each in turn (as many as the shim
    remembers: with one remembered entry per hash bucket, files whose
    identities shared a bucket were logged at every open), and every
    catalogued path of the file written is invalid once the fill ends."""
    root, outside = tmp_path / "pfs", tmp_path / "elsewhere"
    write_tree(root)
    outside.mkdir()
    os.link(root / "c0/f1.bin", outside / "hard")
    se, cat, slots = names_first_env(tmp_path, root)
    se.index.header.wlog_size = 32
    logs = [str(outside / f"{k}.log") for k in range(15)]
    r = se.run([PYTHON, "-c", APPENDER, "100", str(outside / "hard"), *logs])
    assert r.returncode == 0, r.stderr
    assert int(se.index.header.wlog_head) == 16
    complete_all(se, cat, slots)
    assert se.index.filled() == 1
    assert {rel for rel in se.contents if se.state(rel) == lib.TIERING_STATE_INVALID} == {"c0/f1.bin"}
    assert (outside / "hard").read_bytes().endswith(b"step 99\n")


MANY_WRITER = textwrap.dedent("""
    import os, sys
    out, n = sys.argv[1], int(sys.argv[2])
    for k in range(n):     # a file of its own per sample (a cache of preprocessed samples)
        fd = os.open(os.path.join(out, f"s{k}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    fd = os.open(sys.argv[3], os.O_WRONLY)
    os.close(fd)
""")


@pytest.mark.slow
def test_a_fill_that_sees_tens_of_thousands_of_files_written_keeps_the_index(tmp_path):
    """COMMAND writes 20,000 files of its own while the sizes are read (a
    cache of preprocessed samples, outside the data set) and opens one
    catalogued file for writing through a hard link outside the data set:
    the log holds every one, so the fill ends with that file invalid and
    the index still in service."""
    root, out = tmp_path / "pfs", tmp_path / "samples"
    write_tree(root)
    out.mkdir()
    os.link(root / "c1/f7.bin", tmp_path / "hard")
    se, cat, slots = names_first_env(tmp_path, root)
    r = se.run([PYTHON, "-c", MANY_WRITER, str(out), "20000", str(tmp_path / "hard")])
    assert r.returncode == 0, r.stderr
    assert int(se.index.header.wlog_head) == 20_001
    complete_all(se, cat, slots)
    assert se.index.filled() == 1
    assert {rel for rel in se.contents if se.state(rel) == lib.TIERING_STATE_INVALID} == {"c1/f7.bin"}


def test_an_index_with_every_size_has_no_write_log(tmp_path):
    """Only an index filled from names first logs write opens: one written
    with every size has a log of no entries (and none of its bytes)."""
    root = tmp_path / "pfs"
    write_tree(root)
    cat = scan([str(root)])
    index, _ = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                       [str(private_dir(tmp_path / "tier"))], cat)
    assert not index.filling and int(index.header.wlog_size) == 0
    assert int(index.header.ring_offset) - int(index.header.wlog_offset) < 64


def test_the_cache_written_aside_holds_no_mapping_of_the_index(tmp_path, monkeypatch):
    """COMMAND ended before the sizes were read: the child that reads them
    and writes the cache (it may outlive the job by minutes on a slow PFS)
    has let go of the index, so the removed index's memory is not kept."""
    import tiering.fill as fill_mod
    from tiering.fill import GATE_ENV, SizeFill
    root, gate, maps = tmp_path / "pfs", tmp_path / "gate", tmp_path / "maps"
    write_tree(root)
    age(root)
    cat = scan([str(root)], cache_dir=tmp_path / "cache", names_first=True)
    assert cat.deferred is not None and cat.deferred.saves
    index, slots = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                           [str(private_dir(tmp_path / "tier"))], cat, cat.deferred.pending)
    real = fill_mod.stat_deferred

    def stat_and_show_maps(*args, **kwargs):
        maps.write_bytes(Path("/proc/self/maps").read_bytes())   # in the child
        return real(*args, **kwargs)

    monkeypatch.setattr(fill_mod, "stat_deferred", stat_and_show_maps)
    gate.touch()
    monkeypatch.setenv(GATE_ENV, str(gate))
    fill = SizeFill(cat, index, slots, 2, lambda place: None)
    fill.start()
    fill.stop()
    assert not fill.complete
    pid = fill.cache_aside()
    assert pid is not None
    assert os.waitpid(pid, 0)[1] == 0
    assert str(index.path) in Path("/proc/self/maps").read_text()      # the job's own mapping stays
    assert str(index.path) not in maps.read_text()
    with ThreadPoolExecutor(2) as pool:
        cached = load_cache(tmp_path / "cache", str(root), pool)
    assert cached is not None and int(cached.files.size.sum()) == sum(map(len, FILES.values()))
    index.close()


def test_no_cache_is_written_aside_when_a_file_was_gone_at_its_stat(tmp_path, monkeypatch):
    """COMMAND ended before the sizes were read, and a file was gone at the
    writer's stat (the root unmounted meanwhile: no directory changes, so
    the cache would be taken as it is): the cache would hold it with size 0
    and the next run would find it changed, so no cache is written (the next
    run scans)."""
    from tiering.fill import GATE_ENV, SizeFill
    root, gate = tmp_path / "pfs", tmp_path / "gate"
    write_tree(root)
    age(root)
    cat = scan([str(root)], cache_dir=tmp_path / "cache", names_first=True)
    index, slots = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                           [str(private_dir(tmp_path / "tier"))], cat, cat.deferred.pending)
    gate.touch()
    monkeypatch.setenv(GATE_ENV, str(gate))
    fill = SizeFill(cat, index, slots, 2, lambda place: None)
    fill.start()
    fill.stop()
    import tiering.fill as fill_mod
    real = fill_mod.stat_deferred

    def one_gone(cat, threads, done, *args, **kwargs):   # in the writer: the stat of one file failed
        def first_gone(filled, gone):
            if len(filled) and not len(gone):
                filled, gone = filled[1:], np.concatenate([gone, filled[:1]])
            done(filled, gone)
        return real(cat, threads, first_gone, *args, **kwargs)

    monkeypatch.setattr(fill_mod, "stat_deferred", one_gone)
    pid = fill.cache_aside()
    assert pid is not None and os.waitpid(pid, 0)[1] == 0
    with ThreadPoolExecutor(2) as pool:
        assert load_cache(tmp_path / "cache", str(root), pool) is None
    index.close()
