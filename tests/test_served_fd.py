"""A descriptor served from a tier copy is the data file's to the program
(NOTE [served descriptors] in docs/design.md): its stat on every path (a
catalog from the scan cache, a descriptor inherited across exec or numbered
above the fd book), reopens through /proc/self/fd and freopen(NULL), the
f-operations and locks, and only where the caller could have opened the
data file itself.

Each test places the copies as the daemon does (read-only, times of their
own), so that an answer taken from the copy differs from the data file's."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from test_shim_meta import BY_FD, statall

from helpers import OTHER_UID, PYTHON, REPO, ShimEnv, catalog_shimenv, make_data
from tiering.placement.index import lib

REL = "a/two.bin"
FIELDS = ("st_dev", "st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_mtime_ns", "st_ctime_ns")


def cached_shimenv(tmp_path: Path, data_parent: Path | None = None) -> ShimEnv:
    """An index of a catalog taken from the scan cache (its records are not
    this job's scan: TIERING_FILE_STAT unset), the copies placed as the
    daemon places them (in tmp_path; the data under data_parent, tmp_path
    by default)."""
    root = (data_parent or tmp_path) / "pfs" / "data"
    make_data(root, {REL: 5000, "b/one.bin": 3000, "b/three.bin": 700})
    os.chmod(root / REL, 0o640)
    for d in (root, root / "a", root / "b"):     # old enough to be cached
        os.utime(d, ns=(1_400_000_000 * 10**9,) * 2)
    cache = tmp_path / "cache"
    catalog_shimenv(tmp_path / "first", root, cache_dir=cache).index.close()
    se = catalog_shimenv(tmp_path / "cached", root, cache_dir=cache)
    assert not any(se.index.files["flags"] & lib.TIERING_FILE_STAT)
    for rel in se.contents:     # placed by catalog_shimenv; made as the daemon makes them
        copy = se.tier / "0" / rel
        os.chmod(copy, 0o400)
        os.utime(copy, ns=(10**9, 10**9))
    return se


def stat_fields(out: str) -> dict[str, int]:
    return dict(zip(FIELDS, map(int, out.split())))


def python_stat(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {f: getattr(st, f) for f in FIELDS}


PRINT_FSTAT = "import os, sys; st = os.fstat({fd}); print(*(getattr(st, f) for f in {fields!r}))"


def test_a_served_descriptor_of_a_cached_catalog_is_the_data_files(tmp_path, cbin):
    """Every descriptor form of stat answers as the data file does, although
    the index's records came from the cache (they are not trusted for it):
    the data path is stat'ed, not the copy."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    live, got = statall(se, cbin, src, shim=False), statall(se, cbin, src)
    for call in BY_FD:
        assert got[call] == live[call], call
    assert "mode=100640" in got["fstat"]
    assert se.index.counters()["opens_tier"][0] > 0      # the descriptors were the copy's
    se.index.close()


def test_a_verified_record_answers_the_descriptor_without_a_stat_of_the_pfs(tmp_path, cbin):
    """Once a copy found its source as the record says (TIERING_FILE_VERIFIED),
    the record answers: a change after it does not show (as with this job's
    own scan), so the PFS is not asked."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    before = statall(se, cbin, src, shim=False)
    se.index.files["flags"] |= lib.TIERING_FILE_VERIFIED
    os.utime(src, ns=(time.time_ns() + 3600 * 10**9, 1_600_000_000_987_654_321))
    live, got = statall(se, cbin, src, shim=False), statall(se, cbin, src)
    for call in BY_FD:
        assert got[call] == before[call] != live[call], call
    se.index.close()


def test_a_descriptor_inherited_across_exec_is_the_data_files(tmp_path):
    """`prog < datafile` in a shell under the shim: the shell's open was
    served, the program's fstat of its stdin (not in its fd book) is the
    data file's."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = PRINT_FSTAT.format(fd=0, fields=FIELDS)
    r = se.run(["sh", "-c", 'exec "$0" -c "$1" < "$2"', PYTHON, prog, str(src)])
    assert r.returncode == 0, r.stderr
    assert stat_fields(r.stdout) == python_stat(src)
    assert se.index.counters()["opens_tier"][0] == 1   # the shell's open was served
    se.index.close()


@pytest.fixture(scope="module")
def small_book_shim(tmp_path_factory) -> Path:
    """The shim built with a fd book of 64 descriptors: the descriptors past
    it are those of a process whose limit is above 65,536 with the real
    book (this machine may not let a test raise its limit that far)."""
    out = tmp_path_factory.mktemp("shim64") / "libtiershim.so"
    shim = REPO / "shim"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-fno-delete-null-pointer-checks",
                    "-Wno-nonnull-compare", "-DMAX_TRACKED_FDS=64", "-o", str(out), str(shim / "tiershim.c"),
                    str(shim / "tiercopy.c"), str(shim / "tierscan.c"), "-ldl"], check=True)
    return out


