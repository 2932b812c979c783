"""The placement daemon: threads inside tier-run that copy data-set files onto
the local tiers and publish them in the shared index.

A copy is written under a staging directory of its tier, checked (bytes
copied, source size and mtime unchanged since the scan), renamed into place
and only then published with a compare-and-swap of the entry's state word, so
a write open that invalidated the entry meanwhile always wins.  Eviction
unpublishes first and unlinks afterwards; a reader that raced with it either
still opens the complete old copy or falls back to the PFS.

Which file goes where is the policy's business (tiering/policy.py); this
module owns tiers, workers, capacity accounting and the event loop.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from array import array
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .catalog import Catalog, CatalogFile
from .index import Event, SharedIndex, lib

log = logging.getLogger("tiering")

BLOCK = 4096
CHUNK = 8 << 20
NOT_PLACED = -1
STOP_TIMEOUT = 10.0   # seconds stop() waits for running copies (a hung PFS read cannot be interrupted)


def allocation(size: int) -> int:
    """Bytes a file of this size is expected to take on a tier."""
    return max(BLOCK, (size + BLOCK - 1) // BLOCK * BLOCK)


@dataclass
class TierState:
    """One local tier while the job runs."""

    name: str
    kind: str
    root: Path          # private directory of this job on the tier
    capacity: int
    threads: int
    used: int = 0       # bytes allocated by published copies + reservations
    files: int = 0      # published copies
    placed_bytes: int = 0  # logical bytes of published copies
    failures: int = 0
    pool: ThreadPoolExecutor | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def free(self) -> int:
        return self.capacity - self.used

    def copy_path(self, f: CatalogFile) -> Path:
        """Where a file's copy lives: <data>/<data-root id>/<relative path>
        (the shim builds the same path)."""
        return self.data / str(f.root) / f.rel


@dataclass
class DaemonStats:
    pfs_opens: int = 0              # source files opened by the daemon
    pfs_bytes: int = 0              # bytes the daemon read from the PFS
    copies: int = 0
    copy_failures: int = 0
    changed_sources: int = 0        # not published: source changed since the scan
    evictions: int = 0
    invalidated: int = 0            # copies dropped after a write open
    events: int = 0
    errors: list[str] = field(default_factory=list)


class Daemon:
    def __init__(self, index: SharedIndex, catalog: Catalog, slots: list[int],
                 tiers: list[TierState], pfs_threads: int, policy_factory: Callable[["Daemon"], "Policy"]):
        self.index = index
        self.catalog = catalog
        self.files = catalog.files
        self.slots = slots
        self.tiers = tiers
        self.stats = DaemonStats()
        self.lock = threading.RLock()
        self.pfs_threads = max(1, pfs_threads)
        self._pfs = threading.BoundedSemaphore(self.pfs_threads)
        self._stop = threading.Event()
        # catalog index by slot, and where each file is (tier or NOT_PLACED)
        self.file_of_slot = array("i", [-1]) * int(index.header.nslots)
        for i, s in enumerate(slots):
            self.file_of_slot[s] = i
        self.where = array("b", [NOT_PLACED]) * len(self.files)
        self.pending: dict[int, int] = {}   # file -> tier of a copy in flight
        self.allocated: dict[int, int] = {}  # file -> bytes its published copy was counted for
        self.invalid: set[int] = set()
        self._futures: set[Future[None]] = set()
        self._thread: threading.Thread | None = None
        self.stuck = 0                      # copies stop() gave up waiting for
        self.policy = policy_factory(self)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        for t in self.tiers:
            # a copy waits on the PFS most of the time: enough workers that the
            # PFS's concurrency (the semaphore) is what bounds the reads
            t.pool = ThreadPoolExecutor(max_workers=max(1, t.threads, self.pfs_threads),
                                        thread_name_prefix=f"tiering-{t.name}")
        self._thread = threading.Thread(target=self._event_loop, name="tiering-events", daemon=True)
        self._thread.start()
        self.policy.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stops placing: queued copies are cancelled, running ones abort at
        their next chunk.  A copy blocked in a read of a hung PFS cannot be
        interrupted: after `timeout` seconds (default STOP_TIMEOUT) stop gives
        up on it, says so and returns False (the caller must then not wait for
        those threads at exit); True when every copy has ended."""
        timeout = STOP_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self.lock:  # a place() past its stop check has submitted already
            self._stop.set()
            running = set(self._futures)
        if self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        for t in self.tiers:
            if t.pool:
                t.pool.shutdown(wait=False, cancel_futures=True)
        not_done = wait(running, timeout=max(0.0, deadline - time.monotonic())).not_done
        # wait() does not count a future cancelled by shutdown() as done
        not_done = {f for f in not_done if not f.cancelled()}
        self._guarded(self._handle, self.index.drain(force=True))
        if not_done:
            self.stuck = len(not_done)
            log.warning("%d cop%s still blocked reading the PFS after %.0f s; not waiting for %s",
                        len(not_done), "y is" if len(not_done) == 1 else "ies are", timeout,
                        "it" if len(not_done) == 1 else "them")
            return False
        return True

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- events ---------------------------------------------------------------
    def _event_loop(self) -> None:
        last_tail_move = time.monotonic()
        last_pending = -1
        while not self._stop.wait(0.005):
            # orders first: the hook writes an epoch's order before that epoch opens a file
            self._guarded(self.policy.poll)
            pending = self.index.pending_events()
            stuck = pending > 0 and pending == last_pending and time.monotonic() - last_tail_move > 0.5
            events = self.index.drain(force=stuck)
            if events or pending != last_pending:
                last_tail_move = time.monotonic()
            last_pending = self.index.pending_events()
            self._guarded(self._handle, events)

    def _guarded(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as e:  # a policy bug must not take the job down
            log.exception("placement error: %s", e)
            if len(self.stats.errors) < 20:
                self.stats.errors.append(repr(e))

    def _handle(self, events: list[Event]) -> None:
        self.stats.events += len(events)
        for ev in events:
            i = self.file_of_slot[ev.slot] if 0 <= ev.slot < len(self.file_of_slot) else -1
            if i < 0:
                continue
            if ev.kind == lib.TIERING_EV_WRITE:
                self._invalidate(i)
                # the file's other paths: NOTE [alias invalidation] in docs/design.md
                for slot in self.index.aliases(ev.slot)[1:]:
                    if self.file_of_slot[slot] >= 0:
                        self._invalidate(self.file_of_slot[slot])
            elif ev.kind in (lib.TIERING_EV_OPEN_PFS, lib.TIERING_EV_OPEN_TIER):
                self.policy.on_open(i, ev.kind == lib.TIERING_EV_OPEN_TIER, ev.pid)

    def _invalidate(self, i: int) -> None:
        with self.lock:
            if i in self.invalid:
                return
            self.invalid.add(i)
            tier = self.where[i]
            if tier != NOT_PLACED:
                self._drop_copy(i, tier)
                self.stats.invalidated += 1
        log.info("%s was opened for writing: never served from a tier again",
                 self.catalog.source_path(self.files[i]))

    # -- placement primitives used by policies ---------------------------------
    def fastest_with_room(self, i: int) -> int | None:
        need = allocation(self.files[i].size)
        for k, t in enumerate(self.tiers):
            if t.free() >= need:
                return k
        return None

    def place(self, i: int, tier: int) -> bool:
        """Reserves room on the tier and queues the copy; False if it cannot."""
        with self.lock:
            if (self._stop.is_set() or i in self.pending or i in self.invalid
                    or self.where[i] != NOT_PLACED):
                return False
            t = self.tiers[tier]
            need = allocation(self.files[i].size)
            if t.free() < need:
                return False
            t.used += need
            self.pending[i] = tier
            assert t.pool is not None
            fut = t.pool.submit(self._copy_job, i, tier, need)
            self._futures.add(fut)
            fut.add_done_callback(self._job_done(i, tier, need))
        return True

    def _job_done(self, i: int, tier: int, reserved: int) -> Callable[[Future[None]], None]:
        def done(fut: Future[None]) -> None:
            with self.lock:
                self._futures.discard(fut)
                if fut.cancelled():
                    self.pending.pop(i, None)
                    self.tiers[tier].used -= reserved
            if fut.cancelled():
                self.policy.on_failed(i)
        return done

    def evict(self, i: int) -> bool:
        """Unpublishes and deletes the copy of file i; False if there is none."""
        with self.lock:
            tier = self.where[i]
            if tier == NOT_PLACED:
                return False
            self._drop_copy(i, tier)
            self.stats.evictions += 1
            return True

    def _drop_copy(self, i: int, tier: int) -> None:
        f = self.files[i]
        slot = self.slots[i]
        self.index.cas_state(slot, tier + 1, lib.TIERING_STATE_NONE)
        t = self.tiers[tier]
        _unlink_quietly(t.copy_path(f))
        t.used -= self.allocated.pop(i, allocation(f.size))
        t.files -= 1
        t.placed_bytes -= f.size
        self.where[i] = NOT_PLACED

    # -- the copy ------------------------------------------------------------
    def _copy_job(self, i: int, tier: int, reserved: int) -> None:
        t = self.tiers[tier]
        f = self.files[i]
        allocated: int | None = None
        published = False
        try:
            allocated = self._copy(f, t)
            with self.lock:
                if allocated is not None and i not in self.invalid and not self._stop.is_set():
                    # the copy is complete under its final name: publish it
                    published = self.index.cas_state(self.slots[i], lib.TIERING_STATE_NONE, tier + 1)
                if published and allocated is not None:
                    self.where[i] = tier
                    t.files += 1
                    t.placed_bytes += f.size
                    t.used += allocated - reserved
                    self.allocated[i] = allocated
                    self.stats.copies += 1
        except Exception as e:  # a failed copy only means the PFS serves this file
            t.failures += 1
            self.stats.copy_failures += 1
            if len(self.stats.errors) < 20:
                self.stats.errors.append(f"{self.catalog.source_path(f)}: {e}")
            log.debug("copy of %s to %s failed: %s", f.rel, t.name, e)
        finally:
            with self.lock:
                self.pending.pop(i, None)
                if not published:
                    t.used -= reserved
                    if allocated is not None:
                        _unlink_quietly(t.copy_path(f))
        if published:
            self.policy.on_placed(i, tier)
        else:
            self.policy.on_failed(i)

    def _copy(self, f: CatalogFile, t: TierState) -> int | None:
        """Copies one file into the tier; returns the bytes it takes there, or
        None when the source changed or the daemon stops (nothing to publish)."""
        src = self.catalog.source_path(f)
        dst = t.copy_path(f)
        tmp = t.staging / f"{threading.get_ident()}-{os.getpid()}.part"
        try:
            with self._pfs:
                fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
                with self.lock:
                    self.stats.pfs_opens += 1
                try:
                    fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    try:
                        copied = self._transfer(fd_in, fd_out, f.size)
                        os.fchmod(fd_out, 0o400)   # a copy is never written through
                        st_out = os.fstat(fd_out)
                    finally:
                        os.close(fd_out)
                    st_in = os.fstat(fd_in)
                finally:
                    os.close(fd_in)
            if copied < 0:  # stopped halfway
                return None
            if copied != f.size or st_in.st_size != f.size or st_in.st_mtime_ns != f.mtime_ns:
                with self.lock:
                    self.stats.changed_sources += 1
                log.info("%s changed since the scan: not placed", src)
                return None
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dst)
            return st_out.st_blocks * 512
        finally:
            _unlink_quietly(tmp)  # a partial or rejected copy; gone already after the rename

    def _transfer(self, fd_in: int, fd_out: int, size: int) -> int:
        copied = 0
        use_sendfile = True
        while not self._stop.is_set():
            n = 0
            if use_sendfile:
                try:
                    n = os.sendfile(fd_out, fd_in, copied, CHUNK)
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    use_sendfile = False
                    continue
            else:
                data = os.pread(fd_in, CHUNK, copied)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd_out, view):]
            if n == 0:
                break
            copied += n
            with self.lock:
                self.stats.pfs_bytes += n
        if self._stop.is_set() and copied < size:
            return -1
        return copied

    # -- reporting -------------------------------------------------------------
    def tier_summary(self) -> list[dict[str, object]]:
        return [{"name": t.name, "kind": t.kind, "path": str(t.root), "capacity": t.capacity,
                 "files": t.files, "bytes": t.placed_bytes, "used": t.used,
                 "copy_failures": t.failures} for t in self.tiers]


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


from .policy import Policy  # noqa: E402  (policies use Daemon; imported last for typing)
