"""The shim, driven through C programs and Python under LD_PRELOAD."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import (
    PYTHON,
    REPO,
    ShimEnv,
    alias_tree,
    build_index,
    catalog_shimenv,
    make_data,
    place_like_the_daemon,
    private_dir,
)
from tiering.placement.index import Root, SharedIndex, lib

ENTRIES = ["open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
           "__openat64_2", "fopen", "fopen64", "freopen", "freopen64"]


def read_via(se: ShimEnv, cbin: Path, entry: str, path: str, tmp: Path, dir_: str | None = None,
             cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[bytes, str]:
    out = tmp / f"out-{entry}"
    args = [str(cbin / "shimtest"), entry, path, str(out)] + ([dir_] if dir_ else [])
    r = se.run(args, env=env, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return out.read_bytes(), r.stdout.strip()


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_every_entry_point_serves_the_tier_copy_with_the_same_bytes(shimenv, cbin, tmp_path, entry):
    shimenv.place_all()
    for rel, data in shimenv.contents.items():
        if "at" in entry.replace("__open", ""):  # the *at forms: relative to a directory fd
            got, target = read_via(shimenv, cbin, entry, rel, tmp_path, dir_=str(shimenv.root))
        else:
            got, target = read_via(shimenv, cbin, entry, str(shimenv.root / rel), tmp_path)
        assert got == data, rel
        assert target == str(shimenv.tier / "0" / rel), rel
    c = shimenv.index.counters()
    assert c["opens"] == len(shimenv.contents)
    assert c["opens_tier"] == [len(shimenv.contents)]
    assert c["opens_pfs"] == 0
    assert c["bytes_tier"] == sum(len(d) for d in shimenv.contents.values())


@pytest.mark.parametrize("entry", ["open", "fopen", "openat"])
def test_unplaced_files_are_read_from_the_pfs_and_counted(shimenv, cbin, tmp_path, entry):
    rel = "a/two.bin"
    path = rel if entry == "openat" else str(shimenv.root / rel)
    got, target = read_via(shimenv, cbin, entry, path, tmp_path,
                           dir_=str(shimenv.root) if entry == "openat" else None)
    assert got == shimenv.contents[rel]
    assert target == str(shimenv.root / rel)
    c = shimenv.index.counters()
    assert (c["opens"], c["opens_pfs"], c["opens_tier"]) == (1, 1, [0])
    events = shimenv.index.drain()
    assert [(e.kind, e.slot) for e in events] == [(lib.TIERING_EV_OPEN_PFS, shimenv.slots[rel]),
                                                  (lib.TIERING_EV_CLOSE, shimenv.slots[rel])]


def test_a_copy_is_only_served_to_its_own_path(shimenv, cbin, tmp_path):
    shimenv.place("a/one.bin")
    got, target = read_via(shimenv, cbin, "open", str(shimenv.root / "a/two.bin"), tmp_path)
    assert target == str(shimenv.root / "a/two.bin")
    assert got == shimenv.contents["a/two.bin"]


def test_paths_outside_the_catalog_pass_through_uncounted(shimenv, cbin, tmp_path):
    shimenv.place_all()
    late = shimenv.root / "a" / "late.bin"        # created after the scan: a miss
    late.write_bytes(b"late")
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x" * 10)
    for p, data in ((late, b"late"), (outside, b"x" * 10)):
        got, target = read_via(shimenv, cbin, "open", str(p), tmp_path)
        assert (got, target) == (data, str(p))
    missing = shimenv.run([str(cbin / "shimtest"), "open", str(shimenv.root / "nope"), str(tmp_path / "o")])
    assert missing.stdout.strip() == "errno=2"
    assert shimenv.index.counters()["opens"] == 0


@pytest.mark.parametrize("path_form", ["{root}/a/./two.bin", "{root}//a//two.bin", "{root}/./a/.//two.bin"])
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_dot_and_double_slash_paths_resolve_to_the_entry(shimenv, cbin, tmp_path, path_form):
    shimenv.place("a/two.bin")
    got, target = read_via(shimenv, cbin, "open", path_form.format(root=shimenv.root), tmp_path)
    assert got == shimenv.contents["a/two.bin"]
    assert target == str(shimenv.tier / "0" / "a/two.bin")


@pytest.mark.parametrize("path_form", [
    "{root}/a/deep/../two.bin", "{root}/a/deep/er/../../two.bin", "{root}/b/../a/two.bin",
    "{root}/missing/../a/two.bin", "{root}/a/one.bin/../two.bin",
])
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_dotdot_in_the_path_itself_goes_to_the_pfs(shimenv, cbin, tmp_path, path_form):
    """By text these name a/two.bin, but the kernel walks them: "missing/.."
    fails with ENOENT, "one.bin/.." with ENOTDIR, a linked directory's ".."
    leaves its target.  The shim does not guess: the PFS answers."""
    shimenv.place("a/two.bin")
    path = path_form.format(root=shimenv.root)
    plain = dict(shimenv.env)
    del plain["LD_PRELOAD"]
    want = shimenv.run([str(cbin / "shimtest"), "open", path, str(tmp_path / "o")], env=plain).stdout
    got = shimenv.run([str(cbin / "shimtest"), "open", path, str(tmp_path / "o")]).stdout
    assert got == want
    assert got.strip() in (str(shimenv.root / "a/two.bin"), "errno=2", "errno=20")


@pytest.mark.parametrize("suffix", ["/", "/.", "/..", "//"])
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_paths_that_name_a_directory_fail_as_on_the_pfs(shimenv, cbin, tmp_path, suffix):
    shimenv.place("a/two.bin")
    path = f"{shimenv.root}/a/two.bin{suffix}"
    plain = dict(shimenv.env)
    del plain["LD_PRELOAD"]
    want = shimenv.run([str(cbin / "shimtest"), "open", path, str(tmp_path / "o")], env=plain).stdout
    got = shimenv.run([str(cbin / "shimtest"), "open", path, str(tmp_path / "o")]).stdout
    assert got == want
    assert want.strip().startswith("errno=") or suffix == "/.."


def test_double_slash_right_after_the_root(shimenv, cbin, tmp_path):
    shimenv.place("a/two.bin")
    got, target = read_via(shimenv, cbin, "open", f"{shimenv.root}//a/two.bin", tmp_path)
    assert (got, target) == (shimenv.contents["a/two.bin"], str(shimenv.tier / "0" / "a/two.bin"))


def test_dotdot_that_climbs_out_of_the_root_is_not_redirected(shimenv, cbin, tmp_path):
    shimenv.place("a/two.bin")
    path = f"{shimenv.root}/../data/a/two.bin"     # same file, but resolved above the root
    got, target = read_via(shimenv, cbin, "open", path, tmp_path)
    assert got == shimenv.contents["a/two.bin"]
    assert target == str(shimenv.root / "a/two.bin")


@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_relative_paths_from_the_cwd(shimenv, cbin, tmp_path):
    shimenv.place("a/deep/er/three.bin")
    for cwd, rel in ((shimenv.root, "a/deep/er/three.bin"), (shimenv.root / "a" / "deep", "er/three.bin"),
                     (shimenv.root / "b", "../a/deep/er/three.bin"), (shimenv.root / "a", "./deep/er/./three.bin")):
        got, target = read_via(shimenv, cbin, "open", rel, tmp_path, cwd=cwd)
        assert got == shimenv.contents["a/deep/er/three.bin"]
        assert target == str(shimenv.tier / "0" / "a/deep/er/three.bin"), (cwd, rel)


@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_openat_relative_to_a_subdirectory(shimenv, cbin, tmp_path):
    shimenv.place("a/deep/er/three.bin")
    got, target = read_via(shimenv, cbin, "openat", "er/three.bin", tmp_path, dir_=str(shimenv.root / "a/deep"))
    assert got == shimenv.contents["a/deep/er/three.bin"]
    assert target == str(shimenv.tier / "0" / "a/deep/er/three.bin")


def test_symlinked_root_and_its_real_path_both_hit(tmp_path, cbin):
    real = tmp_path / "lustre" / "ds"
    contents = make_data(real, {"x/f.bin": 999})
    link = tmp_path / "pfs"
    link.symlink_to(tmp_path / "lustre")
    tier = private_dir(tmp_path / "tier")
    logical = link / "ds"
    index, slots = build_index(tmp_path, [Root(str(logical), 0), Root(str(real), 0)], real, contents, tier)
    (tier / "0" / "x").mkdir(parents=True)
    (tier / "0" / "x/f.bin").write_bytes(contents["x/f.bin"])
    assert index.cas_state(slots["x/f.bin"], 0, 1)
    se = ShimEnv(real, tier, index, slots, contents,
                 dict(os.environ, LD_PRELOAD=str(Path(lib_path())), TIERING_INDEX=str(index.path)))
    for p in (logical / "x/f.bin", real / "x/f.bin"):
        got, target = read_via(se, cbin, "open", str(p), tmp_path)
        assert got == contents["x/f.bin"]
        assert target == str(tier / "0" / "x/f.bin")
    index.close()


def lib_path() -> Path:
    from tiering.shimlib import library_path
    return library_path()


def test_root_with_symlinked_subdirectory_refuses_dotdot(tmp_path, cbin):
    root = tmp_path / "ds"
    contents = make_data(root, {"a/f.bin": 10, "other/f.bin": 20})
    (root / "link").symlink_to(root / "other")
    tier = private_dir(tmp_path / "tier")
    index, slots = build_index(tmp_path, [Root(str(root), 0, has_dir_links=True)], root, contents, tier)
    for rel in contents:
        (tier / "0" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tier / "0" / rel).write_bytes(contents[rel])
        assert index.cas_state(slots[rel], 0, 1)
    se = ShimEnv(root, tier, index, slots, contents,
                 dict(os.environ, LD_PRELOAD=str(lib_path()), TIERING_INDEX=str(index.path)))
    # "link/../a/f.bin" is, for the kernel, other/../a/f.bin -> root/a/f.bin; by text
    # also a/f.bin, but with a linked directory the shim must not guess
    got, target = read_via(se, cbin, "open", f"{root}/link/../a/f.bin", tmp_path)
    assert got == contents["a/f.bin"]
    assert target == str(root / "a/f.bin")
    got, target = read_via(se, cbin, "open", f"{root}/a/f.bin", tmp_path)
    assert target == str(tier / "0" / "a/f.bin")
    index.close()


@pytest.mark.parametrize("how", ["O_RDWR", "O_WRONLY", "O_TRUNC", "creat", "r+", "w", "a"])
def test_write_opens_pass_through_and_invalidate(shimenv, tmp_path, how):
    rel = "a/one.bin"
    copy = shimenv.place(rel)
    src = shimenv.root / rel
    script = {
        "O_RDWR": f"import os; fd=os.open({str(src)!r}, os.O_RDWR); os.pwrite(fd, b'NEW', 0); os.close(fd)",
        "O_WRONLY": f"import os; fd=os.open({str(src)!r}, os.O_WRONLY); os.write(fd, b'NEW'); os.close(fd)",
        "O_TRUNC": f"import os; fd=os.open({str(src)!r}, os.O_RDONLY|os.O_TRUNC); os.close(fd)",
        "creat": f"import ctypes; l=ctypes.CDLL(None); fd=l.creat({str(src).encode()!r}, 0o644); l.write(fd, b'NEW', 3); l.close(fd)",
        "r+": f"import ctypes; l=ctypes.CDLL(None); l.fopen.restype=ctypes.c_void_p; f=l.fopen({str(src).encode()!r}, b'r+'); l.fwrite(b'NEW', 1, 3, ctypes.c_void_p(f)); l.fclose(ctypes.c_void_p(f))",
        "w": f"import ctypes; l=ctypes.CDLL(None); l.fopen.restype=ctypes.c_void_p; f=l.fopen({str(src).encode()!r}, b'w'); l.fwrite(b'NEW', 1, 3, ctypes.c_void_p(f)); l.fclose(ctypes.c_void_p(f))",
        "a": f"import ctypes; l=ctypes.CDLL(None); l.fopen.restype=ctypes.c_void_p; f=l.fopen({str(src).encode()!r}, b'a'); l.fwrite(b'NEW', 1, 3, ctypes.c_void_p(f)); l.fclose(ctypes.c_void_p(f))",
    }[how]
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    assert shimenv.state(rel) == lib.TIERING_STATE_INVALID
    assert copy.read_bytes() == shimenv.contents[rel]       # the copy was never written
    now = src.read_bytes()
    assert now != shimenv.contents[rel]                      # the write reached the source
    # a later read-only open sees the new bytes, from the PFS
    r = shimenv.run([PYTHON, "-c", f"import sys; sys.stdout.write(open({str(src)!r}, 'rb').read().hex())"])
    assert bytes.fromhex(r.stdout) == now
    c = shimenv.index.counters()
    assert c["writes"] == 1 and c["opens_tier"] == [0]
    kinds = [e.kind for e in shimenv.index.drain()]
    assert lib.TIERING_EV_WRITE in kinds


@pytest.mark.parametrize("how", ["O_EXCL", "O_DIRECTORY"])
def test_failed_write_opens_leave_the_copy_in_service(shimenv, cbin, tmp_path, how):
    """A write open that fails changed nothing: the copy stays published and
    later reads are still served from the tier."""
    rel = "a/one.bin"
    shimenv.place(rel)
    src = shimenv.root / rel
    script = {
        "O_EXCL": f"import os\ntry: os.open({str(src)!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL)\n"
                  "except FileExistsError: print('failed')",
        "O_DIRECTORY": f"import os\ntry: os.open({str(src)!r}, os.O_RDWR | os.O_DIRECTORY)\n"
                       "except OSError: print('failed')",
    }[how]
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0 and r.stdout.strip() == "failed", r.stderr
    assert shimenv.state(rel) == 1
    assert shimenv.index.counters()["writes"] == 0
    got, target = read_via(shimenv, cbin, "open", str(src), tmp_path)
    assert target.startswith(str(shimenv.tier)) and got == shimenv.contents[rel]


@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_evicted_copy_falls_back_to_the_pfs_with_errno_untouched(shimenv, cbin, tmp_path):
    rel = "a/two.bin"
    copy = shimenv.place(rel)
    copy.unlink()  # state still says tier 0: the copy vanished between lookup and open
    got, target = read_via(shimenv, cbin, "open", str(shimenv.root / rel), tmp_path)
    assert (got, target) == (shimenv.contents[rel], str(shimenv.root / rel))
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        ctypes.set_errno(1234)
        fd = libc.open({str(shimenv.root / rel).encode()!r}, os.O_RDONLY)
        print(fd >= 0, ctypes.get_errno())
    """)])
    assert r.stdout.split() == ["True", "1234"]
    c = shimenv.index.counters()
    assert c["fallbacks"] == 2 and c["opens_pfs"] == 2