@pytest.mark.slow
def test_a_descriptor_above_the_fd_book_is_the_data_files(tmp_path, small_book_shim):
    """A descriptor numbered past the shim's fd book (opened there, and
    duplicated there from a booked one) answers as the data file."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import fcntl, os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 100)
        os.dup2(fd, 200)
        os.close(fd)
        for one in (high, 200):
            st = os.fstat(one)
            print(*(getattr(st, f) for f in {FIELDS!r}))
        """)
    r = se.run([PYTHON, "-c", prog], env=dict(se.env, LD_PRELOAD=str(small_book_shim)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(stat_fields(line) == python_stat(src) for line in lines)
    assert se.index.counters()["opens_tier"][0] == 1
    se.index.close()


@pytest.mark.parametrize("how", ["/proc/self/fd/{fd}", "/dev/fd/{fd}", "/proc/{pid}/fd/{fd}", "freopen"])
def test_a_reopen_of_a_served_descriptor_for_writing_reaches_the_data_file(tmp_path, how, reliability):
    """The job runs as root here, so the read-only copy could be written:
    the write must land in the data file, whose entry is then invalid."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    copy = se.tier / "0" / REL
    if how == "freopen":
        prog = textwrap.dedent(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.fopen.restype = libc.freopen.restype = ctypes.c_void_p
            libc.freopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
            libc.fwrite.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
            libc.fclose.argtypes = [ctypes.c_void_p]
            f = libc.fopen({str(src).encode()!r}, b"r")
            assert f
            f = libc.freopen(None, b"r+", f)
            assert f, ctypes.get_errno()
            assert libc.fwrite(b"XYZ", 1, 3, f) == 3
            assert libc.fclose(f) == 0
            """)
    else:
        prog = textwrap.dedent(f"""
            import os
            fd = os.open({str(src)!r}, os.O_RDONLY)
            with open({how!r}.format(fd=fd, pid=os.getpid()), "r+b") as f:
                f.write(b"XYZ")
            """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert src.read_bytes() == b"XYZ" + se.contents[REL][3:]
    assert copy.read_bytes() == se.contents[REL]
    assert se.state(REL) == lib.TIERING_STATE_INVALID
    assert se.index.counters()["opens_tier"][0] == 1
    reliability.survived(f"a served file reopened for writing through {how} (the data file written)")
    reliability.checked(reads=1, nbytes=len(se.contents[REL]))
    se.index.close()


def test_a_stat_through_proc_self_fd_is_the_data_files(tmp_path):
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        st = os.stat(f"/proc/self/fd/{{fd}}")
        print(*(getattr(st, f) for f in {FIELDS!r}))
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert stat_fields(r.stdout) == python_stat(src)
    se.index.close()


def test_fchmod_and_futimens_of_a_served_descriptor_change_the_data_file(tmp_path):
    """They act on the data file (the copy stays as it was), and the file's
    record no longer answers: its entry is invalid."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    copy = se.tier / "0" / REL
    prog = textwrap.dedent(f"""
        import os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        head = os.read(fd, 10)
        os.chmod(fd, 0o604)
        os.utime(fd, ns=(1_500_000_000_000_000_001, 1_500_000_000_000_000_002))
        assert os.read(fd, 10) == {se.contents[REL][10:20]!r}, "the offset is kept"
        st = os.fstat(fd)
        print(*(getattr(st, f) for f in {FIELDS!r}))
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    st = src.stat()
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o604, 1_500_000_000_000_000_002)
    assert stat_fields(r.stdout) == python_stat(src)
    assert copy.stat().st_mode & 0o7777 == 0o400
    assert se.state(REL) == lib.TIERING_STATE_INVALID
    se.index.close()


@pytest.mark.parametrize("how", ["flock", "lockf", "fcntl"])
def test_a_lock_on_a_served_descriptor_is_a_lock_on_the_data_file(tmp_path, how, reliability):
    """Another process holds an exclusive lock on the data file: the job's
    lock on its served descriptor is refused, as without the shim."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    with open(src, "rb+") as held:
        if how == "flock":
            fcntl.flock(held, fcntl.LOCK_EX)
            call = "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)"
        else:
            fcntl.lockf(held, fcntl.LOCK_EX)   # a POSIX lock, held by this process
            call = ("fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)" if how == "lockf" else
                    "fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0))")
        prog = textwrap.dedent(f"""
            import fcntl, os, struct, sys
            fd = os.open({str(src)!r}, os.O_RDONLY)
            try:
                {call}
            except OSError as e:
                print("refused", e.errno)
            else:
                print("granted")
            """)
        r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "refused", r.stdout
    assert se.index.counters()["opens_tier"][0] == 1
    reliability.survived(f"a {how} lock on a served file held by another process (refused, as without tier-run)")
    se.index.close()


def test_extended_attributes_of_a_served_descriptor_are_the_data_files(tmp_path):
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    try:
        os.setxattr(src, "user.tiering-test", b"value")
    except OSError as e:
        pytest.fail(f"the test's file system keeps no user xattrs ({e}): run it on one that does")
    prog = textwrap.dedent(f"""
        import os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        print(os.getxattr(fd, "user.tiering-test").decode(), "user.tiering-test" in os.listxattr(fd))
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["value", "True"]
    se.index.close()


def test_fstatfs_of_a_served_descriptor_is_the_data_files_file_system(tmp_path):
    """The data on /dev/shm, the tier on the test's own file system: the
    figures are the data file's file system's."""
    shm = Path(tempfile.mkdtemp(prefix="served-fd-", dir="/dev/shm"))
    try:
        se = cached_shimenv(tmp_path, data_parent=shm)
        src = se.root / REL
        assert os.statvfs(src).f_fsid != os.statvfs(se.tier).f_fsid
        prog = (f"import os; fd = os.open({str(src)!r}, os.O_RDONLY); a = os.statvfs(f'/proc/self/fd/{{fd}}');"
                " b = os.fstatvfs(fd); print(a.f_fsid, b.f_fsid, b.f_blocks)")
        r = se.run([PYTHON, "-c", prog])
        assert r.returncode == 0, r.stderr
        s = os.statvfs(src)
        assert r.stdout.split() == [str(s.f_fsid), str(s.f_fsid), str(s.f_blocks)]
        assert se.index.counters()["opens_tier"][0] == 1
        se.index.close()
    finally:
        shutil.rmtree(shm)


def _without_dac(prog: str) -> list[str]:
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed"
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all",
            PYTHON, "-c", prog]


