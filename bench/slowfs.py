"""slowfs: a parallel file system (PFS) on one machine, for benchmarks and tests.

A local disk hides behind its page cache the latency that tiering removes.
bench/slowfs/slowfs (C, FUSE 3) mirrors a SOURCE directory read-only and charges
every metadata operation, every read request and every byte like a loaded Lustre
seen by one client (see the comment at the top of slowfs.c for the cost model).

    with SlowFs(Path("data"), Path("mnt"), SlowFsOptions(meta_latency_ms=1.0)) as fs:
        run_workload(fs.path)
        print(fs.stats())          # {"opens": ..., "reads": ..., "bytes": ...}

The mount never outlives the benchmark: __exit__ unmounts whatever happened in the
with-block, an atexit hook and a SIGTERM handler (installed while a mount is active)
unmount too, and sweep_stale_mounts() removes mounts left by a run that was killed.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

SLOWFS_DIR = Path(__file__).resolve().parent / "slowfs"
BINARY = SLOWFS_DIR / "slowfs"
COUNTERS = ("meta_ops", "lookups", "getattrs", "opens", "releases", "reads", "bytes",
            "readdirs", "errors")
DEPS_HINT = ("run `make bench-deps` (as root it installs fuse3 and libfuse3-dev with "
             "apt-get; otherwise: sudo apt-get install -y fuse3 libfuse3-dev pkg-config)")
MOUNT_TIMEOUT = 10.0
EXIT_TIMEOUT = 10.0


@dataclass(frozen=True)
class SlowFsOptions:
    """Costs of the emulated PFS; the defaults resemble a busy Lustre seen by one client."""

    meta_latency_ms: float = 1.0    # per lookup, getattr, open, opendir, readdir, readlink, ...
    read_latency_ms: float = 0.5    # per read request
    bandwidth_mbps: float = 400.0   # aggregate read bandwidth, 10^6 bytes/s; 0 = unlimited
    max_inflight: int = 16          # requests served at once; the others wait

    def args(self) -> list[str]:
        return ["--meta-latency-ms", repr(float(self.meta_latency_ms)),
                "--read-latency-ms", repr(float(self.read_latency_ms)),
                "--bandwidth-mbps", repr(float(self.bandwidth_mbps)),
                "--max-inflight", str(int(self.max_inflight))]


# ---- build -------------------------------------------------------------------

def _up_to_date() -> bool:
    if not BINARY.exists():
        return False
    built = BINARY.stat().st_mtime
    return all(src.stat().st_mtime <= built for src in (SLOWFS_DIR / "slowfs.c", SLOWFS_DIR / "Makefile"))


def _fuse_dev_present() -> bool:
    return (shutil.which("pkg-config") is not None
            and subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode == 0)


def _install_fuse_dev() -> None:
    """Installs FUSE 3 with apt-get when running as root; otherwise says what to do."""
    if _fuse_dev_present():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"slowfs needs the FUSE 3 development files (pkg-config fuse3 fails): {DEPS_HINT}")
    print("slowfs: FUSE 3 development files are missing; running as root, so installing "
          "fuse3, libfuse3-dev and pkg-config with apt-get", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "fuse3", "libfuse3-dev", "pkg-config"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"slowfs: `{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout[-2000:]}"
                               f"{r.stderr[-2000:]}\n{DEPS_HINT}")
    if not _fuse_dev_present():
        raise RuntimeError(f"slowfs: apt-get ran but pkg-config still finds no fuse3: {DEPS_HINT}")


def ensure_built() -> Path:
    """bench/slowfs/slowfs, built with make if missing or older than its sources."""
    if _up_to_date():
        return BINARY
    with open(SLOWFS_DIR / ".build.lock", "w") as lock:   # concurrent test processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _up_to_date():
            _install_fuse_dev()
            r = subprocess.run(["make", "-C", str(SLOWFS_DIR)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"building slowfs failed (make -C {SLOWFS_DIR}):\n{r.stdout}{r.stderr}\n"
                                   f"If FUSE 3 is missing: {DEPS_HINT}")
    return BINARY


# ---- stats -------------------------------------------------------------------

def _load_stats(stats_file: Path) -> dict[str, int] | None:
    try:
        data = json.loads(stats_file.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return {k: int(v) for k, v in data.items()}


def read_stats(stats_file: Path, fresh: bool = True, timeout: float = 5.0) -> dict[str, int]:
    """The counters slowfs writes to stats_file (plus pid and seq).

    fresh=True asks slowfs (SIGUSR1 to the pid in the file) for new snapshots until
    seq has gone up by 2: a snapshot being written while we read the file may hold
    counters taken before our call, but the one after it was started after our read,
    so it includes every request completed before this call. SIGUSR1 makes each
    snapshot immediate; this costs about two round trips (~1 ms)."""
    stats_file = Path(stats_file)
    deadline = time.monotonic() + timeout
    snap = _load_stats(stats_file)
    while snap is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no slowfs stats in {stats_file} after {timeout:g} s")
        time.sleep(0.005)
        snap = _load_stats(stats_file)
    if not fresh:
        return snap
    target, signalled = snap["seq"] + 2, None
    while snap["seq"] < target:
        if signalled != snap["seq"]:
            try:
                os.kill(snap["pid"], signal.SIGUSR1)
            except ProcessLookupError:
                raise RuntimeError(f"slowfs (pid {snap['pid']}) is gone; its last stats in "
                                   f"{stats_file}: {snap}") from None
            signalled = snap["seq"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"slowfs (pid {snap['pid']}) did not refresh {stats_file} "
                               f"within {timeout:g} s (seq {snap['seq']})")
        time.sleep(0.0005)
        snap = _load_stats(stats_file) or snap
    return snap


# ---- mounts ------------------------------------------------------------------

def _unescape(field: bytes) -> str:
    """A path field of /proc/mounts: space, tab, newline and backslash are octal-escaped."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def _mounts() -> list[tuple[Path, str]]:
    """(mount point, file system type) of every line of /proc/self/mounts."""
    out = []
    with open("/proc/self/mounts", "rb") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3:
                out.append((Path(_unescape(fields[1])), os.fsdecode(fields[2])))
    return out


