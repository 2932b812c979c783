"""Helpers the test modules share: data sets, an index with copies placed by
hand, tier-run and its profile, and leftover checks.  Fixtures are in
conftest.py."""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sanitizers import PLAIN, Flavour
from tiering.placement.index import FileStats, Root, SharedIndex, lib
from tiering.shimlib import library_path

REPO = Path(__file__).resolve().parent.parent
C_DIR = Path(__file__).resolve().parent / "c"

# names that exercise the path handling: nesting, spaces, unicode, dots
DATA_FILES = {
    "a/one.bin": 1000,
    "a/two.bin": 70_000,
    "a/deep/er/three.bin": 4096,
    "b/with space.bin": 123,
    "b/ünï.bin": 5,
    "b/.hidden": 77,
    "top.bin": 0,
    "c/big.bin": 3_000_000,
}


def make_data(root: Path, files: dict[str, int] = DATA_FILES, seed: int = 1) -> dict[str, bytes]:
    import random
    rng = random.Random(seed)
    out = {}
    for rel, size in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(size)
        p.write_bytes(data)
        out[rel] = data
    return out


def staged(staging: Path) -> list[Path]:
    """What is left in a tier's staging directory but directories (each
    copying thread writes in a directory of its own there)."""
    return sorted(p for p in staging.rglob("*") if not p.is_dir())


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