@pytest.mark.parametrize("how", ["setpriv", "capset"])
def test_a_root_process_without_dac_capabilities_is_not_served_another_users_file(tmp_path, how, reliability):
    """Root reads a 0600 file of another user only with CAP_DAC_OVERRIDE or
    CAP_DAC_READ_SEARCH; without them it gets EACCES, under the shim too
    (the copy is root's own)."""
    assert os.geteuid() == 0, "the test needs root"
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    os.chown(src, OTHER_UID, OTHER_UID)
    os.chmod(src, 0o600)
    read = f"""
try:
    open({str(src)!r}, "rb").read()
except PermissionError:
    print("EACCES")
else:
    print("read")
"""
    if how == "setpriv":
        args = _without_dac(read)
    else:
        drop = textwrap.dedent("""
            import ctypes
            class Head(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]
            libc = ctypes.CDLL(None, use_errno=True)
            head, data = Head(0x20080522, 0), (Data * 2)()
            assert libc.capget(ctypes.byref(head), data) == 0
            data[0].effective &= ~0b110
            assert libc.capset(ctypes.byref(head), data) == 0, ctypes.get_errno()
            """)
        args = [PYTHON, "-c", drop + read]
    r = se.run(args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["EACCES"]
    with_caps = se.run([PYTHON, "-c", read])
    assert with_caps.stdout.split() == ["read"] and se.index.counters()["opens_tier"][0] == 1
    reliability.survived(f"a root command without the DAC capabilities ({how}) reading another user's 0600 file")
    se.index.close()


def test_a_copy_sets_the_verified_flag_only_when_the_source_is_as_recorded(tmp_path):
    """The daemon's copy compares its source's fstat with the record: equal,
    the flag is set; a record that says otherwise (a mode changed without a
    change of size or mtime) clears it."""
    from tiering.placement.index import ffi
    se = cached_shimenv(tmp_path)
    recs = se.index.files
    src = se.root / REL
    rec_id = int(se.index.entries[se.slots[REL]].file)
    staging = tmp_path / "staging"
    staging.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    c = ffi.new("struct tiering_copy *")
    st = src.stat()
    c.size, c.mtime_ns, c.follow = st.st_size, st.st_mtime_ns, 0
    c.record = se.index.records() + rec_id
    sfd, dfd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY), os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        def copy() -> int:
            return int(lib.tiering_copy_file(str(src).encode(), sfd, b"x.part", dfd, b"x", c, ffi.NULL, ffi.NULL))
        assert copy() == lib.TIERING_COPY_OK
        assert recs["flags"][rec_id] & lib.TIERING_FILE_VERIFIED
        os.chmod(src, 0o644)       # ctime and mode change, size and mtime do not
        assert copy() == lib.TIERING_COPY_OK
        assert not recs["flags"][rec_id] & lib.TIERING_FILE_VERIFIED
        assert (out / "x").read_bytes() == se.contents[REL]
    finally:
        os.close(sfd)
        os.close(dfd)
    se.index.close()