def test_where_names_the_tier_only_once_the_copy_is_published(shimenv, tmp_path):
    """tiering_where: the tier an open would be served from, -1 for the
    path itself; it opens nothing (no count, no event)."""
    rel, other = "a/two.bin", "a/one.bin"
    copy = shimenv.tier / "0" / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(shimenv.contents[rel])      # renamed into place, not published yet
    script = textwrap.dedent("""
        import ctypes, sys
        where = ctypes.CDLL(None).tiering_where
        where.argtypes = [ctypes.c_char_p]
        print(*(where(p.encode()) for p in sys.argv[1:]))
    """)
    paths = [str(shimenv.root / rel), str(shimenv.root / other), str(tmp_path / "elsewhere"), str(shimenv.root)]
    def ask() -> list[str]:
        return shimenv.run([PYTHON, "-c", script, *paths]).stdout.split()
    assert ask() == ["-1", "-1", "-1", "-1"]
    assert shimenv.index.cas_state(shimenv.slots[rel], lib.TIERING_STATE_NONE, 1)
    assert ask() == ["0", "-1", "-1", "-1"]
    assert shimenv.run([PYTHON, "-c", script, rel], cwd=shimenv.root).stdout.split() == ["0"]
    c = shimenv.index.counters()
    assert c["opens"] == 0 and shimenv.index.drain() == []


