"""One local tier while the job runs, and how a file is copied onto it.

A copy is written under the tier's staging directory, checked (the source is
the regular file the scan saw: same size and mtime, not grown while it was
read) and renamed to its final name; only then may the daemon publish it
(NOTE [publish after rename] in docs/design.md).  A partial or rejected copy
is removed.

Nothing inside a tier is reached by a path: the tier's directory is opened
once, and the staging file, the directories below data/ and the rename into
place all work relative to directory fds, created with O_EXCL / O_NOFOLLOW
(NOTE [tier directories]).  The fds of the directories below data/ are kept
in a bounded cache, so a copy costs no per-file mkdir of its parents.
"""
from __future__ import annotations

import errno
import logging
import os
import posixpath
import resource
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..catalog import FileTable
from ..catalog.model import FileRef
from .index import ffi, lib

log = logging.getLogger("tiering")

CHUNK_ALIGN = 1 << 20      # the ranges of a chunked copy start at multiples of this
CHUNKED_BYTES = 64 << 20   # files of this size or more are copied in parallel chunks (profile: large_file_mb)
CHUNK_THREADS = 4          # ... by this many threads
BATCH_BYTES = 1 << 20      # files smaller than this are copied many to a C call (NOTE [batch copy])
BATCH_FILES = 256          # ... at most this many
SHARE_FILES = 64           # ... or its share of its tier's queue among the idle workers, at most this many,
WAITS_QUICK = 0.1          # ... unless its tier's copies wait this often per copy or less (NOTE [batch share])
WAITS_COPIES = 64          # ... averaged over about this many copies, and known after as many
BATCH_BUDGET_NS = 10_000_000  # a batch's copies are published at least this often (NOTE [batch copy])
# struct tiering_batch_file as numpy sees it (checked against cffi's layout on first use)
BATCH_DTYPE = np.dtype([("id", "<i8"), ("status", "<i4"), ("error", "<i4"), ("copied", "<i8"), ("blocks", "<i8"),
                        ("opens", "<u4"), ("published", "<u4")])
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CopySource(FileRef, Protocol):
    """What a copy needs of a catalogued file: a CatalogFile has it, and so
    has the CopyOf the daemon makes for each copy."""

    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def link(self) -> bool: ...


class CopyOf(NamedTuple):
    """A file's CopySource read from the catalog's arrays: a tuple, a third
    of a frozen CatalogFile's cost to make (NOTE [copy in C])."""
    root: int
    rel: str
    size: int
    mtime_ns: int
    link: bool

    @classmethod
    def of(cls, files: FileTable, i: int) -> CopyOf:
        c = files.columns
        return cls(files.root.item(i), files.rel(i), c["size"].item(i), c["mtime_ns"].item(i), c["link"].item(i))


class SourceChanged(Exception):
    """The source is not what the catalog recorded: nothing to publish."""