def scanned_daemon(tmp_path: Path, data: Path):  # type: ignore[no-untyped-def]
    """A daemon over a fresh scan of data (its index written as tier-run
    writes it, records and all) with one /dev/shm-like tier, started; and a
    wait for its copies to settle."""
    from helpers import private_dir
    from tiering.catalog import scan
    from tiering.placement.daemon import Daemon
    from tiering.placement.index import Root, SharedIndex
    from tiering.placement.policies import POLICIES
    from tiering.placement.tiers import TierState
    cat = scan([str(data)])
    tier = TierState("ram", "memory", private_dir(tmp_path / "tier"), 1 << 30, 2)
    index, slots = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                           [str(tier.data)], cat)
    d = Daemon(index, cat, slots, [tier], 2, POLICIES["off"])
    d.start()

    def settle() -> None:
        deadline = time.monotonic() + 120
        while d.copies_in_flight() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not d.copies_in_flight()
    return cat, tier, index, slots, d, settle


def test_the_daemons_batch_copies_verify_their_records(tmp_path):
    """Every small file the daemon copies in a batch has its record verified
    before it is published; a file copied on its own (BATCH_BYTES or more)
    is not (its descriptors' stat is the data path's)."""
    from tiering.placement.tiers import BATCH_BYTES
    data = tmp_path / "pfs"
    files = {f"d{k % 3}/f{k}.bin": 100 + k for k in range(40)} | {"large.bin": BATCH_BYTES}
    make_data(data, files)
    cat, _, index, slots, d, settle = scanned_daemon(tmp_path, data)
    try:
        ids = {f.rel: k for k, f in enumerate(cat.files)}
        for rel in files:
            assert d.place(ids[rel], 0)
        settle()
        assert d.stats.copies == len(files)
        verified = {rel: bool(index.files["flags"][int(index.entries[int(slots[ids[rel]])].file)]
                              & lib.TIERING_FILE_VERIFIED) for rel in files}
        assert verified == {rel: rel != "large.bin" for rel in files}
    finally:
        d.stop()
        index.close()