def _pass_through_check(se: ShimEnv, cbin: Path, tmp_path: Path, env: dict[str, str]) -> None:
    se.place_all()
    for rel in ("a/one.bin", "c/big.bin"):
        got, target = read_via(se, cbin, "open", str(se.root / rel), tmp_path, env=env)
        assert (got, target) == (se.contents[rel], str(se.root / rel))


def test_no_index_passes_through(shimenv, cbin, tmp_path):
    env = dict(shimenv.env)
    del env["TIERING_INDEX"]
    _pass_through_check(shimenv, cbin, tmp_path, env)


def test_disable_variable_passes_through(shimenv, cbin, tmp_path):
    _pass_through_check(shimenv, cbin, tmp_path, dict(shimenv.env, TIERING_DISABLE="1"))
    assert shimenv.index.counters()["opens"] == 0


def test_missing_index_file_passes_through_and_debug_says_why(shimenv, cbin, tmp_path):
    env = dict(shimenv.env, TIERING_INDEX=str(tmp_path / "nope"), TIERING_DEBUG="1")
    _pass_through_check(shimenv, cbin, tmp_path, env)
    r = shimenv.run([str(cbin / "shimtest"), "open", str(shimenv.root / "top.bin"), str(tmp_path / "o")], env=env)
    assert "cannot open" in r.stderr


def test_foreign_owned_index_is_refused(shimenv, cbin, tmp_path):
    os.chown(shimenv.index.path, 12345, 12345)
    env = dict(shimenv.env, TIERING_DEBUG="1")
    _pass_through_check(shimenv, cbin, tmp_path, env)
    r = shimenv.run([str(cbin / "shimtest"), "open", str(shimenv.root / "top.bin"), str(tmp_path / "o")], env=env)
    assert "not a private file" in r.stderr


@pytest.mark.parametrize("target", ["file", "dir"])
def test_index_readable_by_others_is_refused(shimenv, cbin, tmp_path, target):
    os.chmod(shimenv.index.path if target == "file" else shimenv.index.path.parent, 0o755)
    _pass_through_check(shimenv, cbin, tmp_path, shimenv.env)


@pytest.mark.parametrize("damage", ["magic", "version", "truncated", "nroots", "tier_path"])
@pytest.mark.sanitizers("asan")   # one thread: nothing for TSan
def test_malformed_index_is_refused(shimenv, cbin, tmp_path, damage):
    h = shimenv.index.header
    if damage == "magic":
        h.magic = 0
    elif damage == "version":
        h.version = 999
    elif damage == "nroots":
        h.nroots = 1000
    elif damage == "tier_path":
        h.tiers[0].path[0] = b"x"
    else:  # a truncated copy: the live mapping of this process must stay whole
        short = shimenv.index.path.parent / "short"
        short.write_bytes(shimenv.index.path.read_bytes()[:4096])
        os.chmod(short, 0o600)
        _pass_through_check(shimenv, cbin, tmp_path, dict(shimenv.env, TIERING_INDEX=str(short)))
        return
    _pass_through_check(shimenv, cbin, tmp_path, shimenv.env)