def dir_fd_budget() -> int:
    """Directory fds a tier keeps open: a quarter of the fd limit, at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, min(1024, soft // 4))


def open_dir(name: str, parent_fd: int, create: bool) -> int:
    """The fd of directory `name` in parent_fd (made 0700 first when `create`,
    whatever the umask: the shim checks the tier root's mode); a symlink in
    its place is refused (ELOOP / ENOTDIR)."""
    made = False
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            made = True
        except FileExistsError:
            pass
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    if made:
        os.fchmod(fd, 0o700)
    return fd


class DirFds:
    """Fds of the directories below one directory (its own fd is key ""),
    keyed by "/"-separated relative path.  At most `limit` stay open: the
    least recently used ones no thread is using are closed first."""

    def __init__(self, top_fd: int, limit: int):
        self.top_fd = top_fd
        self.limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[str, list[int]] = OrderedDict()   # key -> [fd, users]

    @contextmanager
    def get(self, key: str, create: bool) -> Iterator[int]:
        """The fd of directory `key` (made with its parents when `create`),
        valid inside the with block."""
        fd = self.acquire(key, create)
        try:
            yield fd
        finally:
            self.release(key)

    def acquire(self, key: str, create: bool) -> int:
        """The fd of directory `key`, valid until release(key)."""
        if key == "":
            return self.top_fd
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                entry[1] += 1
                self._open.move_to_end(key)
                return entry[0]
        parent, _, name = key.rpartition("/")
        with self.get(parent, create) as parent_fd:
            fd = open_dir(name, parent_fd, create)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:   # another thread opened it meanwhile
                os.close(fd)
                entry[1] += 1
                return entry[0]
            self._open[key] = [fd, 1]
            self._trim()
        return fd

    def release(self, key: str) -> None:
        if key == "":
            return
        with self._lock:
            self._open[key][1] -= 1
            self._trim()

    def _trim(self) -> None:
        """Under the lock: close the oldest unused fds beyond the limit."""
        excess = len(self._open) - self.limit
        if excess <= 0:
            return
        victims = []
        for key, (_, users) in self._open.items():
            if users == 0:
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            os.close(self._open.pop(key)[0])

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._open.values():
                os.close(fd)
            self._open.clear()
            os.close(self.top_fd)


class TierDirs:
    """A tier's private directory, reached only through fds opened here once
    (NOTE [tier directories]): root/staging/<thread> for the copies each
    copying thread writes (NOTE [staging files]), root/data/<root id>/
    <relative path> for finished ones."""

    def __init__(self, root: Path):
        self.root = root
        self.root_fd = os.open(root, DIR_FLAGS)
        try:
            st = os.fstat(self.root_fd)
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise OSError(errno.EPERM, f"{root} is not a private (0700) directory of this user")
            self.data = DirFds(open_dir("data", self.root_fd, True), dir_fd_budget())
            self.staging_fd = open_dir("staging", self.root_fd, True)
        except BaseException:
            os.close(self.root_fd)
            raise
        self._lock = threading.Lock()
        self._retired: list[int] = []   # replaced staging fds: a copy may still hold one
        self._threads: dict[int, int] = {}   # thread ident -> fd of its directory in staging/

    def create_staging(self, name: str) -> tuple[int, int]:
        """A new staging file `name` in the calling thread's staging
        directory and that directory's fd, made as the C copy makes its own
        (NOTE [staging files]).  A staging directory that has gone missing
        is made again."""
        fd, dir_fd = self.in_staging(lambda d: int(lib.tiering_staging_create(d, os.fsencode(name))), -errno.ENOENT)
        if fd < 0:
            raise OSError(-fd, os.strerror(-fd), name)
        return fd, dir_fd

    def in_staging(self, attempt: Callable[[int], int], gone: int) -> tuple[int, int]:
        """attempt(the fd of the calling thread's staging directory), made
        again (at most twice) when it returns `gone` (the directory is
        gone): its result and that fd."""
        for _ in range(3):
            staging_fd = self.thread_staging()
            result = attempt(staging_fd)
            if result != gone:
                break
            self.remake_staging(staging_fd)
        return result, staging_fd

    def thread_staging(self) -> int:
        """The fd of the calling thread's own directory in staging/, made on
        first use (NOTE [staging files]: copying threads that create and
        rename in one directory queue on its lock); staging/ itself is made
        again first when it has gone missing."""
        key = threading.get_ident()
        with self._lock:
            fd = self._threads.get(key)
            if fd is not None:
                return fd
            name = f"{key}-{os.getpid()}"
            try:
                fd = open_dir(name, self.staging_fd, True)
            except FileNotFoundError:     # staging/ itself is gone
                self._remake_top()
                fd = open_dir(name, self.staging_fd, True)
            self._threads[key] = fd
            return fd

    def remake_staging(self, missing_fd: int) -> None:
        """A copy found its staging directory (missing_fd) gone: the thread's
        is made again at its next copy, staging/ too when it is gone."""
        with self._lock:
            for key, fd in list(self._threads.items()):
                if fd == missing_fd:
                    del self._threads[key]
                    self._retired.append(fd)
            try:
                alive = os.stat("staging", dir_fd=self.root_fd, follow_symlinks=False).st_ino == \
                    os.fstat(self.staging_fd).st_ino
            except FileNotFoundError:
                alive = False
            if not alive:
                self._remake_top()

    def _remake_top(self) -> None:
        """Under the lock: staging/ made again; every thread's directory with it."""
        fd = open_dir("staging", self.root_fd, True)
        self._retired += [self.staging_fd, *self._threads.values()]
        self._threads.clear()
        self.staging_fd = fd
        log.warning("the staging directory of %s had vanished; made it again", self.root)

    @staticmethod
    def key(f: CopySource) -> tuple[str, str]:
        """(directory below data/, name) of a file's copy."""
        parent, name = posixpath.split(f.rel)
        return (f"{f.root}/{parent}" if parent else str(f.root)), name

    def publish(self, name: str, staging_fd: int, f: CopySource) -> None:
        """Renames staging file `name` to the file's final name."""
        key, leaf = self.key(f)
        with self.data.get(key, create=True) as dir_fd:
            os.rename(name, leaf, src_dir_fd=staging_fd, dst_dir_fd=dir_fd)

    def remove_copy(self, f: CopySource) -> None:
        key, leaf = self.key(f)
        try:
            with self.data.get(key, create=False) as dir_fd:
                unlink_at(leaf, dir_fd)
        except OSError:
            pass  # its directory was never made: no copy

    def close(self) -> None:
        if self.root_fd < 0:
            return
        self.data.close()
        for fd in [*self._threads.values(), self.staging_fd, *self._retired, self.root_fd]:
            os.close(fd)
        self._retired.clear()
        self._threads.clear()
        self.root_fd = -1


@dataclass
class TierState:
    """One local tier while the job runs; its directory is opened at once."""

    name: str
    kind: str
    root: Path          # private directory of this job on the tier
    capacity: int
    threads: int
    used: int = 0       # bytes allocated by published copies + reservations
    files: int = 0      # published copies
    placed_bytes: int = 0  # logical bytes of published copies
    failures: int = 0
    chunked_bytes: int = CHUNKED_BYTES   # NOTE [chunked copy]
    chunk_threads: int = CHUNK_THREADS
    dirs: TierDirs = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.dirs = TierDirs(self.root)
        weakref.finalize(self, self.dirs.close)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def free(self) -> int:
        return self.capacity - self.used

    def copy_path(self, f: CopySource) -> Path:
        """Where a file's copy lives: <data>/<data-root id>/<relative path>
        (the shim builds the same path; the daemon reaches it through dirs)."""
        return self.data / str(f.root) / f.rel

    def remove_copy(self, f: CopySource) -> None:
        self.dirs.remove_copy(f)


@dataclass
class _Progress:
    """What a copy in C reports to between its steps (NOTE [copy in C])."""

    stop: threading.Event
    on_read: Callable[[int], None]
    error: BaseException | None = None   # ends every chunk of the copy


@ffi.callback("int(void *, uint64_t)")
def _progress(arg: Any, n: int) -> int:
    """Counts the bytes of one step; non-zero stops the copy."""
    p: _Progress = ffi.from_handle(arg)
    try:
        p.on_read(n)
        return int(p.stop.is_set() or p.error is not None)
    except BaseException as e:   # raised again in the copying thread
        p.error = e
        return 1


class PfsReads:
    """What bounds the daemon's reads of the PFS (NOTE [chunked copy]): one
    semaphore of `slots` that every read takes (a copy worker holds one for
    its whole copy; each further range of a chunked copy takes its own), and
    the one pool the ranges of chunked copies run in, made on first use and
    shut by close()."""

    def __init__(self, slots: int):
        self.slots = max(1, slots)
        self.semaphore = threading.BoundedSemaphore(self.slots)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="tiering-chunk")
            self._pool.submit(fn)

    def close(self, wait: bool = True) -> None:
        """Ends the pool's threads (waits for them when `wait`); a later
        chunked copy makes it again."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)


def copy_file(src: str, f: CopySource, tier: TierState, stop: threading.Event,
              on_read: Callable[[int], None], reads: PfsReads) -> int | None:
    """Copies one file into the tier under its final name; returns the bytes
    it takes there, or None when `stop` was set halfway.  Reads at most the
    catalogued size + 1 byte (the extra byte detects growth).  Raises
    SourceChanged when the source is not the catalog's regular file (a
    symlink, fifo or directory in its place, another size or mtime, growth
    while it was read), and OSError when the copy fails; nothing is left
    behind in either case.  The caller holds one slot of reads.semaphore.  A
    file of tier.chunked_bytes or more is copied in parallel chunks, each
    further chunk in a slot of its own (NOTE [chunked copy])."""
    if stop.is_set():
        return None
    name = f"{threading.get_ident()}-{os.getpid()}.part"
    if f.size >= tier.chunked_bytes:
        return _copy_chunked(src, f, tier, stop, on_read, name, reads)
    key, leaf = TierDirs.key(f)
    call = _Call.of_thread(f)
    call.progress.stop, call.progress.on_read, call.progress.error = stop, on_read, None
    data = tier.dirs.data
    dst_fd = data.acquire(key, create=True)
    try:
        status, _ = tier.dirs.in_staging(lambda staging_fd: _transfer(os.fsencode(src), staging_fd, name.encode(),
                                                                      dst_fd, leaf.encode(), call),
                                         lib.TIERING_COPY_NO_STAGING)
    finally:
        data.release(key)
    return _outcome(status, call.c, call.progress, src)


def _outcome(status: int, c: Any, progress: _Progress, src: str) -> int | None:
    """What a copy that ended with a TIERING_COPY_* status returns: the bytes
    its copy takes, None when stopped; or what it raises."""
    if progress.error is not None:
        raise progress.error
    if status == lib.TIERING_COPY_STOPPED:
        return None
    _raise_for(status, int(c.error), src)
    return int(c.blocks) * 512


class _Call:
    """A copying thread's arguments of the C routine, made once per thread."""

    _local = threading.local()

    def __init__(self) -> None:
        self.c = ffi.new("struct tiering_copy *")
        self.progress = _Progress(threading.Event(), lambda n: None)
        self.handle = ffi.new_handle(self.progress)

    @classmethod
    def of_thread(cls, f: CopySource) -> _Call:
        """The calling thread's, set to copy f."""
        call: _Call | None = getattr(cls._local, "call", None)
        if call is None:
            call = cls._local.call = cls()
        call.c.size, call.c.mtime_ns, call.c.follow = f.size, f.mtime_ns, int(f.link)
        return call


