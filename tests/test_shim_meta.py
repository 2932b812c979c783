"""The shim's metadata answers (NOTE [stat from the index]), per-thread open
tags (NOTE [open tags]) and per-entry open counters (NOTE [open counters]).

Where an answer came from is observed by changing the file after the scan
(its times, or removing it): an answer from the index still shows the file
as the scan saw it, the kernel's shows the change."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    PYTHON,
    REPO,
    ShimEnv,
    alias_tree,
    catalog_shimenv,
    make_data,
    place_like_the_daemon,
    private_dir,
)
from tiering.placement.index import Credentials, FileStats, Root, SharedIndex, lib
from tiering.shimlib import library_path

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))   # bench.slowfs

REL = "a/two.bin"

# statall's calls (tests/c/statall.c) by what the shim does with them
BY_PATH = ["stat", "stat64", "lstat", "lstat64", "fstatat", "fstatat-nofollow", "fstatat-dirfd",
           "fstatat64-dirfd-nofollow", "fstatat-empty-path-flag", "__xstat", "__xstat64", "__lxstat",
           "__lxstat64", "__fxstatat", "__fxstatat64-dirfd-nofollow", "statx-basic", "statx-some",
           "statx-dirfd-nofollow"]
NOFOLLOW = ["lstat", "lstat64", "fstatat-nofollow", "fstatat64-dirfd-nofollow", "__lxstat", "__lxstat64",
            "__fxstatat64-dirfd-nofollow", "statx-dirfd-nofollow"]
BY_FD = ["fstat", "fstat64", "__fxstat", "__fxstat64", "fstatat-empty-path", "__fxstatat-empty-path",
         "statx-empty-path"]
ALWAYS_THE_KERNELS = ["statx-btime", "statx-force-sync"]
F_OK_CALLS = ["access-F_OK", "faccessat-F_OK", "faccessat-F_OK-eaccess", "faccessat-F_OK-nofollow",
              "euidaccess-F_OK", "eaccess-F_OK"]


def statall(se: ShimEnv, cbin: Path, path: Path, shim: bool = True, index: Path | None = None) -> dict[str, str]:
    env = dict(se.env)
    if not shim:
        del env["LD_PRELOAD"]
    if index is not None:
        env["TIERING_INDEX"] = str(index)
    r = se.run([str(cbin / "statall"), str(path)], env=env)
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines())


def touch_after_the_scan(path: Path) -> None:
    """Other times (and so another ctime) than the scan recorded.  The atime
    lies ahead of the new ctime, so that reads do not move it (relatime)."""
    os.utime(path, ns=(time.time_ns() + 3600 * 10**9, 1_600_000_000_987_654_321), follow_symlinks=False)


@pytest.mark.parametrize("placed", [True, False])
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_every_stat_entry_point_answers_as_the_pfs_does_from_the_index(shimenv, cbin, placed):
    """Field by field what the PFS answers, errno untouched; after the file
    changed behind the job's back, the calls answered from the index still
    show the scan's view: by path always, by descriptor when the descriptor
    is on a tier copy (whose own metadata is not the file's)."""
    if placed:
        place_like_the_daemon(shimenv)
    src = shimenv.root / REL
    before = statall(shimenv, cbin, src, shim=False)
    assert "errno=4242" in before["stat"] and before["statx-basic"].startswith("mask=7ff ")
    assert statall(shimenv, cbin, src) == before
    touch_after_the_scan(src)
    live, got = statall(shimenv, cbin, src, shim=False), statall(shimenv, cbin, src)
    from_index = BY_PATH + (BY_FD if placed else [])
    for call in before:
        if call in from_index:
            assert got[call] == before[call] != live[call], call
        else:
            assert got[call] == live[call], call
    assert set(ALWAYS_THE_KERNELS) <= set(before) - set(from_index)
    assert shimenv.index.counters()["opens_tier" if placed else "opens_pfs"] == ([2] if placed else 2)


def test_a_path_that_is_a_symlink_is_the_kernels_without_following(tmp_path, cbin):
    """lstat (and every no-follow form) of a catalogued symlink passes
    through; stat of it is the file's, from the index."""
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    link = root / "link.bin"
    before = statall(se, cbin, link, shim=False)
    assert before["lstat"] != before["stat"]
    touch_after_the_scan(link)                 # the link's own times
    touch_after_the_scan(root / "real.bin")    # and the file's
    live, got = statall(se, cbin, link, shim=False), statall(se, cbin, link)
    for call in BY_PATH:
        if call in NOFOLLOW:
            assert got[call] == live[call] != before[call], call
        else:
            assert got[call] == before[call] != live[call], call
    se.index.close()


def test_a_file_written_during_the_job_is_stat_by_the_kernel(shimenv, cbin):
    src = shimenv.root / REL
    r = shimenv.run([PYTHON, "-c", f"open({str(src)!r}, 'ab').write(b'more')"])
    assert r.returncode == 0 and shimenv.state(REL) == lib.TIERING_STATE_INVALID
    assert statall(shimenv, cbin, src) == statall(shimenv, cbin, src, shim=False)
    assert f"size={len(shimenv.contents[REL]) + 4} " in statall(shimenv, cbin, src)["stat"]


def test_a_catalog_from_the_scan_cache_is_stat_by_the_kernel(tmp_path, cbin):
    """The cache cannot show a file changed in place since it was written
    (no directory changes), so only this job's own scan is answered from."""
    root, _ = alias_tree(tmp_path)
    for d in (root, root / "d"):    # made long enough before the scan to be cached
        os.utime(d, ns=(1_400_000_000 * 10**9,) * 2)
    cache = tmp_path / "cache"
    scanned = catalog_shimenv(tmp_path / "scanned", root, cache_dir=cache)
    touch_after_the_scan(root / "real.bin")
    cached = catalog_shimenv(tmp_path / "cached", root, cache_dir=cache)
    stat_flag = lib.TIERING_FILE_STAT
    assert all(scanned.index.files["flags"] & stat_flag) and not any(cached.index.files["flags"] & stat_flag)
    live = statall(cached, cbin, root / "real.bin", shim=False)
    assert statall(cached, cbin, root / "real.bin")["stat"] == live["stat"]
    assert statall(scanned, cbin, root / "real.bin")["stat"] != live["stat"]
    scanned.index.close()
    cached.index.close()


@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_access_answers_only_existence(shimenv, cbin):
    """access(F_OK) is a stat; R_OK is a permission, always the kernel's."""
    src = shimenv.root / REL
    src.unlink()
    got, live = statall(shimenv, cbin, src), statall(shimenv, cbin, src, shim=False)
    for call in F_OK_CALLS:
        assert (got[call], live[call]) == ("ok errno=4242", "fail errno=2"), call
    assert got["access-R_OK"] == live["access-R_OK"] == "fail errno=2"


def test_only_a_process_with_the_scanners_credentials_is_answered(tmp_path, shimenv, cbin):
    """Another user, group or set of supplementary groups may not reach what
    the scan reached: the kernel answers."""
    src = shimenv.root / REL
    rels = sorted(shimenv.contents)
    stats = [(shimenv.root / r).stat() for r in rels]
    src.unlink()
    me = Credentials.current()
    run = private_dir(tmp_path / "indexes")
    for k, (scanner, answered) in enumerate([
            (me, True), (Credentials(me.uid + 1, me.gid, me.groups), False),
            (Credentials(me.uid, me.gid + 1, me.groups), False),
            (Credentials(me.uid, me.gid, (*me.groups, 54321)), False)]):
        index, _ = SharedIndex.create(
            run / f"index{k}", [Root(str(shimenv.root), 0)], [str(shimenv.tier)], rels, [0] * len(rels),
            [s.st_size for s in stats], [s.st_mtime_ns for s in stats], devs=[s.st_dev for s in stats],
            inos=[s.st_ino for s in stats], links=[False] * len(rels), stats=FileStats.of(stats, [True] * len(stats)), scanner=scanner)
        got = statall(shimenv, cbin, src, index=index.path)
        assert got["stat"].startswith("dev=") if answered else got["stat"] == "errno=2", scanner
        index.close()


def test_a_process_that_changes_its_credentials_asks_the_kernel(shimenv, cbin):
    """From its first call that changes credentials on, a process's stats are
    the kernel's; a vfork child's call (it shares the parent's memory)
    changes nothing for the parent."""
    src = shimenv.root / REL
    recorded = src.stat().st_mtime_ns
    touch_after_the_scan(src)
    r = shimenv.run([str(cbin / "credstat"), str(src)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(recorded), str(recorded), str(src.stat().st_mtime_ns)]


def test_stat_by_python_is_the_pfs_s_view_of_the_file(shimenv):
    """What CPython calls (stat64, lstat64, fstatat64, fstat64 after open,
    access): os.stat, os.lstat, os.path.*, os.fstat of a file opened from a
    tier, os.scandir's entries."""
    place_like_the_daemon(shimenv)
    script = textwrap.dedent(f"""
        import json, os
        root = {str(shimenv.root)!r}
        out = {{}}
        fields = ('st_mode', 'st_ino', 'st_dev', 'st_nlink', 'st_uid', 'st_gid', 'st_size', 'st_atime_ns',
                  'st_mtime_ns', 'st_ctime_ns', 'st_blocks', 'st_blksize', 'st_rdev')
        def of(st):
            return [getattr(st, f) for f in fields]
        for rel in {sorted(shimenv.contents)!r}:
            p = os.path.join(root, rel)
            with open(p, 'rb') as f:
                fst = os.fstat(f.fileno())
            d = os.path.dirname(p)
            entry = [e for e in os.scandir(d) if e.name == os.path.basename(p)][0]
            dfd = os.open(d, os.O_RDONLY)
            out[rel] = [of(os.stat(p)), of(os.lstat(p)), of(fst), of(entry.stat()),
                        of(os.stat(os.path.basename(p), dir_fd=dfd)),
                        os.path.exists(p), os.path.isfile(p), os.path.getsize(p), os.access(p, os.F_OK)]
            os.close(dfd)
        print(json.dumps(out))
    """)
    plain = dict(shimenv.env)
    del plain["LD_PRELOAD"]
    want = json.loads(shimenv.run([PYTHON, "-c", script], env=plain).stdout)
    for rel in shimenv.contents:
        touch_after_the_scan(shimenv.root / rel)
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want
    assert shimenv.index.counters()["opens_tier"] == [len(shimenv.contents)]


# -- tags: NOTE [open tags] ------------------------------------------------------------

def test_each_open_carries_the_tag_of_its_thread(shimenv):
    """tiering_set_tag through ctypes, as the order hook calls it around
    dataset[i]: thread-local, read back by tiering_get_tag and posted with
    every event of the thread (0 before any tag is set)."""
    shimenv.place("a/one.bin")
    root = str(shimenv.root)
    script = textwrap.dedent(f"""
        import ctypes, os, threading
        shim = ctypes.CDLL(None)   # the preloaded library's symbols are global
        shim.tiering_get_tag.restype = ctypes.c_uint32
        def read(rel):
            with open(os.path.join({root!r}, rel), 'rb') as f:
                f.read()
        read('b/.hidden')
        shim.tiering_set_tag(7)
        read('a/one.bin')
        def other():
            shim.tiering_set_tag(0xFFFFFFFF)
            read('a/two.bin')
            print(shim.tiering_get_tag())
        t = threading.Thread(target=other)
        t.start(); t.join()
        print(shim.tiering_get_tag())
        read('c/big.bin')
        shim.tiering_set_tag(0)
        read('top.bin')
    """)
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(0xFFFFFFFF), "7"]
    name = {s: rel for rel, s in shimenv.slots.items()}
    got = [(e.kind, name[e.slot], e.tag) for e in shimenv.index.drain()]
    open_tier, open_pfs, close = lib.TIERING_EV_OPEN_TIER, lib.TIERING_EV_OPEN_PFS, lib.TIERING_EV_CLOSE
    assert got == [(open_pfs, "b/.hidden", 0), (close, "b/.hidden", 0),
                   (open_tier, "a/one.bin", 7), (close, "a/one.bin", 7),
                   (open_pfs, "a/two.bin", 0xFFFFFFFF), (close, "a/two.bin", 0xFFFFFFFF),
                   (open_pfs, "c/big.bin", 7), (close, "c/big.bin", 7),
                   (open_pfs, "top.bin", 0), (close, "top.bin", 0)]


# -- open counters: NOTE [open counters] ----------------------------------------------

def test_each_entry_counts_the_successful_opens_of_its_path(shimenv):
    """From a tier or from the PFS, by every entry point; write opens and
    failed opens are not counted; the numpy view reads them live."""
    shimenv.place("a/one.bin")
    root = str(shimenv.root)
    script = textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None)
        libc.fopen.restype = ctypes.c_void_p
        p = lambda rel: os.path.join({root!r}, rel)
        for _ in range(3):
            os.close(os.open(p('a/one.bin'), os.O_RDONLY))
        libc.fclose(ctypes.c_void_p(libc.fopen(p('a/two.bin').encode(), b'r')))
        os.close(os.open(p('a/two.bin'), os.O_RDONLY | os.O_NOFOLLOW))
        os.close(os.open(p('b/.hidden'), os.O_RDWR))          # a write open
        try:
            os.open(p('top.bin'), os.O_RDONLY | os.O_DIRECTORY)
        except NotADirectoryError:
            pass
    """)
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    opens = shimenv.index.opens
    assert opens.shape == (int(shimenv.index.header.nslots),)
    assert {rel: int(opens[s]) for rel, s in shimenv.slots.items()} == {
        rel: {"a/one.bin": 3, "a/two.bin": 2}.get(rel, 0) for rel in shimenv.contents}
    assert int(opens.sum()) == shimenv.index.counters()["opens"] == 5


# -- the PFS's metadata server is spared ------------------------------------------

STAT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    paths = json.loads(sys.argv[1])
    fields = ('st_mode', 'st_ino', 'st_dev', 'st_nlink', 'st_uid', 'st_gid', 'st_size', 'st_atime_ns',
              'st_mtime_ns', 'st_ctime_ns', 'st_blocks', 'st_blksize', 'st_rdev')
    print('ready', flush=True)
    sys.stdin.readline()
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([os.path.exists(p), os.path.isfile(p), os.path.getsize(p), [getattr(st, f) for f in fields]])
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
""")