def test_python_open_and_numpy_fromfile_read_the_copy(shimenv, tmp_path):
    rel = "c/big.bin"
    copy = shimenv.place(rel)
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import os, hashlib, mmap
        p = {str(shimenv.root / rel)!r}
        with open(p, 'rb') as f:
            print(os.readlink(f'/proc/self/fd/{{f.fileno()}}'), hashlib.sha256(f.read()).hexdigest())
        with open(p, 'rb') as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            print(hashlib.sha256(m[:]).hexdigest())
    """)])
    assert r.returncode == 0, r.stderr
    import hashlib
    want = hashlib.sha256(shimenv.contents[rel]).hexdigest()
    lines = r.stdout.split()
    assert lines == [str(copy), want, want]


@pytest.mark.sanitizers("asan", "tsan")
def test_fd_bookkeeping_posts_one_close_per_descriptor(shimenv, cbin):
    rel = "a/one.bin"
    shimenv.place(rel)
    r = shimenv.run([str(cbin / "fdbook"), str(shimenv.root / rel)])
    assert r.stdout.strip() == "ok", r.stderr
    events = shimenv.index.drain()
    kinds = [e.kind for e in events]
    assert kinds.count(lib.TIERING_EV_OPEN_TIER) == 3
    assert kinds.count(lib.TIERING_EV_CLOSE) == 9
    assert all(e.slot == shimenv.slots[rel] for e in events)
    assert len({e.pid for e in events}) == 1


# -- bytes read, by the file position at close: NOTE [read counters] ------------------------

def read_through(se, cbin: Path, rel: str, *how: str, placed: bool = False) -> tuple[int, dict, list]:
    """Runs readpos on rel (placed in the tier first, if asked): what it says
    it read, the index's counters, the close events."""
    if placed:
        se.place(rel)
    r = se.run([str(cbin / "readpos"), str(se.root / rel), *how])
    assert r.returncode == 0, r.stderr
    closes = [e for e in se.index.drain() if e.kind == lib.TIERING_EV_CLOSE]
    return int(r.stdout), se.index.counters(), closes


def read_figures(c: dict) -> tuple[int, int, int]:
    return c["read_pfs"], c["read_tier"], c["closed_at_zero"]


def as_read(n: int, placed: bool) -> tuple[int, int, int]:
    """read_figures after n bytes read from the tier copy or from the PFS"""
    return (0, n, 0) if placed else (n, 0, 0)


@pytest.mark.parametrize("placed", [False, True], ids=["pfs", "tier"])
def test_a_reader_of_the_first_4_kib_counts_4_kib_not_the_file_size(shimenv, cbin, placed):
    n, c, closes = read_through(shimenv, cbin, "c/big.bin", "head", "4096", placed=placed)   # 3,000,000 bytes
    assert n == 4096
    assert read_figures(c) == as_read(4096, placed)
    assert [(e.bytes, e.tier) for e in closes] == [(4096, 1 if placed else 0)]


@pytest.mark.parametrize("placed", [False, True], ids=["pfs", "tier"])
def test_a_whole_file_reader_counts_the_file_size(shimenv, cbin, placed):
    n, c, closes = read_through(shimenv, cbin, "a/two.bin", "whole", placed=placed)
    assert n == len(shimenv.contents["a/two.bin"]) == 70_000
    assert read_figures(c) == as_read(n, placed)
    assert [e.bytes for e in closes] == [n]


@pytest.mark.parametrize("placed", [False, True], ids=["pfs", "tier"])
@pytest.mark.sanitizers("asan", "tsan")
def test_duplicated_descriptors_count_their_open_file_once(shimenv, cbin, placed):
    n, c, closes = read_through(shimenv, cbin, "a/two.bin", "dups", placed=placed)
    assert n == 2000
    assert read_figures(c) == as_read(2000, placed)
    # five descriptors, each closed once (one of them by dup2); the bytes posted once
    assert len(closes) == 5 and sum(e.bytes for e in closes) == 2000


@pytest.mark.sanitizers("asan", "tsan")
def test_a_file_closed_by_fclose_counts_once_at_its_position(shimenv, cbin):
    rel = "c/big.bin"
    n, c, closes = read_through(shimenv, cbin, rel, "stdio")
    assert 100 <= n - 3_000_000 <= 65536      # fopen read to the end; fdopen's buffer read ahead of 100
    assert read_figures(c) == (n, 0, 0)
    assert len(closes) == 2 and sum(e.bytes for e in closes) == n


def test_a_pread_reader_is_counted_as_closed_at_position_0_with_its_file_size(shimenv, cbin):
    rel = "a/two.bin"
    n, c, closes = read_through(shimenv, cbin, rel, "pread")
    assert n == 70_000
    assert read_figures(c) == (0, 0, 1) and c["closed_at_zero_bytes"] == 70_000
    assert [e.bytes for e in closes] == [0]


@pytest.mark.sanitizers("asan", "tsan")
def test_a_forked_child_closing_an_inherited_descriptor_leaves_the_count_to_the_parent(shimenv, cbin):
    rel = "a/two.bin"
    n, c, closes = read_through(shimenv, cbin, rel, "fork")
    assert n == 200
    assert read_figures(c) == (200, 0, 0)
    assert sorted(e.bytes for e in closes) == [0, 200] and len({e.pid for e in closes}) == 2