def _transfer(src: bytes, staging_fd: int, name: bytes, dst_fd: int, leaf: bytes, call: _Call) -> int:
    """The copy in C, the GIL released (NOTE [copy in C]): a TIERING_COPY_* status."""
    return int(lib.tiering_copy_file(src, staging_fd, name, dst_fd, leaf, call.c, _progress, call.handle))


@cache
def _changed() -> dict[int, str]:
    """The TIERING_COPY_* statuses that mean the source is not the catalog's
    file (the library is loaded on first use)."""
    return {lib.TIERING_COPY_NOT_REGULAR: "is no longer the regular file the scan saw",
            lib.TIERING_COPY_CHANGED: "changed since the scan",
            lib.TIERING_COPY_GREW: "grew while it was copied",
            lib.TIERING_COPY_SHRANK: "shrank while it was copied",
            lib.TIERING_COPY_REPLACED: "was renamed over or removed while it was copied"}


def _raise_for(status: int, err: int, src: str) -> None:
    """The exception of a TIERING_COPY_* status other than OK and STOPPED."""
    if status == lib.TIERING_COPY_OK:
        return
    reason = _changed().get(status)
    if reason is not None:
        raise SourceChanged(f"{src} {reason}")
    raise OSError(err or errno.EIO, os.strerror(err or errno.EIO), src)