def test_a_descriptor_whose_copy_was_evicted_is_still_the_data_files(tmp_path):
    """The copy unlinked while the descriptor is open (an eviction): the
    kernel's link then ends in " (deleted)"; reopens, stats, locks and an
    inherited descriptor's fstat still reach the data file."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import fcntl, os, subprocess, sys
        fd = os.open({str(src)!r}, os.O_RDONLY)
        os.unlink({str(se.tier / "0" / REL)!r})
        with open(f"/proc/self/fd/{{fd}}", "rb") as f:
            print(len(f.read()))
        with open(f"/dev/fd/{{fd}}", "r+b") as f:
            f.write(b"W")
        st = os.stat(f"/proc/self/fd/{{fd}}")
        print(st.st_ino, st.st_nlink)
        os.set_inheritable(fd, True)
        subprocess.run([sys.executable, "-c", f"import os; st = os.fstat({{fd}}); print(st.st_ino, st.st_nlink)"],
                       close_fds=False, check=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        env = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
        other = subprocess.run(["flock", "-n", "-x", {str(src)!r}, "true"], env=env)
        print("refused" if other.returncode else "granted")
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    st = src.stat()
    assert r.stdout.split() == [str(len(se.contents[REL])), str(st.st_ino), "1", str(st.st_ino), "1", "refused"]
    assert src.read_bytes()[:1] == b"W"
    se.index.close()


def test_a_lock_held_through_one_descriptor_survives_a_move_of_another(tmp_path):
    """POSIX locks are the process's on the file: moving a second served
    descriptor onto the data file must not release the first one's lock
    (a close of any descriptor of the file would), and a descriptor opened
    after it and closed releases it, as without the shim."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import fcntl, os, subprocess
        env = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
        probe = ["python3", "-c", "import fcntl, sys; f = open(sys.argv[1], 'r+b');\\n"
                 "try: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('granted')\\n"
                 "except OSError: print('refused')", {str(src)!r}]
        a = os.open({str(src)!r}, os.O_RDONLY)
        b = os.open({str(src)!r}, os.O_RDONLY)
        fcntl.lockf(a, fcntl.LOCK_SH)
        os.fstatvfs(b)                      # moves b (if it still were a copy's)
        fcntl.fcntl(b, fcntl.F_GETFL)
        subprocess.run(probe, env=env)
        c = os.open({str(src)!r}, os.O_RDONLY)
        os.close(c)                         # POSIX: any close of the file releases the process's locks
        subprocess.run(probe, env=env)
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "granted"]
    se.index.close()


def test_a_lock_through_a_duplicate_is_the_same_descriptions(tmp_path):
    """flock belongs to the open file description: a duplicate's shared lock
    upgraded through the original, and an unlock through the duplicate,
    act on one lock as without the shim."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import fcntl, os, subprocess
        env = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
        fd = os.open({str(src)!r}, os.O_RDONLY)
        d = os.dup(fd)
        fcntl.flock(d, fcntl.LOCK_SH)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)      # an upgrade of the same lock
        other = subprocess.run(["flock", "-n", "-s", {str(src)!r}, "true"], env=env)
        print("refused" if other.returncode else "granted")
        fcntl.flock(d, fcntl.LOCK_UN)
        other = subprocess.run(["flock", "-n", "-x", {str(src)!r}, "true"], env=env)
        print("refused" if other.returncode else "granted")
        print(os.lseek(fd, 0, os.SEEK_CUR) == os.lseek(d, 0, os.SEEK_CUR), len(os.read(d, 100)), os.lseek(fd, 0, os.SEEK_CUR))
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "granted", "True", "100", "100"]
    se.index.close()


@pytest.mark.parametrize("how", ["//proc/self/fd/{fd}", "relative to /proc/self/fd", "truncate", "chmod",
                                 "getxattr"])
def test_a_served_file_reached_through_any_spelling_of_its_link_is_the_data_file(tmp_path, how):
    """Changes through a descriptor's link, however spelt, reach the data
    file and never the copy (which other readers may be served)."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    copy = se.tier / "0" / REL
    os.setxattr(src, "user.tiering-test", b"value")
    change = {
        "//proc/self/fd/{fd}": "with open(f'//proc/self/fd/{fd}', 'r+b') as f: f.write(b'ZZZZ')",
        "relative to /proc/self/fd": ("d = os.open('/proc/self/fd', os.O_RDONLY)\n"
                                      "w = os.open(str(fd), os.O_WRONLY, dir_fd=d); os.write(w, b'ZZZZ')"),
        "truncate": "os.truncate(f'/proc/self/fd/{fd}', 10)",
        "chmod": "os.chmod(f'/proc/self/fd/{fd}', 0o604)",
        "getxattr": "print(os.getxattr(f'/proc/self/fd/{fd}', 'user.tiering-test').decode())",
    }[how]
    prog = f"import os\nfd = os.open({str(src)!r}, os.O_RDONLY)\n{change}\n"
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert copy.read_bytes() == se.contents[REL] and copy.stat().st_mode & 0o7777 == 0o400
    expect = {"//proc/self/fd/{fd}": b"ZZZZ" + se.contents[REL][4:],
              "relative to /proc/self/fd": b"ZZZZ" + se.contents[REL][4:],
              "truncate": se.contents[REL][:10]}.get(how, se.contents[REL])
    assert src.read_bytes() == expect
    if how == "chmod":
        assert src.stat().st_mode & 0o7777 == 0o604
    if how == "getxattr":
        assert r.stdout.split() == ["value"]
    if how == "getxattr":
        assert se.state(REL) == 1
    else:
        assert se.state(REL) == lib.TIERING_STATE_INVALID
    se.index.close()