def _is_mounted(path: Path) -> bool:
    return any(mp == path for mp, _ in _mounts())


def _run_quietly(cmd: list[str]) -> bool:
    if shutil.which(cmd[0]) is None:
        return False
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _lazy_unmount(path: Path) -> bool:
    """Detaches path now (busy or not, live or dead); True if it is no longer mounted."""
    cmds = [["umount", "-l", str(path)], ["fusermount3", "-uz", str(path)]]
    if os.geteuid() != 0:
        cmds.reverse()
    for cmd in cmds:
        if not _is_mounted(path):
            return True
        _run_quietly(cmd)
    return not _is_mounted(path)


def _unmount(path: Path) -> bool:
    """fusermount3 -u, then lazy unmounts (busy or dead mounts); True if the clean
    unmount worked (or nothing was mounted)."""
    if not _is_mounted(path) or _run_quietly(["fusermount3", "-u", str(path)]):
        return True
    _lazy_unmount(path)
    return False


def sweep_stale_mounts(under: Path) -> list[Path]:
    """Lazily unmounts every FUSE mount at or below `under` (left by a killed run),
    except the ones this process is serving through an open SlowFs; returns them."""
    root = Path(os.path.realpath(under))
    ours = {fs.real_path for fs in list(_active)}
    stale = [mp for mp, fstype in _mounts()
             if (fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk")))
             and (mp == root or root in mp.parents) and mp not in ours]
    swept = []
    for mp in sorted(set(stale), key=lambda p: len(p.parts), reverse=True):
        if _lazy_unmount(mp):
            swept.append(mp)
    return swept


# ---- cleanup on exit and SIGTERM -----------------------------------------------

_active: list[SlowFs] = []
_active_lock = threading.Lock()
_Handler = Callable[[int, FrameType | None], Any] | int | None
_prev_sigterm: _Handler = None
_sigterm_installed = False


def _close_all() -> None:
    for fs in reversed(list(_active)):
        try:
            fs.close()
        except Exception as e:   # keep going: every mount must go
            print(f"slowfs: cleanup of {fs.path} failed: {e}", file=sys.stderr)


atexit.register(_close_all)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """While a mount is active: unmount everything, then die of SIGTERM as before.
    A handler someone else installed earlier is called instead (it decides)."""
    prev = _prev_sigterm
    if callable(prev):
        prev(signum, frame)
        return
    _close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _register(fs: SlowFs) -> None:
    global _prev_sigterm, _sigterm_installed
    with _active_lock:
        _active.append(fs)
        if _sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN:
            return
        _prev_sigterm = prev
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True


def _unregister(fs: SlowFs) -> None:
    global _sigterm_installed
    with _active_lock:
        if fs in _active:
            _active.remove(fs)
        if (_active or not _sigterm_installed
                or threading.current_thread() is not threading.main_thread()):
            return
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _prev_sigterm if _prev_sigterm is not None else signal.SIG_DFL)
        _sigterm_installed = False