@pytest.mark.sanitizers("asan", "tsan")
def test_a_forked_child_closing_an_inherited_descriptor_asks_for_no_position(shimenv, cbin):
    """The child's close counts nothing, so it makes no lseek; the parent's does."""
    rel = "a/two.bin"
    env = {k: v for k, v in shimenv.env.items() if k != "LD_PRELOAD"}   # the shim is built into the program
    r = shimenv.run([str(cbin / "forkclose"), str(shimenv.root / rel)], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"]
    assert read_figures(shimenv.index.counters()) == (200, 0, 0)


@pytest.mark.sanitizers("asan", "tsan")
def test_threads_duplicating_and_closing_one_file_at_once_count_its_bytes_once(shimenv, cbin):
    """Threads that dup, read and close one open file at once: every
    descriptor posts exactly one close, and the bytes read through the file
    are booked once (its cell is raised atomically, no lock, no walk)."""
    rel = "a/two.bin"
    booked = 0
    for _ in range(3):   # a race: each run is one more chance for a miscount to show
        n, c, closes = read_through(shimenv, cbin, rel, "threads")
        assert n == 4 * 5000
        assert len(closes) == 1 + 4 * 5000
        assert all(e.slot == shimenv.slots[rel] and e.tier == 0 for e in closes)
        assert sum(e.bytes for e in closes) == n
        assert c["read_pfs"] - booked == n and c["read_tier"] == c["closed_at_zero"] == 0
        booked = c["read_pfs"]


@pytest.mark.slow
@pytest.mark.sanitizers("asan", "tsan")
def test_a_dup_racing_with_a_close_of_its_source_leaks_no_cell_and_books_no_byte_twice(shimenv, cbin):
    """Rounds of a dup of a descriptor while another thread closes it and a
    third opens the file again (taking a cell as soon as one is let go):
    once every descriptor is closed no cell is held, and no byte is booked
    twice (the dup's byte may go unbooked: it may have lost the race)."""
    rel, rounds = "a/two.bin", 20_000
    env = {k: v for k, v in shimenv.env.items() if k != "LD_PRELOAD"}   # the shim is built into the program
    r = shimenv.run([str(cbin / "cellrace"), str(shimenv.root / rel), str(rounds)], env=env)
    assert r.returncode == 0, r.stderr
    got, held = map(int, r.stdout.split())
    c = shimenv.index.counters()
    assert held == 0
    assert got - rounds <= c["read_pfs"] <= got, (got, c["read_pfs"])
    assert c["read_tier"] == 0


@pytest.mark.sanitizers("asan", "tsan")
def test_a_dup_whose_source_is_closed_and_opened_again_meanwhile_books_no_byte_twice(shimenv, cbin):
    """Between a dup's system call and its bookkeeping, the source is closed
    and the file opened again on the same descriptor, taking the same cell:
    the copy (of the first open file) does not join the new open's cell, so
    its close does not book bytes the new open's close booked already."""
    rel = "a/two.bin"
    env = {k: v for k, v in shimenv.env.items() if k != "LD_PRELOAD"}   # the shim is built into the program
    r = shimenv.run([str(cbin / "dupreopen"), str(shimenv.root / rel)], env=env)
    assert r.returncode == 0, r.stderr
    got, raced = map(int, r.stdout.split())
    assert raced == 1
    c = shimenv.index.counters()
    assert got - 1 <= c["read_pfs"] <= got, (got, c["read_pfs"])   # the copy's byte may go unbooked
    assert c["read_tier"] == 0


def test_numpy_fromfile_of_a_python_file_counts_the_file_once(shimenv):
    """np.fromfile(f) duplicates f's descriptor, reads through a FILE* of the
    duplicate, fcloses it and moves f to where it stopped: one open file."""
    rel = "a/two.bin"
    shimenv.place(rel)
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import numpy as np
        with open({str(shimenv.root / rel)!r}, "rb") as f:
            print(np.fromfile(f, dtype=np.uint8).size, f.tell())
    """)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["70000", "70000"]
    c = shimenv.index.counters()
    assert read_figures(c) == (0, 70_000, 0)


def test_stale_descriptor_numbers_post_one_close(shimenv, tmp_path):
    """An fd number reused by an uncatalogued open must not carry the old entry:
    its file was closed, seen by the shim or not, so exactly one close is posted."""
    rel = "a/one.bin"
    shimenv.place(rel)
    other = tmp_path / "other.bin"
    other.write_bytes(b"o")
    script = textwrap.dedent(f"""
        import os
        fd = os.open({str(shimenv.root / rel)!r}, os.O_RDONLY)
        os.closerange(fd, fd + 1)          # not through close(): the shim may not see it
        fd2 = os.open({str(other)!r}, os.O_RDONLY)
        assert fd2 == fd, (fd, fd2)
        os.close(fd2)
    """)
    r = shimenv.run([PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    kinds = [e.kind for e in shimenv.index.drain()]
    assert kinds.count(lib.TIERING_EV_OPEN_TIER) == 1
    assert kinds.count(lib.TIERING_EV_CLOSE) == 1


def test_flags_that_change_semantics_go_to_the_pfs_without_invalidating(shimenv, tmp_path):
    """O_DIRECT could behave differently on the copy, O_NOATIME fails on a file
    of another user, O_PATH names the file itself (fstat, fchdir, *at calls):
    all reach the PFS (O_DIRECTORY fails there)."""
    rel = "a/one.bin"
    shimenv.place(rel)
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import os
        for fl in (os.O_DIRECT, os.O_NOATIME, os.O_PATH, os.O_DIRECTORY):
            try:
                fd = os.open({str(shimenv.root / rel)!r}, os.O_RDONLY | fl)
            except OSError as e:
                print('errno', e.errno)
                continue
            print(os.readlink(f'/proc/self/fd/{{fd}}'))
            os.close(fd)
    """)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(shimenv.root / rel)] * 3 + ["errno", str(errno.ENOTDIR)]
    assert shimenv.state(rel) == 1
    assert shimenv.index.counters()["opens_tier"] == [0]


TOOL_FLAGS = {"O_NOFOLLOW": os.O_NOFOLLOW, "O_NONBLOCK": os.O_NONBLOCK, "O_NOCTTY": os.O_NOCTTY,
              "tar": os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC}


@pytest.mark.parametrize("flags", sorted(TOOL_FLAGS))
def test_flags_tools_open_with_are_served_from_the_tier(shimenv, flags):
    """tar, rsync, find -exec and many C tools open with O_NOFOLLOW,
    O_NONBLOCK, O_NOCTTY: nothing changes for a regular file that the catalog
    saw without a symlink as its last component."""
    shimenv.place_all()
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import hashlib, json, os
        out = {{}}
        for rel in {sorted(shimenv.contents)!r}:
            fd = os.open(os.path.join({str(shimenv.root)!r}, rel), os.O_RDONLY | {TOOL_FLAGS[flags]})
            data = b''.join(iter(lambda: os.read(fd, 1 << 20), b''))
            out[rel] = [os.readlink(f'/proc/self/fd/{{fd}}'), hashlib.sha256(data).hexdigest()]
            os.close(fd)
        print(json.dumps(out))
    """)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {rel: [str(shimenv.tier / "0" / rel), hashlib.sha256(data).hexdigest()]
                                    for rel, data in shimenv.contents.items()}
    assert shimenv.index.counters()["opens_tier"] == [len(shimenv.contents)]


def test_tar_is_served_from_the_tiers_on_its_second_pass(shimenv):
    """GNU tar opens with O_NOFOLLOW | O_NONBLOCK | O_NOCTTY relative to a
    directory fd, fstatat's each name and fstat's the open descriptor: the
    archive is byte for byte the one made without the shim, read from the
    PFS on the first pass and from the tiers on the second."""
    plain = dict(shimenv.env)
    del plain["LD_PRELOAD"]

    def tar(env: dict[str, str]) -> bytes:
        r = subprocess.run(["tar", "cf", "-", "."], cwd=shimenv.root, env=env, capture_output=True, timeout=120)
        assert (r.returncode, r.stderr) == (0, b"")
        return r.stdout

    want = tar(plain)
    opened = sum(1 for data in shimenv.contents.values() if data)  # tar reads no empty file
    assert tar(shimenv.env) == want
    c = shimenv.index.counters()
    assert (c["opens_pfs"], c["opens_tier"]) == (opened, [0])
    place_like_the_daemon(shimenv)
    assert tar(shimenv.env) == want
    c = shimenv.index.counters()
    assert (c["opens_pfs"], c["opens_tier"]) == (opened, [opened])


def test_nofollow_is_served_unless_the_catalogued_path_is_a_symlink(tmp_path):
    """An O_NOFOLLOW open of a path whose last component is a symlink fails
    with ELOOP, as on the PFS; the file itself and its hard link are served."""
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    script = textwrap.dedent(f"""
        import os
        for rel in ("real.bin", "hard.bin", "link.bin"):
            try:
                fd = os.open(os.path.join({str(root)!r}, rel), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as e:
                print('errno', e.errno)
                continue
            print(os.readlink(f'/proc/self/fd/{{fd}}'))
    """)
    plain = dict(se.env)
    del plain["LD_PRELOAD"]
    assert se.run([PYTHON, "-c", script], env=plain).stdout.split()[-2:] == ["errno", str(errno.ELOOP)]
    r = se.run([PYTHON, "-c", script])
    assert r.stdout.split() == [str(se.tier / "0" / "real.bin"), str(se.tier / "0" / "hard.bin"),
                                "errno", str(errno.ELOOP)], r.stderr
    c = se.index.counters()
    assert (c["opens_tier"], c["opens_pfs"]) == ([2], 0)
    se.index.close()


def test_exec_and_fork_keep_the_shim(shimenv, tmp_path):
    shimenv.place_all()
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        p = {str(shimenv.root / 'a/two.bin')!r}
        pid = os.fork()
        if pid == 0:
            fd = os.open(p, os.O_RDONLY)
            os._exit(0 if os.readlink(f'/proc/self/fd/{{fd}}').startswith({str(shimenv.tier)!r}) else 1)
        _, st = os.waitpid(pid, 0)
        out = subprocess.run(['cat', p], capture_output=True).stdout
        print(os.waitstatus_to_exitcode(st), len(out))
    """)
    r = shimenv.run([PYTHON, "-c", script])
    assert r.stdout.split() == ["0", str(len(shimenv.contents["a/two.bin"]))], r.stderr
    events = shimenv.index.drain()
    pids = {e.pid for e in events if e.kind == lib.TIERING_EV_OPEN_TIER}
    assert len(pids) == 2  # the forked child and the exec'd cat each posted with their own pid
    assert shimenv.index.counters()["opens_tier"] == [2]


