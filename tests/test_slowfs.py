"""slowfs, the emulated PFS (bench/slowfs/slowfs.c and its wrapper bench/slowfs.py):
a faithful read-only mirror, writes refused with EROFS, counters that prove the page
cache is bypassed at each open, the latency, bandwidth and in-flight limits (lower
bounds on time only), fresh stats snapshots, and no mount ever left behind.

Needs FUSE 3: if slowfs cannot be built or mounted the tests fail and say to run
`make bench-deps`; they are never skipped."""
from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.slowfs import COUNTERS, SlowFs, SlowFsOptions, _is_mounted, ensure_built, read_stats, sweep_stale_mounts  # noqa: E402

pytestmark = pytest.mark.fuse

FAST = SlowFsOptions(meta_latency_ms=0.02, read_latency_ms=0.02, bandwidth_mbps=0, max_inflight=16)
FILES = {
    "a/one.bin": 1000,
    "a/two.bin": 70_000,
    "a/deep/er/three.bin": 4096,
    "b/with space.bin": 123,
    "b/ünï.bin": 5,
    "b/.hidden": 77,
    "top.bin": 0,
    "c/big.bin": 3_000_000,
}
HINT = "run `make bench-deps` (installs fuse3 and libfuse3-dev and builds bench/slowfs)"


@pytest.fixture(scope="module", autouse=True)
def binary() -> Path:
    try:
        return ensure_built()
    except Exception as e:
        pytest.fail(f"slowfs cannot be built: {e}\n{HINT}", pytrace=False)


@pytest.fixture(autouse=True)
def no_mount_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = sweep_stale_mounts(tmp_path)
    assert not left, f"mounts left behind: {left}"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    src = tmp_path / "src"
    contents = {}
    for i, (rel, size) in enumerate(FILES.items()):
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size) if i % 2 else bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        p.write_bytes(data)
        contents[rel] = data
    (src / "empty_dir").mkdir()
    os.symlink("a/one.bin", src / "link")
    os.symlink("a", src / "dirlink")
    os.symlink("nowhere", src / "dangling")
    return src, contents


@contextmanager
def mounted(source: Path, mnt: Path, options: SlowFsOptions = FAST,
            stats_file: Path | None = None) -> Iterator[SlowFs]:
    fs = SlowFs(source, mnt, options, stats_file)
    try:
        fs.__enter__()
    except (RuntimeError, TimeoutError, OSError) as e:
        pytest.fail(f"cannot mount slowfs (FUSE): {e}\n{HINT}", pytrace=False)
    try:
        yield fs
    finally:
        fs.close()


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in COUNTERS}


def wait_for(get: Callable[[], dict[str, int]], ok: Callable[[dict[str, int]], bool],
             timeout: float = 60.0) -> dict[str, int]:
    """Polls get() until ok(value) (releases reach slowfs after close() returns)."""
    deadline = time.monotonic() + timeout
    value = get()
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(0.01)
        value = get()
    return value


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Everything under root that a write could change: mode, mtime, content/target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames + ["."]:
            p = Path(dirpath, name)
            st = os.lstat(p)
            if p.is_symlink():
                body = os.readlink(p).encode()
            elif p.is_file():
                body = p.read_bytes()
            else:
                body = "\0".join(sorted(os.listdir(p))).encode()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, body)
    return out


def test_usage_errors_exit_2(binary: Path, tmp_path: Path) -> None:
    for args in ([], [str(tmp_path)], [str(tmp_path), str(tmp_path), "--max-inflight", "0"],
                 [str(tmp_path), str(tmp_path), "--bandwidth-mbps", "fast"],
                 [str(tmp_path), str(tmp_path), "--no-such-option"]):
        p = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, (args, p.stderr)
        assert "usage: slowfs SOURCE MOUNTPOINT" in p.stderr