class BatchSource:
    """What tiering_copy_batch reads to copy a catalogued file (NOTE [batch
    copy]): the catalog's path blob and columns as C pointers, the data roots
    by id, and the daemon's stop flag (an int32 set by Daemon.stop).  Made
    once per daemon; it keeps the arrays it points into alive."""

    def __init__(self, files: FileTable, roots: list[str], stop: Any, records: Any = None,
                 entries: Any = None, slots: np.ndarray | None = None):
        c = files.columns
        self._arrays = (files.paths, files.offsets, files.root, c["size"], c["mtime_ns"], c["link"].view(np.uint8))
        self._roots = [ffi.new("char[]", os.fsencode(r)) for r in roots]
        self.fields = {
            "paths": ffi.from_buffer("uint8_t[]", self._arrays[0]),
            "offsets": ffi.from_buffer("int64_t[]", self._arrays[1]),
            "root": ffi.from_buffer("int32_t[]", self._arrays[2]),
            "size": ffi.from_buffer("int64_t[]", self._arrays[3]),
            "mtime_ns": ffi.from_buffer("int64_t[]", self._arrays[4]),
            "link": ffi.from_buffer("uint8_t[]", self._arrays[5]),
            "roots": ffi.new("char *[]", self._roots), "nroots": len(roots), "stop": stop,
            # the index's records, by the same ids: each copy sets or clears
            # TIERING_FILE_VERIFIED (NOTE [served descriptors])
            "records": ffi.NULL if records is None else records}
        # the index's entries and each file's slot: the copies claim their
        # state words (NOTE [one read per file]); without them they do not
        self.claims = entries is not None and slots is not None
        if self.claims:
            assert slots is not None
            self._slots = np.ascontiguousarray(slots, np.uint64).view(np.int64)
            self.fields["entries"] = entries
            self.fields["slots"] = ffi.from_buffer("int64_t[]", self._slots)