def test_a_descriptor_of_a_file_the_job_wrote_shows_and_reads_what_it_wrote(tmp_path):
    """Opened before the job appended to the file: its fstat (and the reads
    after it) are the data file's, as without the shim."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        before = os.fstat(fd).st_size
        with open({str(src)!r}, "ab") as f:
            f.write(b"appended")
        after = os.fstat(fd).st_size
        os.lseek(fd, before, os.SEEK_SET)
        print(after - before, os.read(fd, 100).decode())
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["8", "appended"]
    se.index.close()


@pytest.mark.parametrize("size", [600_000, 8 << 20], ids=["batch", "alone"])
def test_a_sparse_file_is_copied_with_its_holes(tmp_path, size):
    """The copy of a sparse file keeps its holes where the source has them
    (SEEK_HOLE / SEEK_DATA on a served descriptor, tar -S), with the same
    bytes; only its data is read."""
    data = tmp_path / "pfs"
    data.mkdir()
    src = data / "sparse.bin"
    mid = size // 2 // 65536 * 65536
    with open(src, "wb") as f:
        f.write(b"a" * 4096)
        f.seek(mid)
        f.write(b"b" * 4096)
        f.truncate(size)
    assert src.stat().st_blocks * 512 < size, "the test's file system keeps no holes"
    _, tier, index, _, d, settle = scanned_daemon(tmp_path, data)
    try:
        assert d.place(0, 0)
        settle()
        copy = tier.data / "0" / "sparse.bin"
        assert copy.read_bytes() == src.read_bytes()
        # alone, the bytes read are counted as read; a batch counts a file's size
        assert d.stats.pfs_bytes == (2 * 4096 if size > 1 << 20 else size)

        def holes(p: Path) -> list[int]:
            fd = os.open(p, os.O_RDONLY)
            try:
                return [os.lseek(fd, 0, os.SEEK_HOLE), os.lseek(fd, 4096, os.SEEK_DATA),
                        os.lseek(fd, mid, os.SEEK_HOLE)]
            finally:
                os.close(fd)
        assert holes(copy) == holes(src) == [4096, mid, mid + 4096]
    finally:
        d.stop()
        index.close()


def names_env(tmp_path: Path, files: dict[str, bytes], modes: dict[str, int] | None = None) -> ShimEnv:
    """catalog_shimenv of these files, taken from the scan cache and placed
    as the daemon places them (cached_shimenv with the files given)."""
    root = tmp_path / "pfs" / "data"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.chmod(root / rel, (modes or {}).get(rel, 0o640))
    for d in {root, *((root / rel).parent for rel in files)}:
        os.utime(d, ns=(1_400_000_000 * 10**9,) * 2)
    cache = tmp_path / "cache"
    catalog_shimenv(tmp_path / "first", root, cache_dir=cache).index.close()
    se = catalog_shimenv(tmp_path / "cached", root, cache_dir=cache)
    for rel in se.contents:
        os.chmod(se.tier / "0" / rel, 0o400)
        os.utime(se.tier / "0" / rel, ns=(10**9, 10**9))
    return se


def test_a_data_file_whose_name_ends_in_deleted_is_not_taken_for_another(tmp_path):
    """' (deleted)' is stripped from a copy's link only when the copy is gone."""
    se = names_env(tmp_path, {"x": b"X" * 100, "x (deleted)": b"D" * 50})
    src = se.root / "x (deleted)"
    prog = textwrap.dedent(f"""
        import os, subprocess, sys
        fd = os.open({str(src)!r}, os.O_RDONLY)
        with open(f"/proc/self/fd/{{fd}}", "rb") as f:
            print(f.read().decode())
        with open(f"/proc/self/fd/{{fd}}", "r+b") as f:
            f.write(b"W")
        os.set_inheritable(fd, True)
        subprocess.run([sys.executable, "-c", f"import os; st = os.fstat({{fd}}); print(st.st_size, oct(st.st_mode))"],
                       close_fds=False, check=True)
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["D" * 50, "50", "0o100640"]
    assert (se.root / "x").read_bytes() == b"X" * 100 and src.read_bytes() == b"W" + b"D" * 49
    se.index.close()


def test_a_hard_link_made_during_the_job_shows_in_the_link_count(tmp_path):
    se = names_env(tmp_path, {"f0": b"a" * 100, "f1": b"b" * 100})
    f0 = se.root / "f0"
    prog = f"import os; os.link({str(f0)!r}, {str(tmp_path / 'elsewhere')!r}); print(os.stat({str(f0)!r}).st_nlink)"
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2"] and se.state("f0") == lib.TIERING_STATE_INVALID
    se.index.close()


def test_a_new_name_of_a_copy_is_a_name_of_the_data_file(tmp_path):
    """A hard link made to the copy's own path (readlink of the descriptor
    shows it) names the data file: writes through it never reach the copy."""
    se = names_env(tmp_path, {"a": b"A" * 100})
    src, alias = se.root / "a", tmp_path / "alias"
    prog = textwrap.dedent(f"""
        import os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        os.link(os.readlink(f"/proc/self/fd/{{fd}}"), {str(alias)!r})
        with open({str(alias)!r}, "r+b") as f:
            f.write(b"EVIL")
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert (se.tier / "0" / "a").read_bytes() == b"A" * 100
    assert src.read_bytes() == b"EVIL" + b"A" * 96 and os.path.samefile(src, alias)
    assert se.state("a") == lib.TIERING_STATE_INVALID
    se.index.close()