def test_fingerprint_distinguishes_roots_and_paths():
    from tiering.placement.index import fingerprint
    fps = {fingerprint(r, p) for r in range(3) for p in ["", "a", "a/b", "a/b/", "b/a", "x" * 100]}
    assert len(fps) == 18
    assert fingerprint(0, "a/b") == fingerprint(0, "a/b")


def test_header_layout_agrees_between_c_and_python(tmp_path, cbin):
    """The C side reads values the Python side wrote (and the reverse)."""
    import subprocess

    from tiering.placement.index import ffi
    from tiering.shimlib import header_path
    prog = tmp_path / "layout.c"
    prog.write_text(textwrap.dedent(r"""
        #include <stdio.h>
        #include <stddef.h>
        #include <fcntl.h>
        #include <sys/mman.h>
        #include <sys/stat.h>
        #include "tiering.h"
        int main(int argc, char **argv) {
            printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct tiering_header),
                   sizeof(struct tiering_entry), sizeof(struct tiering_event),
                   offsetof(struct tiering_header, roots), offsetof(struct tiering_header, tiers),
                   offsetof(struct tiering_header, counters), offsetof(struct tiering_header, ring_head),
                   offsetof(struct tiering_entry, opens), sizeof(struct tiering_file),
                   offsetof(struct tiering_file, flags), offsetof(struct tiering_event, tag),
                   offsetof(struct tiering_event, bytes), offsetof(struct tiering_counters, read_tier));
            int fd = open(argv[1], O_RDWR);
            struct stat st; fstat(fd, &st);
            struct tiering_header *h = mmap(0, st.st_size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
            struct tiering_entry *e = tiering_entries(h);
            printf("%llu %u %s %llu %lld\n", (unsigned long long)h->nslots, h->ntiers, h->tiers[0].path,
                   (unsigned long long)e[atoi(argv[2])].size,
                   (long long)tiering_files(h)[e[atoi(argv[2])].file].mtime_ns);
            h->counters.fallbacks = 4242;
            h->counters.read_tier = 77;
            return 0;
        }
    """).replace("#include <stdio.h>", "#include <stdio.h>\n#include <stdlib.h>"))
    subprocess.run(["cc", "-I", str(header_path().parent), "-o", str(tmp_path / "layout"), str(prog)], check=True)
    root = tmp_path / "d"
    contents = make_data(root, {"f": 31337})
    index, slots = build_index(tmp_path, [Root(str(root), 0)], root, contents, tmp_path / "tierx")
    out = subprocess.run([str(tmp_path / "layout"), str(index.path), str(slots["f"])],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    sizes = [int(x) for x in out[0].split()]
    assert sizes == [ffi.sizeof("struct tiering_header"), ffi.sizeof("struct tiering_entry"),
                     ffi.sizeof("struct tiering_event"), ffi.offsetof("struct tiering_header", "roots"),
                     ffi.offsetof("struct tiering_header", "tiers"), ffi.offsetof("struct tiering_header", "counters"),
                     ffi.offsetof("struct tiering_header", "ring_head"), ffi.offsetof("struct tiering_entry", "opens"),
                     ffi.sizeof("struct tiering_file"), ffi.offsetof("struct tiering_file", "flags"),
                     ffi.offsetof("struct tiering_event", "tag"), ffi.offsetof("struct tiering_event", "bytes"),
                     ffi.offsetof("struct tiering_counters", "read_tier")]
    assert sizes[-6:] == [36, 72, 68, 20, 24, 72]
    assert ffi.offsetof("struct tiering_header", "ring_head") % 64 == 0
    assert out[1].split() == [str(index.header.nslots), "1", str(tmp_path / "tierx"), "31337",
                              str((root / "f").stat().st_mtime_ns)]
    assert index.counters()["fallbacks"] == 4242 and index.counters()["read_tier"] == 77
    index.close()


def test_index_reopens_from_python(shimenv):
    other = SharedIndex.open(shimenv.index.path)
    assert other.header.nentries == len(shimenv.contents)
    other.close()


# -- aliases: NOTE [alias invalidation] ------------------------------------------

# write through, read through
ALIASES = {
    "symlink": ("real.bin", "link.bin"),
    "symlink-written": ("link.bin", "real.bin"),
    "hardlink": ("real.bin", "hard.bin"),
    "hardlink-written": ("hard.bin", "real.bin"),
    "dir-symlink": ("dlink/x.bin", "d/x.bin"),
    "outside-the-roots": ("../../outside.bin", "link.bin"),
}
WRITES = {
    "O_RDWR": "import os; fd=os.open(P, os.O_RDWR); os.pwrite(fd, NEW, 0); os.close(fd)",
    "O_TRUNC": "import os; fd=os.open(P, os.O_WRONLY|os.O_TRUNC); os.write(fd, NEW); os.close(fd)",
    "fopen-w": ("import ctypes; l=ctypes.CDLL(None); l.fopen.restype=ctypes.c_void_p; "
                "f=l.fopen(P.encode(), b'w'); l.fwrite(NEW, 1, len(NEW), ctypes.c_void_p(f)); "
                "l.fclose(ctypes.c_void_p(f))"),
}


@pytest.mark.parametrize("how", sorted(WRITES))
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_write_through_any_alias_invalidates_every_path_of_the_file(tmp_path, cbin, alias, how):
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    assert "dlink/x.bin" not in se.slots and {"real.bin", "link.bin", "hard.bin", "d/x.bin"} <= set(se.slots)
    written, read = ALIASES[alias]
    new = b"NEW BYTES " * 3
    r = se.run([PYTHON, "-c", f"P = {os.path.normpath(root / written)!r}; NEW = {new!r}\n" + WRITES[how]])
    assert r.returncode == 0, r.stderr
    got, target = read_via(se, cbin, "open", str(root / read), tmp_path)
    want = new + se.contents[read][len(new):] if how == "O_RDWR" else new
    assert got == want and got == (root / read).read_bytes()
    assert not target.startswith(str(se.tier))
    # every catalogued path of that file is invalid, the others are still served
    same = {rel for rel in se.slots if (root / rel).stat().st_ino == (root / read).stat().st_ino}
    assert same == ({"d/x.bin"} if alias == "dir-symlink" else {"real.bin", "link.bin", "hard.bin"})
    for rel in se.slots:
        assert se.state(rel) == (lib.TIERING_STATE_INVALID if rel in same else 1), rel
    got, target = read_via(se, cbin, "open", str(root / "other.bin"), tmp_path)
    assert (got, target) == (se.contents["other.bin"], str(se.tier / "0" / "other.bin"))
    assert se.index.counters()["writes"] == 1
    written_slots = {e.slot for e in se.index.drain() if e.kind == lib.TIERING_EV_WRITE}
    assert written_slots and written_slots <= {se.slots[rel] for rel in same}
    se.index.close()


TRUNCATING = {
    "O_TRUNC": "import os; os.close(os.open(P, os.O_WRONLY | os.O_TRUNC))",
    "creat": "import ctypes; l = ctypes.CDLL(None); l.close(l.creat(P.encode(), 0o644))",
    "fopen-w": ("import ctypes; l = ctypes.CDLL(None); l.fopen.restype = ctypes.c_void_p; "
                "l.fclose(ctypes.c_void_p(l.fopen(P.encode(), b'w')))"),
}


@pytest.mark.parametrize("how", sorted(TRUNCATING))
@pytest.mark.parametrize("through", ["link.bin", "../../outside.bin"])
def test_a_truncating_open_invalidates_the_file_before_the_open(tmp_path, cbin, how, through):
    """The preloaded libatopen prints the entry's state as the open
    reaches libc: already invalid, although the open goes through a symlink,
    catalogued or not (outside the roots), and the entry is its target's."""
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    env = dict(se.env, LD_PRELOAD=f"{lib_path()} {cbin / 'libatopen.so'}",
               STATE_SLOT=str(se.slots["real.bin"]))
    path = os.path.normpath(root / through)
    r = se.run([PYTHON, "-c", f"P = {path!r}\n" + TRUNCATING[how]], env=env)
    assert r.returncode == 0, r.stderr
    assert f"state-at-open={lib.TIERING_STATE_INVALID}" in r.stderr.splitlines(), r.stderr
    assert (root / "real.bin").read_bytes() == b""
    se.index.close()


def test_writes_of_files_outside_the_catalog_invalidate_nothing(tmp_path, cbin):
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    other = tmp_path / "elsewhere.bin"
    other.write_bytes(b"x" * 100)
    r = se.run([PYTHON, "-c", f"open({str(other)!r}, 'r+b').write(b'y'); open({str(root / 'new.bin')!r}, 'wb')"])
    assert r.returncode == 0, r.stderr
    assert all(se.state(rel) == 1 for rel in se.slots)
    assert se.index.counters()["writes"] == 0
    se.index.close()


@pytest.mark.parametrize("entry", ["open", "open64", "fopen"])
def test_a_copy_invalidated_while_it_is_opened_is_not_served(shimenv, cbin, tmp_path, entry):
    """NOTE [linearizable redirect]: a write open elsewhere invalidates the
    file between the shim's decision and its open of the copy (the preloaded
    libatopen does it at that instant); the shim closes the copy and
    reads the PFS."""
    rel = "a/two.bin"
    shimenv.place(rel)
    src = str(shimenv.root / rel)
    env = dict(shimenv.env, LD_PRELOAD=f"{lib_path()} {cbin / 'libatopen.so'}",
               FLIP_TIER=str(shimenv.tier), FLIP_SLOT=str(shimenv.slots[rel]))
    got, target = read_via(shimenv, cbin, entry, src, tmp_path, env=env)
    assert (got, target) == (shimenv.contents[rel], src)
    assert shimenv.state(rel) == lib.TIERING_STATE_INVALID
    c = shimenv.index.counters()
    assert (c["opens_tier"], c["opens_pfs"], c["fallbacks"]) == ([0], 1, 1)


def test_the_copy_that_was_not_served_is_closed_and_errno_kept(shimenv, cbin):
    rel = "a/two.bin"
    shimenv.place(rel)
    src = str(shimenv.root / rel)
    env = dict(shimenv.env, LD_PRELOAD=f"{lib_path()} {cbin / 'libatopen.so'}",
               FLIP_TIER=str(shimenv.tier), FLIP_SLOT=str(shimenv.slots[rel]))
    r = shimenv.run([PYTHON, "-c", textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        free = os.open('/dev/null', os.O_RDONLY)
        os.close(free)
        ctypes.set_errno(1234)
        fd = libc.open({src.encode()!r}, os.O_RDONLY)
        print(fd == free, ctypes.get_errno(), os.readlink(f'/proc/self/fd/{{fd}}'))
    """)], env=env)
    assert r.stdout.split() == ["True", "1234", src], r.stderr


# -- tier roots: NOTE [tier roots] -----------------------------------------------

@pytest.mark.parametrize("flaw", ["look-alike", "mode-0755", "other-owner", "missing"])
def test_a_tier_root_that_is_not_the_jobs_own_private_directory_is_never_read(shimenv, cbin, tmp_path, flaw):
    rel = "a/one.bin"
    shimenv.place(rel)
    if flaw == "look-alike":     # same path, owner and mode; another inode
        shimenv.tier.rename(tmp_path / "moved")
        private_dir(shimenv.tier)
        (shimenv.tier / "0" / "a").mkdir(parents=True)
        (shimenv.tier / "0" / rel).write_bytes(b"planted")
    elif flaw == "mode-0755":
        os.chmod(shimenv.tier, 0o755)
    elif flaw == "other-owner":
        os.chown(shimenv.tier, 12345, 12345)
    else:
        shimenv.tier.rename(tmp_path / "moved")
    env = dict(shimenv.env, TIERING_DEBUG="1")
    src = str(shimenv.root / rel)
    r = shimenv.run([str(cbin / "shimtest"), "open", src, str(tmp_path / "out")], env=env)
    assert r.returncode == 0 and r.stdout.strip() == src, r.stdout + r.stderr
    assert (tmp_path / "out").read_bytes() == shimenv.contents[rel]
    assert f"tier root {shimenv.tier}" in r.stderr and "not redirecting" in r.stderr
    # write opens still invalidate through such an index
    r = shimenv.run([PYTHON, "-c", f"open({src!r}, 'r+b').close()"], env=env)
    assert r.returncode == 0 and shimenv.state(rel) == lib.TIERING_STATE_INVALID


def test_the_jobs_own_tier_root_is_used(shimenv, cbin, tmp_path):
    rel = "a/one.bin"
    shimenv.place(rel)
    h = shimenv.index.header.tiers[0]
    st = shimenv.tier.stat()
    assert (h.dev, h.ino) == (st.st_dev, st.st_ino)
    got, target = read_via(shimenv, cbin, "open", str(shimenv.root / rel), tmp_path)
    assert (got, target) == (shimenv.contents[rel], str(shimenv.tier / "0" / rel))


# -- wrappers ------------------------------------------------------------------------

def test_wrappers_work_when_libc_functions_are_unresolved(cbin):
    r = subprocess.run([str(cbin / "unresolved")], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stdout + r.stderr


@pytest.mark.sanitizers("asan")   # TSan makes a vfork a fork
def test_a_vfork_child_leaves_the_parents_fd_bookkeeping_alone(shimenv, cbin):
    rel = "a/one.bin"
    shimenv.place(rel)
    r = shimenv.run([str(cbin / "vforkdup"), str(shimenv.root / rel)])
    assert r.stdout.strip() == "ok", r.stderr
    events = shimenv.index.drain()
    assert [e.kind for e in events] == [lib.TIERING_EV_OPEN_TIER, lib.TIERING_EV_CLOSE]
    assert events[1].bytes == 150 and shimenv.index.counters()["read_tier"] == 150   # the parent's close counts


METADATA = {"stat", "stat64", "lstat", "lstat64", "fstat", "fstat64", "fstatat", "fstatat64", "statx",
            "__xstat", "__xstat64", "__lxstat", "__lxstat64", "__fxstat", "__fxstat64", "__fxstatat",
            "__fxstatat64", "access", "faccessat", "euidaccess", "eaccess"}
CREDENTIALS = {"setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid",
               "setgroups", "initgroups", "setfsuid", "setfsgid", "capset"}
FD_OPERATIONS = {"fchmod", "fchown", "fchownat", "futimens", "futimes", "utimensat", "fsetxattr", "fremovexattr",
                 "fgetxattr", "flistxattr", "flock", "lockf", "lockf64", "fstatfs", "fstatfs64", "fstatvfs",
                 "fstatvfs64", "statfs", "statfs64", "statvfs", "statvfs64", "getxattr", "listxattr"}
NAMESPACE = {"rename", "renameat", "renameat2", "unlink", "unlinkat", "remove", "truncate", "truncate64", "link", "linkat", "chmod",
             "fchmodat", "chown", "lchown", "utime", "utimes", "lutimes", "futimesat", "setxattr", "lsetxattr",
             "removexattr", "lremovexattr"}
INTERPOSED = set(ENTRIES) | METADATA | CREDENTIALS | FD_OPERATIONS | NAMESPACE | {
    "creat", "creat64", "close", "fclose", "closedir", "close_range", "dup", "dup2", "dup3", "fcntl", "fcntl64"}
HELPERS = {"tiering_fingerprint", "tiering_index_fill", "tiering_index_complete", "tiering_index_filled", "tiering_state_cas", "tiering_state_cas_many", "tiering_ring_drain",
           "tiering_groups_hash", "tiering_set_tag", "tiering_get_tag", "tiering_where", "tiering_copy_file", "tiering_copy_batch",
           "tiering_copy_range", "tiering_copy_open", "tiering_copy_finish", "tiering_staging_create", "tiering_scan_list", "tiering_scan_list_free", "tiering_scan_stat", "tiering_scan_ascending"}


def test_the_library_exports_only_the_wrappers_and_the_daemon_helpers():
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib_path())], capture_output=True,
                         text=True, check=True).stdout
    assert {line.split()[-1] for line in out.splitlines()} == INTERPOSED | HELPERS


def _libc_functions() -> set[str]:
    libc = subprocess.run(["cc", "-print-file-name=libc.so.6"], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = subprocess.run(["nm", "-D", "--defined-only", libc], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[1] in "TWi"}


def test_no_name_declared_in_the_shim_is_a_libc_function(tmp_path):
    """Variables, parameters and internal functions of tiershim.c (read from
    its debug information) never take the name of a libc function."""
    obj = tmp_path / "shim.o"
    subprocess.run(["cc", "-O0", "-g", "-c", "-o", str(obj), str(REPO / "shim" / "tiershim.c")], check=True)
    dump = subprocess.run(["readelf", "--debug-dump=info", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    declared: set[str] = set()
    for die in dump.split("Abbrev Number:")[1:]:
        tag = die.split("(", 1)[1].split(")", 1)[0] if "(" in die else ""
        if tag not in ("DW_TAG_variable", "DW_TAG_formal_parameter", "DW_TAG_subprogram"):
            continue
        attrs = dict((a.split(":", 1)[0].split()[-1], a.split(":")[-1].strip())
                     for a in die.splitlines()[1:] if "DW_AT_" in a)
        if "DW_AT_name" not in attrs or "DW_AT_declaration" in attrs:
            continue
        if tag == "DW_TAG_subprogram" and "DW_AT_external" in attrs:
            continue  # the exported wrappers: named after libc on purpose
        declared.add(attrs["DW_AT_name"])
    assert declared, "no names found in the debug information"
    assert "lookup" in declared and "path" in declared
    libc = _libc_functions()
    assert {"open", "write", "abs", "dirfd", "link"} <= libc
    assert sorted(declared & libc) == []