def test_mirror_is_faithful(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, contents = tree
    with mounted(src, tmp_path / "mnt") as fs:
        m = fs.path
        for rel, data in contents.items():
            assert (m / rel).read_bytes() == data, rel
            s, t = os.lstat(src / rel), os.lstat(m / rel)
            assert (t.st_size, t.st_mode, t.st_mtime_ns) == (s.st_size, s.st_mode, s.st_mtime_ns), rel
        for dirpath, _, _ in os.walk(src):
            rel = os.path.relpath(dirpath, src)
            assert sorted(os.listdir(m / rel)) == sorted(os.listdir(src / rel)), rel
        assert os.readlink(m / "link") == "a/one.bin"
        assert (m / "link").read_bytes() == contents["a/one.bin"]
        assert sorted(os.listdir(m / "dirlink" / "deep")) == ["er"]
        assert os.readlink(m / "dangling") == "nowhere"
        assert not (m / "dangling").exists()
        with pytest.raises(FileNotFoundError):
            (m / "a" / "missing.bin").read_bytes()
        # no direct_io: mmap works, and a random read lands on the right bytes
        with open(m / "c/big.bin", "rb") as f:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                assert mm[:] == contents["c/big.bin"]
            f.seek(1_234_567)
            assert f.read(1000) == contents["c/big.bin"][1_234_567:1_235_567]
        assert os.statvfs(m).f_bsize > 0


def test_writes_fail_with_erofs(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    before = snapshot(src)
    with mounted(src, tmp_path / "mnt") as fs:
        m = fs.path
        f = m / "a/one.bin"
        attempts: dict[str, Callable[[], object]] = {
            "open wb": lambda: open(f, "wb"),
            "open ab": lambda: open(f, "ab"),
            "open r+b": lambda: open(f, "r+b"),
            "O_WRONLY": lambda: os.open(f, os.O_WRONLY),
            "O_RDWR": lambda: os.open(f, os.O_RDWR),
            "create": lambda: os.open(m / "a/new.bin", os.O_WRONLY | os.O_CREAT, 0o644),
            "exclusive create": lambda: open(m / "new.bin", "xb"),
            "mkdir": lambda: os.mkdir(m / "newdir"),
            "rmdir": lambda: os.rmdir(m / "empty_dir"),
            "unlink": lambda: os.unlink(f),
            "rename": lambda: os.rename(f, m / "a/renamed.bin"),
            "chmod": lambda: os.chmod(f, 0o600),
            "chown": lambda: os.chown(f, 1, 1),
            "truncate": lambda: os.truncate(f, 0),
            "utime": lambda: os.utime(f, (0, 0)),
            "symlink": lambda: os.symlink("a", m / "newlink"),
            "link": lambda: os.link(f, m / "a/hard.bin"),
            "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        }
        for name, attempt in attempts.items():
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS, (name, e.value)
        assert f.read_bytes() == (src / "a/one.bin").read_bytes()
    assert snapshot(src) == before


def test_each_open_reads_the_bytes_again(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    """No keep_cache: the kernel drops the page cache at each open, so N opens of a
    file send N x size bytes through slowfs (this is what direct_io would otherwise
    be needed for)."""
    src, contents = tree
    rel, n = "c/big.bin", 3
    with mounted(src, tmp_path / "mnt") as fs:
        before = fs.stats()
        for _ in range(n):
            with open(fs.path / rel, "rb") as f:
                assert f.read() == contents[rel]
        d = delta(wait_for(fs.stats, lambda s: s["releases"] - before["releases"] >= n), before)
        assert d["opens"] == n
        assert d["releases"] == n
        assert d["reads"] >= n
        assert d["bytes"] == n * len(contents[rel])
        assert d["errors"] == 0


@pytest.mark.slow
def test_metadata_latency(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    meta_ms, n = 5.0, 50
    opts = SlowFsOptions(meta_latency_ms=meta_ms, read_latency_ms=0, bandwidth_mbps=0)
    with mounted(src, tmp_path / "mnt", opts) as fs:
        target = fs.path / "a/one.bin"
        os.stat(target)
        before = fs.stats()
        t0 = time.monotonic()
        for _ in range(n):
            os.stat(target)
        elapsed = time.monotonic() - t0
        d = delta(fs.stats(), before)
    assert d["lookups"] >= n, d           # entry_timeout 0: every stat walks the path again
    assert d["meta_ops"] >= n, d
    assert elapsed >= n * meta_ms / 1000, elapsed


def test_bandwidth_is_limited(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(8 << 20)
    (src / "eight.bin").write_bytes(data)
    opts = SlowFsOptions(meta_latency_ms=0, read_latency_ms=0, bandwidth_mbps=40)
    with mounted(src, tmp_path / "mnt", opts) as fs:
        before = fs.stats()
        t0 = time.monotonic()
        assert (fs.path / "eight.bin").read_bytes() == data
        elapsed = time.monotonic() - t0
        d = delta(fs.stats(), before)
    assert d["bytes"] == len(data)
    assert elapsed >= 0.18, elapsed       # 8 MiB at 40 MB/s is 0.21 s


def test_max_inflight_one_serialises_reads(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    threads, opens_each, lat_ms = 4, 2, 50.0
    for i in range(threads):
        (src / f"f{i}.bin").write_bytes(os.urandom(64 << 10))
    opts = SlowFsOptions(meta_latency_ms=0, read_latency_ms=lat_ms, bandwidth_mbps=0, max_inflight=1)
    with mounted(src, tmp_path / "mnt", opts) as fs:
        barrier = threading.Barrier(threads + 1)

        def reader(i: int) -> None:
            barrier.wait()
            for _ in range(opens_each):
                assert (fs.path / f"f{i}.bin").read_bytes() == (src / f"f{i}.bin").read_bytes()

        workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        before = fs.stats()
        barrier.wait()
        t0 = time.monotonic()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - t0
        d = delta(fs.stats(), before)
    # every open reads at least once (the page cache was dropped) and those reads
    # each hold the only slot for lat_ms: 4 threads take as long as one
    assert d["opens"] == threads * opens_each
    assert d["reads"] >= threads * opens_each
    assert elapsed >= threads * opens_each * lat_ms / 1000, elapsed


def test_stats_file_and_fresh_snapshot(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    stats_file = tmp_path / "stats.json"
    with mounted(src, tmp_path / "mnt", stats_file=stats_file) as fs:
        assert fs.stats_file == stats_file
        assert fs.process is not None
        pid = fs.process.pid
        raw = read_stats(stats_file, fresh=False)
        assert raw["pid"] == pid
        assert set(COUNTERS) | {"pid", "seq"} == set(raw)
        (fs.path / "a/one.bin").read_bytes()
        snap = fs.stats()
        assert snap["seq"] > raw["seq"]
        assert snap["opens"] == raw["opens"] + 1
        assert snap["bytes"] == raw["bytes"] + 1000
        # SIGUSR1 answers with a new snapshot; the file is always whole JSON
        seq = snap["seq"]
        for _ in range(50):
            os.kill(pid, signal.SIGUSR1)
            json.loads(stats_file.read_text())
        assert wait_for(lambda: read_stats(stats_file, fresh=False), lambda s: s["seq"] > seq)["seq"] > seq
        opens = snap["opens"]
    # final stats at exit: written after the unmount
    final = read_stats(stats_file, fresh=False)
    assert final["opens"] == opens and final["releases"] == final["opens"]
    assert not list(tmp_path.glob("stats.json.tmp.*"))


def test_unmounts_on_exception(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    mnt = tmp_path / "mnt"
    fs = SlowFs(src, mnt, FAST)
    with pytest.raises(RuntimeError):
        with fs:
            assert os.path.ismount(mnt)
            proc = fs.process
            held = open(mnt / "a/one.bin", "rb")   # a busy mount still goes
            raise RuntimeError("the body fails")
    held.close()
    assert proc is not None and proc.returncode is not None
    assert not os.path.ismount(mnt)
    assert not _is_mounted(mnt.resolve())


def test_sweep_removes_mount_of_killed_slowfs(binary: Path, tree: tuple[Path, dict[str, bytes]],
                                              tmp_path: Path) -> None:
    src, _ = tree
    mnt = tmp_path / "deep" / "mnt"
    mnt.mkdir(parents=True)
    proc = subprocess.Popen([str(binary), str(src), str(mnt)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not _is_mounted(mnt.resolve()):
        assert proc.poll() is None and time.monotonic() < deadline, f"slowfs did not mount; {HINT}"
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert _is_mounted(mnt.resolve())             # left behind, dead
    with pytest.raises(OSError) as e:
        os.listdir(mnt)
    assert e.value.errno == errno.ENOTCONN
    assert sweep_stale_mounts(tmp_path) == [mnt.resolve()]
    assert not _is_mounted(mnt.resolve())
    assert sweep_stale_mounts(tmp_path) == []
    assert proc.stderr is not None
    proc.stderr.close()


SIGTERM_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench.slowfs import SlowFs, SlowFsOptions
with SlowFs(Path(sys.argv[2]), Path(sys.argv[3]), SlowFsOptions(), Path(sys.argv[4])) as fs:
    print(fs.process.pid, flush=True)
    time.sleep(60)
"""


def test_sigterm_to_the_benchmark_unmounts(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    mnt, stats = tmp_path / "mnt", tmp_path / "stats.json"
    p = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(REPO), str(src), str(mnt), str(stats)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        pytest.fail(f"the benchmark could not mount slowfs: {p.communicate()[1]}\n{HINT}", pytrace=False)
    slowfs_pid = int(line)
    assert os.path.ismount(mnt)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM, err
    assert not _is_mounted(mnt.resolve())
    assert read_stats(stats, fresh=False)["pid"] == slowfs_pid
    assert wait_for(lambda: {"alive": int(alive(slowfs_pid))}, lambda s: not s["alive"])["alive"] == 0


def alive(pid: int) -> bool:
    """pid runs (a zombie waiting for a reaper does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