def stats_per_sample(paths: list[str], env: dict[str, str], fs: Any, cwd: Path) -> tuple[list[Any], int]:
    """What os.path.exists, isfile, getsize and os.stat say of each path in a
    process started beforehand, and how many metadata operations the PFS
    served while it asked."""
    p = subprocess.Popen([PYTHON, "-c", STAT_SCRIPT, json.dumps(paths)], env=env, cwd=cwd, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "ready"
        before = fs.stats()
        p.stdin.write("go\n")
        p.stdin.flush()
        answers = json.loads(p.stdout.readline())
        after = fs.stats()
        p.stdin.write("done\n")
        p.stdin.flush()
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return answers, after["meta_ops"] - before["meta_ops"]


@pytest.mark.fuse
def test_stat_per_sample_costs_the_pfs_no_metadata_operation(tmp_path):
    """On slowfs (every lookup and getattr reaches the emulated PFS and is
    counted): a sample's os.path.exists, isfile, getsize and os.stat cost the
    PFS nothing once the index is loaded, and say exactly what they say
    without the shim."""
    from bench.slowfs import SlowFs, SlowFsOptions
    from tiering.catalog import scan
    src = tmp_path / "src"
    make_data(src, {f"c{i % 4}/s{i:03d}.bin": 100 + 37 * i for i in range(40)})
    options = SlowFsOptions(meta_latency_ms=0.02, read_latency_ms=0.02, bandwidth_mbps=0)
    with SlowFs(src, tmp_path / "mnt", options) as fs:
        cat = scan([str(fs.path)])            # through the PFS, as tier-run does
        index, _ = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                           [str(private_dir(tmp_path / "tier"))], cat)
        paths = [cat.source_path(f) for f in cat.files]
        env = dict(os.environ, LD_PRELOAD=str(library_path()), TIERING_INDEX=str(index.path))
        env.pop("TIERING_DISABLE", None)
        plain = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
        want, pfs_ops = stats_per_sample(paths, plain, fs, tmp_path)
        got, shim_ops = stats_per_sample(paths, env, fs, tmp_path)
        index.close()
    assert len(got) == 40 and got == want
    assert pfs_ops >= 4 * len(paths)       # without the shim: each call at least one
    assert shim_ops == 0, (shim_ops, pfs_ops)