@dataclass
class ShimEnv:
    """A data root, one tier and an index, as tier-run would set them up,
    with the copies placed by hand."""

    root: Path
    tier: Path
    index: SharedIndex
    slots: dict[str, int]
    contents: dict[str, bytes]
    env: dict[str, str] = field(default_factory=dict)
    flavour: Flavour = PLAIN   # a sanitizer's: each run fails on its report

    def place(self, rel: str, data: bytes | None = None) -> Path:
        dst = self.tier / "0" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(self.contents[rel] if data is None else data)
        assert self.index.cas_state(self.slots[rel], lib.TIERING_STATE_NONE, 1)
        return dst

    def place_all(self) -> None:
        for rel in self.contents:
            self.place(rel)

    def state(self, rel: str) -> int:
        return self.index.state(self.slots[rel])

    def run(self, args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(args, env=self.env if env is None else env, capture_output=True,
                           text=True, timeout=120, **kw)
        self.flavour.check(r)
        return r


def build_index(tmp: Path, roots: list[Root], data_root: Path, contents: dict[str, bytes],
                tier: Path) -> tuple[SharedIndex, dict[str, int]]:
    """An index of contents' files as this job's own scan would make it:
    identities, which paths are symlinks, and their stats."""
    run_dir = private_dir(tmp / "run")
    rels = sorted(contents)
    settle_access_times(data_root)
    stats = [(data_root / r).stat() for r in rels]
    index, slots = SharedIndex.create(
        run_dir / "index", roots, [str(tier)], rels, [0] * len(rels),
        [len(contents[r]) for r in rels], [s.st_mtime_ns for s in stats],
        devs=[s.st_dev for s in stats], inos=[s.st_ino for s in stats],
        links=[(data_root / r).is_symlink() for r in rels], stats=FileStats.of(stats, [True] * len(stats)))
    return index, dict(zip(rels, slots))


def settle_access_times(root: Path) -> None:
    """Reads every file under root once, as a data set that was read before:
    under relatime the first read after a write moves a file's atime, later
    reads (for a day) do not, so a scan after this records the atime the
    file keeps while the test runs."""
    for dirpath, _, names in os.walk(root, followlinks=True):
        for name in names:
            p = Path(dirpath, name)
            if p.is_file():
                p.read_bytes()




def place_like_the_daemon(se: ShimEnv) -> None:
    """Every file placed as the daemon places it: read-only, with a
    modification time of its own (the copy's metadata is not the file's)."""
    for rel in se.contents:
        copy = se.place(rel)
        os.chmod(copy, 0o400)
        os.utime(copy, ns=(10**9, 10**9))


def catalog_shimenv(tmp_path: Path, root: Path, cache_dir: Path | None = None) -> ShimEnv:
    """An index built from a real scan of root (identities, symlinks and
    stats included; with cache_dir, maybe from the scan cache), one tier,
    every catalogued file placed by hand."""
    from tiering.catalog import scan
    settle_access_times(root)
    cat = scan([str(root)], cache_dir=cache_dir)
    tier = private_dir(tmp_path / "tier")
    files = cat.files
    index, slot_list = SharedIndex.for_catalog(private_dir(tmp_path / "run") / "index", [Root(cat.roots[0], 0)],
                                               [str(tier)], cat)
    slots = {f.rel: s for f, s in zip(files, slot_list)}
    every = {f.rel: (root / f.rel).read_bytes() for f in files}
    env = dict(os.environ, LD_PRELOAD=str(library_path()), TIERING_INDEX=str(index.path))
    env.pop("TIERING_DISABLE", None)
    se = ShimEnv(root, tier, index, slots, every, env)
    se.place_all()
    return se


def alias_tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "pfs" / "data"
    contents = make_data(root, {"real.bin": 5000, "d/x.bin": 3000, "other.bin": 700})
    (root / "link.bin").symlink_to("real.bin")          # a symlinked file: catalogued twice
    os.link(root / "real.bin", root / "hard.bin")         # a hard link: catalogued twice
    (root / "dlink").symlink_to("d", target_is_directory=True)  # a linked directory: an alias
    (tmp_path / "outside.bin").symlink_to(root / "real.bin")    # a link from outside the roots
    return root, contents


PYTHON = sys.executable
OTHER_UID = 54321          # a user that is not us (the tests run as root: they chown and setuid)


def as_other_user(fn) -> int:  # type: ignore[no-untyped-def]
    """Runs fn() in a child process that has become another user; its exit
    status (0 when fn returned, 1 when it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            fn()
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# -- tier-run end to end ------------------------------------------------------

READER = Path(__file__).resolve().parent / "workloads" / "reader.py"
USER = getpass.getuser()
N_FILES = 200


def dataset(root: Path, n: int = N_FILES, seed: int = 3) -> dict[str, bytes]:
    import random
    rng = random.Random(seed)
    return make_data(root, {f"c{i % 5}/f{i:04d}.bin": rng.randrange(1000, 20000) for i in range(n)}, seed)


def profile(tmp: Path, capacity: str = "1GiB", threads: int = 2, second: str | None = None,
            bandwidth: str | None = None) -> Path:
    text = f"""name: test
tiers:
  - name: ram
    kind: memory
    path: /dev/shm
    capacity: {capacity}
    threads: {threads}
"""
    if second:
        (tmp / "ssd").mkdir(exist_ok=True)
        text += f"""  - name: ssd
    kind: filesystem
    path: {tmp / 'ssd'}
    capacity: {second}
    threads: 2
"""
    text += "pfs:\n  read_threads: 4\n" + (f"  bandwidth: {bandwidth}\n" if bandwidth else "")
    p = tmp / "profile.yaml"
    p.write_text(text)
    return p


def tier_run(args: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tiering", "run", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def run_reader(tmp: Path, data: Path, prof: Path, *extra: str, policy: str = "first-touch",
               reader_args: tuple[str, ...] = ()) -> tuple[dict, dict, subprocess.CompletedProcess[str]]:
    stats, out = tmp / "stats.json", tmp / "reader.json"
    r = tier_run(["--profile", str(prof), "--data", str(data), "--policy", policy, "--stats-json", str(stats),
                  *extra, "--", PYTHON, str(READER), "--data", str(data), "--epochs", "3", "--out", str(out),
                  "--epoch-pause", "0.3",
                  *reader_args])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(stats.read_text()), json.loads(out.read_text()), r


def digest(contents: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(contents):
        h.update(f"{rel}\0{hashlib.sha256(contents[rel]).hexdigest()}\n".encode())
    return h.hexdigest()


def leftovers() -> list[str]:
    return [p for p in os.listdir("/dev/shm") if p.startswith(f"tiering-{USER}-")]


def job_dirs(pid: int) -> list[str]:
    """The private directories in /dev/shm of the tier-run with this pid."""
    return [d for d in leftovers() if f"-{pid}-" in d]


def wait_job_dirs_removed(pid: int) -> None:
    """Waits (bounded) until the tier-run with this pid has no directory left
    in /dev/shm: its tiers are removed in the background after it exits."""
    wait_for(lambda: not job_dirs(pid), f"the directories of tier-run {pid} to be removed")


def dead_job_dir(name: str) -> bool:
    """A directory of a tier-run process that no longer exists (a leftover);
    other tier-runs running meanwhile on this machine are not ours to judge."""
    import psutil
    try:
        return not psutil.pid_exists(int(name.split("-")[-2]))
    except ValueError:
        return True


def dead_job_dirs(parent: Path, user: str, n: int = 1) -> list[Path]:
    """Private directories, each with a copy in it, made in parent by a
    process that has exited: the leftovers of a dead job."""
    code = ("import sys\n"
            "from tiering.rundirs import make_private_dir\n"
            "for _ in range(int(sys.argv[3])):\n"
            "    d = make_private_dir(sys.argv[1], sys.argv[2])\n"
            "    (d / 'data').mkdir()\n"
            "    (d / 'data' / 'copy.bin').write_bytes(b'x' * 100)\n"
            "    print(d)\n")
    r = subprocess.run([sys.executable, "-c", code, str(parent), user, str(n)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return [Path(line) for line in r.stdout.splitlines()]


def rewrite_owner(d: Path, **change: object) -> Path:
    """d's owner record with some fields changed (its marker kept)."""
    record = json.loads((d / "owner.json").read_text())
    (d / "owner.json").write_text(json.dumps({**record, **change}))
    return d


def sweep_with_boot_time_off(parent: Path, user: str, seconds: float = 1.0) -> list[str]:
    """What another tier-run of the user does at start (sweep leftovers in
    parent), in a process whose /proc/stat btime reads `seconds` later: btime
    is recomputed from the wall clock at every read, so an NTP step moves it.
    The paths it removed."""
    code = ("import psutil._pslinux as p, json\n"
            "real = p.boot_time\n"
            f"p.boot_time = lambda: real() + {seconds!r}\n"
            "from tiering.rundirs import sweep_leftovers\n"
            f"print(json.dumps([str(d) for d in sweep_leftovers([{str(parent)!r}], {user!r})]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
# -- a module loaded when first used (torch not imported at collection) ------------

class LazyModule:
    """The module at path (imported as name), loaded at its first attribute
    looked up: a test module that uses a torch-importing helper (examples/
    imagefolder.py, tests/workloads/reader.py) in a few tests does not import
    torch while pytest collects."""

    def __init__(self, name: str, path: Path):
        self._name, self._path = name, path
        self._module: object | None = None

    def __getattr__(self, attr: str):  # type: ignore[no-untyped-def]
        if self._module is None:
            import importlib.util
            spec = importlib.util.spec_from_file_location(self._name, self._path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[self._name] = module
            spec.loader.exec_module(module)
            self._module = module
        return getattr(self._module, attr)


# -- a small tmpfs of a test's own (root only) -----------------------------------

MS_RDONLY = 1
MNT_DETACH = 2


@contextmanager
def tmpfs_mounted(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` mounted on path for the block, detached after.  Mounting
    needs root (CAP_SYS_ADMIN): the test is skipped, saying why, when it is not
    root or the mount is refused with EPERM (a container without the
    capability); any other failure fails the test."""
    import ctypes
    import errno

    import pytest
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_RDONLY if read_only else 0,
                  f"size={size}".encode()) != 0:
        err = ctypes.get_errno()
        if err == errno.EPERM:
            pytest.skip(f"mounting a tmpfs was refused here (EPERM): {os.strerror(err)}")
        raise OSError(err, f"mount -t tmpfs on {path}: {os.strerror(err)}")
    try:
        yield path
    finally:
        if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


# -- waiting for events, with generous bounds (never a bare sleep) ------------------

EVENT_TIMEOUT = 120.0   # seconds: far above what any event takes on a loaded 2-core machine
# seconds a benchmark's smoke run may take before it counts as hung: 15 times the longest
# (bench.scale's, about 2 minutes on 2 cores), so that a busy machine never trips it
BENCH_TIMEOUT = 1800.0


def wait_for(predicate, what: str, timeout: float = EVENT_TIMEOUT, every: float = 0.02):
    """Polls predicate until it returns something true; fails the test after timeout."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def read_until(pipe, end: bytes, timeout: float = EVENT_TIMEOUT) -> bytes:
    """What a child writes to a binary pipe, up to and including `end`, or a
    test failure after timeout (byte by byte: nothing is read past it)."""
    import selectors
    import time
    fd = pipe.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not buf.endswith(end):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"no {end!r} from the child within {timeout:.0f} s (got {buf[-500:]!r})")
            chunk = os.read(fd, 1)
            if not chunk:
                raise AssertionError(f"the child closed its output after {buf[-500:]!r}")
            buf += chunk
    return buf


def read_line(pipe, timeout: float = EVENT_TIMEOUT) -> bytes:
    """One line from a binary pipe of a child, or a test failure after timeout."""
    return read_until(pipe, b"\n", timeout)


def shm_copies(pid: int) -> int:
    """Files in the RAM tier of the tier-run with this pid (its copies)."""
    n = 0
    for d in os.listdir("/dev/shm"):
        if d.startswith(f"tiering-{USER}-{pid}-") and os.path.isdir(f"/dev/shm/{d}/data"):
            n += sum(len(files) for _, _, files in os.walk(f"/dev/shm/{d}/data"))
    return n


@contextmanager
def running(args: list[str], **kw) -> Iterator[subprocess.Popen]:
    """A process started with its stdout and stderr piped (kw as Popen's),
    killed and reaped when the block ends, however it ends."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def patched_tier_run(patch: str) -> str:
    """The text of a `python -c` program that runs tier-run (its arguments:
    the program's) after the Python lines of patch (a fault made to order),
    with the signals blocked as the tier-run script blocks them."""
    return ("from tiering.command import block_signals; block_signals()  # as the tier-run script does\n"
            "import sys\n"
            + patch +
            "from tiering.entry import tier_run\n"
            "sys.argv = ['tier-run'] + sys.argv[1:]\n"
            "tier_run()\n")


def age(*roots: Path, seconds: float = 3600) -> None:
    """Moves every directory's mtime into the past (a freshly made tree is too
    recent to be cached, see RACY_SECONDS)."""
    t = time.time() - seconds
    for root in roots:
        for d, _, _ in os.walk(root):
            os.utime(d, (t, t))


class Entered(threading.Event):
    """An event that tells when someone waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


class PlaceEach:
    """place_many of a test's fake Placement: its place() of each file, in order."""

    def place_many(self, files: np.ndarray, tier: int) -> np.ndarray:
        return np.array([self.place(int(f), tier) for f in files], bool)  # type: ignore[attr-defined]


def report_from_results(module: str, name: str, out: Path) -> dict:
    """A benchmark's report made again from its committed results
    (`python -m bench.<module> --report-only`): its table is the committed
    one and the README's, its picture a PNG; the results, loaded."""
    import shutil
    results = REPO / "bench" / "results"
    shutil.copy(results / f"{name}.json", out / f"{name}.json")
    r = subprocess.run([PYTHON, "-m", f"bench.{module}", "--report-only", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    table = (out / f"{name}.md").read_text()
    assert table == (results / f"{name}.md").read_text()
    assert table in (REPO / "README.md").read_text()
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / f"{name}.json").read_text())