# ---- the context manager -------------------------------------------------------

class SlowFs:
    """slowfs serving `source` at `mountpoint` for the lifetime of a with-block."""

    def __init__(self, source: Path, mountpoint: Path, options: SlowFsOptions = SlowFsOptions(),
                 stats_file: Path | None = None) -> None:
        self.source = Path(source)
        self.path = Path(mountpoint)
        self.real_path = Path(os.path.realpath(self.path))
        self.options = options
        self._own_stats = stats_file is None
        if stats_file is None:
            fd, name = tempfile.mkstemp(prefix="slowfs-stats-", suffix=".json")
            os.close(fd)
            stats_file = Path(name)
        self.stats_file = Path(stats_file)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> SlowFs:
        binary = ensure_built()
        if not self.source.is_dir():
            raise FileNotFoundError(f"slowfs source is not a directory: {self.source}")
        self.path.mkdir(parents=True, exist_ok=True)
        self.real_path = Path(os.path.realpath(self.path))
        if _is_mounted(self.real_path):
            raise RuntimeError(f"{self.path} is already a mount point (a killed run? "
                               f"bench.slowfs.sweep_stale_mounts() removes it)")
        self.stats_file.unlink(missing_ok=True)
        self._log = tempfile.TemporaryFile(prefix="slowfs-log-")
        cmd = [str(binary), str(self.source), str(self.path), *self.options.args(),
               "--stats", str(self.stats_file)]
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=self._log)
        _register(self)
        try:
            self._wait_mounted()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_mounted(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not (os.path.ismount(self.path) and self.stats_file.exists()):
            rc = self.process.poll()
            if rc is not None:
                raise RuntimeError(f"slowfs exited with status {rc} before mounting {self.path}:\n"
                                   f"{self.log()}\nIf FUSE cannot be mounted here: {DEPS_HINT}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"slowfs did not mount {self.path} within {MOUNT_TIMEOUT:g} s:\n"
                                   f"{self.log()}\nIf FUSE cannot be mounted here: {DEPS_HINT}")
            time.sleep(0.01)

    def log(self) -> str:
        """What slowfs wrote to stdout and stderr so far."""
        if self._log is None or self._log.closed:
            return ""
        self._log.flush()
        with open(self._log.fileno(), "rb", closefd=False) as f:
            f.seek(0)
            return f.read()[-8000:].decode(errors="replace")

    def stats(self) -> dict[str, int]:
        return read_stats(self.stats_file, fresh=True)

    def close(self) -> None:
        """Unmounts (fusermount3 -u, then umount -l), waits for slowfs to write its final
        stats and exit (SIGTERM, then SIGKILL, if it does not); never leaves a mount."""
        proc = self.process
        try:
            if proc is not None:
                # after a clean unmount slowfs exits by itself; after a lazy one it
                # would go on serving the files still open, so it is told to stop
                if proc.poll() is None and not _unmount(self.real_path):
                    proc.terminate()
                try:
                    proc.wait(timeout=EXIT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.terminate()
                    try:
                        proc.wait(timeout=EXIT_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        finally:
            if proc is not None and _is_mounted(self.real_path):
                _lazy_unmount(self.real_path)
            self.process = None
            _unregister(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    def __del__(self) -> None:
        # the stats file we made up ourselves goes with the object
        if getattr(self, "_own_stats", False) and getattr(self, "process", 1) is None:
            try:
                self.stats_file.unlink(missing_ok=True)
            except OSError:
                pass