@pytest.mark.parametrize("how", ["os.replace", "unlink", "rename away", "mv of its directory"])
def test_a_descriptor_whose_path_was_given_to_another_file_keeps_its_own(tmp_path, how):
    """The path a served descriptor was opened by now names another file, or
    none: the descriptor still reads, describes and locks its own file (as a
    descriptor of an unlinked file does), never the new one."""
    old = bytes(range(256)) * 400
    se = names_env(tmp_path, {"sub/a": old, "b": b"b" * 10})
    src = se.root / "sub" / "a"
    change = {"os.replace": f"open({str(src) + '.tmp'!r}, 'wb').write(b'M' * 50); os.replace({str(src) + '.tmp'!r}, {str(src)!r})",
              "unlink": f"os.unlink({str(src)!r})",
              "rename away": f"os.rename({str(src)!r}, {str(tmp_path / 'away')!r})",
              "mv of its directory": (f"os.rename({str(se.root / 'sub')!r}, {str(se.root / 'sub2')!r}); "
                                      f"os.mkdir({str(se.root / 'sub')!r}); open({str(src)!r}, 'wb').write(b'new')")}[how]
    prog = textwrap.dedent(f"""
        import fcntl, os, subprocess
        f = open({str(src)!r}, "rb")
        head = f.read(10)
        {change}
        rest = f.read()                        # CPython sizes the read with fstat
        st = os.fstat(f.fileno())
        with open(f"/proc/self/fd/{{f.fileno()}}", "rb") as g:
            again = g.read()
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        env = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
        other = subprocess.run(["flock", "-n", "-x", {str(src)!r}, "true"], env=env) if os.path.exists({str(src)!r}) else None
        print(len(head + rest), (head + rest) == again, st.st_size, oct(st.st_mode),
              "none" if other is None else other.returncode)
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    got = r.stdout.split()
    assert got[:4] == [str(len(old)), "True", str(len(old)), "0o100640"], r.stdout
    assert got[4] == ("none" if how in ("unlink", "rename away") else "0")   # the new file is not locked
    assert (se.tier / "0" / "sub/a").read_bytes() == old
    se.index.close()


def test_a_move_onto_the_data_file_leaves_no_descriptor_of_the_shims_open(tmp_path):
    """DESIGN invariant 4: the shim keeps no descriptor of its own; after a
    lock moved a served descriptor (and a write open checked for a copy),
    the process holds the descriptors it held before, no more."""
    se = cached_shimenv(tmp_path)
    src = se.root / REL
    prog = textwrap.dedent(f"""
        import fcntl, os
        fd = os.open({str(src)!r}, os.O_RDONLY)
        d = os.dup(fd)
        before = sorted(os.listdir("/proc/self/fd"))
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.fstatvfs(d)
        os.close(os.open({str(tmp_path / 'w.txt')!r}, os.O_WRONLY | os.O_CREAT))
        after = sorted(os.listdir("/proc/self/fd"))
        print(before == after, os.readlink(f"/proc/self/fd/{{fd}}") == {str(src)!r})
        """)
    r = se.run([PYTHON, "-c", prog])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    se.index.close()