class _BatchCall:
    """A copying thread's arguments of tiering_copy_batch, made once per
    thread and daemon: the struct, the staging name and BATCH_FILES
    outcomes, seen from numpy too."""

    _local = threading.local()

    def __init__(self, source: BatchSource):
        self.source = source
        self.name = ffi.new("char[]", f"{threading.get_ident()}-{os.getpid()}.part".encode())
        self.b = ffi.new("struct tiering_batch *", {**source.fields, "name": self.name})
        self.files = ffi.new("struct tiering_batch_file[]", BATCH_FILES)
        if ffi.sizeof("struct tiering_batch_file") != BATCH_DTYPE.itemsize:
            raise RuntimeError("struct tiering_batch_file and BATCH_DTYPE differ")
        self.view = np.frombuffer(ffi.buffer(self.files), BATCH_DTYPE)

    @classmethod
    def of_thread(cls, source: BatchSource) -> _BatchCall:
        call: _BatchCall | None = getattr(cls._local, "call", None)
        if call is None or call.source is not source:
            call = cls._local.call = cls(source)
        return call


def batch_share(queued: int, idle: int, waits: float) -> int:
    """How many of the `queued` small copies of its tier a worker takes
    (NOTE [batch share]).  `waits`: the times a copy of the tier waited
    (voluntary context switches per copy, averaged; < 0 not known: fewer
    than WAITS_COPIES copies were measured).  Copies
    that wait for the PFS go out in parallel: the worker takes its share
    among itself and the `idle` workers, at most SHARE_FILES; copies that
    do not wait are CPU work, which more threads do not make faster: it
    takes BATCH_FILES (the fewer calls, the less Python per copy)."""
    if 0 <= waits <= WAITS_QUICK:
        return min(queued, BATCH_FILES)
    return max(1, min(queued, SHARE_FILES, -(-queued // (idle + 1))))


def waits_average(average: float, seen: int, waits: int, copies: int) -> tuple[float, int]:
    """A tier's average of the times a small copy waits, and the copies it
    was measured on, after a part of `copies` copies that waited `waits`
    times (NOTE [batch share]; waits < 0: not known, nothing changes).  Each
    copy weighs 1/WAITS_COPIES, so that a part of one copy moves the average
    little and a batch of BATCH_FILES nearly replaces it."""
    if waits < 0 or copies <= 0:
        return average, seen
    per_copy = waits / copies
    if seen <= 0:
        return per_copy, copies
    weight = 1.0 - (1.0 - 1.0 / WAITS_COPIES) ** copies
    return average + weight * (per_copy - average), seen + copies


def copy_batch(ids: np.ndarray, source: BatchSource, tier: TierState,
               done: Callable[[np.ndarray, int], None], claim: int = 0,
               opens: np.ndarray | None = None) -> None:
    """Copies the small files `ids` (at most BATCH_FILES, each under
    BATCH_BYTES) into the tier under their final names, in order, with the
    GIL released (NOTE [batch copy]).  done(outcomes, waits) is called
    with the outcomes of the files tried so far, in ids' order, and the
    times the thread waited while it tried them (NOTE [batch share]; -1:
    not known, or none was tried), at least every BATCH_BUDGET_NS and at
    the end, so that each is published soon after its copy: the outcomes
    are a structured array (BATCH_DTYPE) of a TIERING_COPY_* status per
    file (STOPPED: not copied: the daemon stops), the errno, the bytes read
    and the copy's st_blocks.  Every file of ids is in exactly one
    call.  A staging directory found gone is made again (twice at most).
    Checks and leftovers as copy_file's.  The caller holds one slot of the
    PFS semaphore.  With a source that claims (BatchSource.claims) and
    `claim` (the tier's state, tier + 1), each file is claimed before its
    copy and published by it (`opens`: each file's open counter when it was
    queued; outcomes TAKEN and READ: not copied, NOTE [one read per file])."""
    n = len(ids)
    if n > BATCH_FILES:
        raise ValueError(f"a batch copies at most {BATCH_FILES} files, not {n}")
    call = _BatchCall.of_thread(source)
    out = call.view[:n]
    out["id"] = ids
    out["status"] = -1
    out["published"] = 0
    out["opens"] = 0 if opens is None else opens
    call.b.claim = claim if source.claims else 0
    if not call.b.claim:
        call.b.entries = ffi.NULL
    elif call.b.entries == ffi.NULL:
        call.b.entries = source.fields["entries"]
    call.b.data_fd = tier.dirs.data.top_fd
    call.b.budget_ns = BATCH_BUDGET_NS
    first = ffi.cast("struct tiering_batch_file *", call.files)
    at, remade = 0, 0
    while at < n:
        staging_fd = tier.dirs.thread_staging()
        call.b.staging_fd = staging_fd
        k = _transfer_many(call.b, first + at, n - at)
        if k:
            done(out[at:at + k].copy(), int(call.b.waits))
            at += k
        if at == n:
            return
        status = int(out["status"][at])
        if status == lib.TIERING_COPY_NO_STAGING and remade < 2:
            remade += 1
            tier.dirs.remake_staging(staging_fd)
        elif status != -1 or not k:      # stopped, or the staging directory is gone for good
            rest = out[at:]
            rest["status"][rest["status"] == -1] = lib.TIERING_COPY_STOPPED
            done(rest.copy(), -1)
            return


def _transfer_many(b: Any, files: Any, n: int) -> int:
    """The batch in C, the GIL released: how many files were tried."""
    return int(lib.tiering_copy_batch(b, files, n))


def batch_failure(status: int, err: int, src: str) -> Exception | None:
    """What a file of a batch that ended with a TIERING_COPY_* status other
    than OK and STOPPED failed with: SourceChanged or OSError."""
    try:
        _raise_for(status, err, src)
    except (SourceChanged, OSError) as e:
        return e
    return None


def _copy_chunked(src: str, f: CopySource, tier: TierState, stop: threading.Event,
                  on_read: Callable[[int], None], name: str, reads: PfsReads) -> int | None:
    """A large file in parallel chunks (NOTE [chunked copy]), between the
    steps of the C copy (NOTE [copy in C]): tiering_copy_open opens and
    checks the source and makes the staging file; the calling thread and up
    to tier.chunk_threads - 1 helpers of the chunk pool, each in a PFS slot
    of its own, copy its ranges at the same offsets, then one more byte is
    tried (growth); tiering_copy_finish checks the size and the source
    again and renames the copy into place.  A stop or an error in any chunk
    ends all of them and removes the staging file."""
    c = _Call.of_thread(f).c
    progress = _Progress(stop, on_read)
    status, staging_fd = tier.dirs.in_staging(lambda fd: int(lib.tiering_copy_open(os.fsencode(src), fd,
                                                                                   name.encode(), c)),
                                              lib.TIERING_COPY_NO_STAGING)
    if status != lib.TIERING_COPY_OK:
        return _outcome(status, c, progress, src)
    key, leaf = TierDirs.key(f)
    dst_fd = -1
    try:
        copied = _Ranges(c.fd_in, c.fd_out, f.size, tier.chunk_threads, progress).copy(reads)
        if copied is not None:
            copied += _copy_range(c.fd_in, c.fd_out, f.size, 1, progress)  # growth
        done = copied is not None and progress.error is None and not stop.is_set()
        if done:
            dst_fd = tier.dirs.data.acquire(key, create=True)
    except BaseException:
        lib.tiering_copy_finish(c, -2, os.fsencode(src), staging_fd, name.encode(), -1, b"")
        raise
    try:
        status = int(lib.tiering_copy_finish(c, copied if done else -2, os.fsencode(src), staging_fd,
                                             name.encode(), dst_fd, leaf.encode()))
    finally:
        if dst_fd >= 0:
            tier.dirs.data.release(key)
    return _outcome(status, c, progress, src)


class _Ranges:
    """The ranges of one chunked copy, [0, size) in whole MiB, taken one at
    a time by the copying thread (in the slot it holds) and by helpers in
    the chunk pool (each in a slot of its own) until none is left or the
    copy ends (NOTE [chunked copy])."""

    def __init__(self, fd_in: int, fd_out: int, size: int, threads: int, progress: _Progress):
        step = -(-size // max(1, threads))
        step = -(-step // CHUNK_ALIGN) * CHUNK_ALIGN
        self.ranges = [(off, min(step, size - off)) for off in range(0, size, step)]
        self.got = [0] * len(self.ranges)
        self.fds = fd_in, fd_out
        self.progress = progress
        self._cond = threading.Condition()
        self._next = 0      # the next range to take; len(ranges) once the copy ends
        self._busy = 0      # ranges being copied

    def copy(self, reads: PfsReads) -> int | None:
        """Copies every range; the bytes copied up to the first short range
        (end of file: the source shrank), None when stopped or failed."""
        try:
            for _ in range(min(len(self.ranges), max(1, reads.slots)) - 1):
                reads.submit(lambda: self._help(reads.semaphore))
            self._run()
        finally:   # a helper that failed to start ends the copy too: the fds close when no range is copied
            with self._cond:
                self._next = len(self.ranges)      # helpers not started yet take nothing
                self._cond.wait_for(lambda: not self._busy)
        if self.progress.error is not None or self.progress.stop.is_set():
            return None
        total = 0
        for (_, want), got in zip(self.ranges, self.got):
            total += got
            if got < want:
                return total
        return total

    def _help(self, slots: threading.BoundedSemaphore) -> None:
        """A helper: waits for a PFS slot while ranges are left, then copies
        ranges in it."""
        while not slots.acquire(timeout=0.05):
            if self._ended():
                return
        try:
            self._run()
        finally:
            slots.release()

    def _ended(self) -> bool:
        with self._cond:
            return self._next >= len(self.ranges)

    def _take(self) -> int | None:
        with self._cond:
            p = self.progress
            if self._next >= len(self.ranges) or p.error is not None or p.stop.is_set():
                self._next = len(self.ranges)
                return None
            self._next += 1
            self._busy += 1
            return self._next - 1

    def _run(self) -> None:
        while (k := self._take()) is not None:
            try:
                self.got[k] = _copy_range(*self.fds, *self.ranges[k], self.progress)
            except BaseException as e:
                self.progress.error = self.progress.error or e
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()


def _copy_range(fd_in: int, fd_out: int, off: int, length: int, progress: _Progress) -> int:
    """[off, off + length) of fd_in to the same offsets of fd_out; the bytes
    copied (fewer at end of file), 0 when stopped (progress says why)."""
    n = int(lib.tiering_copy_range(fd_in, fd_out, off, length, _progress, ffi.new_handle(progress)))
    if n == -1:
        e = ffi.errno
        progress.error = progress.error or OSError(e, os.strerror(e))
        return 0
    return max(n, 0)


def unlink_at(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
