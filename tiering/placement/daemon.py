"""The placement daemon: threads inside tier-run that copy data-set files onto
the local tiers and publish them in the shared index.

Threads: one event thread drains the shim's event ring, delivers copy
completions and calls the policy (every policy hook runs there: NOTE [one
policy thread]); per tier a pool of copy workers; the PFS reads of all
workers share one semaphore sized for the PFS's concurrency.  The lock
guards the placement state (which file is where, copies in flight, tier
accounting), which the workers change when a copy lands.

Publishing: a copy complete under its final name is published with a
compare-and-swap of the entry's state word, so a write open that invalidated
the entry meanwhile always wins.  Eviction unpublishes first and unlinks
afterwards; a reader that raced with it either still opens the complete old
copy or falls back to the PFS.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..catalog import Catalog, CatalogFile
from .api import NOT_PLACED, Policy, allocation
from .index import Event, SharedIndex, events_array, lib
from .tiers import SourceChanged, TierState, copy_file

if TYPE_CHECKING:   # grpc is imported only by jobs that span nodes
    from ..cluster.links import PeerLinks

log = logging.getLogger("tiering")

STOP_TIMEOUT = 10.0   # seconds stop() waits for running copies (a hung PFS read cannot be interrupted)
MAX_ERRORS = 20       # error messages kept for the summary


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
    placement_errors: int = 0       # exceptions raised by the policy (the job goes on)
    job_pfs_bytes: int = 0          # sizes of the files COMMAND opened from the PFS (from the events)
    errors: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS and message not in self.errors:
            self.errors.append(message)


@dataclass(frozen=True)
class TierFill:
    name: str
    capacity: int
    used: int              # bytes taken by copies and reservations (whole blocks)
    files: int             # published copies
    bytes: int             # their sizes


@dataclass(frozen=True)
class DaemonSnapshot:
    """What the daemon has done so far (Daemon.snapshot)."""

    tiers: list[TierFill]
    copies: int
    copy_failures: int
    evictions: int
    in_flight: int         # copies queued or running
    reading: int           # of which reading the PFS now
    pfs_opens: int         # by the daemon
    pfs_bytes: int         # read by the daemon
    job_pfs_bytes: int     # sizes of the files COMMAND opened from the PFS (an upper bound of its reads)
    events: int
    invalidated: int
    changed_sources: int


class Daemon:
    """Implements the Placement contract (placement/api.py) for its policy."""

    def __init__(self, index: SharedIndex, catalog: Catalog, slots: list[int],
                 tiers: list[TierState], pfs_threads: int, policy_factory: Callable[[Daemon], Policy],
                 peers: PeerLinks | None = None):
        self.index = index
        self.peers = peers                  # the other nodes of a multi-node job (None: one node)
        self.catalog = catalog
        self.files = catalog.files
        self.slots = slots
        self.tiers = tiers
        self.stats = DaemonStats()
        self._sizes = [f.size for f in catalog.files]
        self._sizes_array = np.asarray(self._sizes, dtype=np.int64)
        self._lock = threading.Lock()
        self.pfs_threads = max(1, pfs_threads)
        self._pfs = threading.BoundedSemaphore(self.pfs_threads)
        self._stop = threading.Event()
        # catalog index by slot, and where each file is (tier or NOT_PLACED)
        self.file_of_slot = np.full(int(index.header.nslots), -1, np.int32)
        self.file_of_slot[np.asarray(slots, np.int64)] = np.arange(len(slots), dtype=np.int32)
        self._where = array("b", [NOT_PLACED]) * len(self.files)
        self._pending: dict[int, int] = {}    # file -> tier of a copy in flight
        self._allocated: dict[int, int] = {}  # file -> bytes its published copy was counted for
        self._invalid: set[int] = set()
        self._futures: set[Future[None]] = set()
        self._landed: queue.SimpleQueue[tuple[int, int, bool]] = queue.SimpleQueue()  # file, tier, published
        self._thread: threading.Thread | None = None
        self._error_kinds: set[str] = set()
        self.stuck = 0                      # copies stop() gave up waiting for
        self._reading = 0                   # copies reading the PFS now (inside the semaphore)
        self.policy = policy_factory(self)

    # -- the Placement contract ----------------------------------------------
    @property
    def sizes(self) -> Sequence[int]:
        return self._sizes

    @property
    def capacities(self) -> Sequence[int]:
        return [t.capacity for t in self.tiers]

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def where(self, i: int) -> int:
        return self._where[i]

    def placeable(self, i: int) -> bool:
        return (self._where[i] == NOT_PLACED and i not in self._pending and i not in self._invalid
                and not self._stop.is_set())

    def free(self, tier: int) -> int:
        return self.tiers[tier].free()

    def fastest_with_room(self, i: int) -> int | None:
        need = allocation(self._sizes[i])
        for k, t in enumerate(self.tiers):
            if t.free() >= need:
                return k
        return None

    def place(self, i: int, tier: int) -> bool:
        with self._lock:
            if not self.placeable(i):
                return False
            t = self.tiers[tier]
            need = allocation(self._sizes[i])
            if t.free() < need:
                return False
            t.used += need
            self._pending[i] = tier
            assert t.pool is not None
            fut = t.pool.submit(self._copy_job, i, tier, need)
            self._futures.add(fut)
            fut.add_done_callback(self._job_done(i, tier, need))
        return True

    def evict(self, i: int) -> bool:
        with self._lock:
            tier = self._where[i]
            if tier == NOT_PLACED:
                return False
            self._drop_copy(i, tier)
            self.stats.evictions += 1
            return True

    def placements(self) -> Iterator[tuple[int, int]]:
        with self._lock:
            placed = [(i, t) for i, t in enumerate(self._where) if t != NOT_PLACED]
            placed += list(self._pending.items())
        return iter(placed)

    def copies_in_flight(self) -> int:
        return len(self._pending)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        for t in self.tiers:
            # a copy waits on the PFS most of the time: enough workers that the
            # PFS's concurrency (the semaphore) is what bounds the reads
            t.pool = ThreadPoolExecutor(max_workers=max(1, t.threads, self.pfs_threads),
                                        thread_name_prefix=f"tiering-{t.name}")
        self._thread = threading.Thread(target=self._event_loop, name="tiering-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stops placing: queued copies are cancelled, running ones abort at
        their next chunk.  A copy blocked in a read of a hung PFS cannot be
        interrupted: after `timeout` seconds (default STOP_TIMEOUT) stop gives
        up on it, says so and returns False (the caller must then not wait for
        those threads at exit); True when every copy has ended."""
        timeout = STOP_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._lock:  # a place() past its stop check has submitted already
            self._stop.set()
            running = set(self._futures)
        if self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        for t in self.tiers:
            if t.pool:
                t.pool.shutdown(wait=False, cancel_futures=True)
        # wait() would not see a future cancelled by shutdown() as done: leave them out
        running = {f for f in running if not f.cancelled()}
        not_done = wait(running, timeout=max(0.0, deadline - time.monotonic())).not_done
        self._guarded(self._handle, self.index.drain_batch(force=True))
        if not_done:
            self.stuck = len(not_done)
            log.warning("%d cop%s still blocked reading the PFS after %.0f s; not waiting for %s",
                        len(not_done), "y is" if len(not_done) == 1 else "ies are", timeout,
                        "it" if len(not_done) == 1 else "them")
            return False
        return True

    # -- the event thread -------------------------------------------------------
    def _event_loop(self) -> None:
        self._guarded(self.policy.start)
        last_tail_move = time.monotonic()
        last_pending = -1
        while not self._stop.wait(0.005):
            self._deliver_landed()
            # orders first: the hook writes an epoch's order before that epoch opens a file
            self._guarded(self.policy.poll)
            pending = self.index.pending_events()
            stuck = pending > 0 and pending == last_pending and time.monotonic() - last_tail_move > 0.5
            events = self.index.drain_batch(force=stuck)
            if len(events) or pending != last_pending:
                last_tail_move = time.monotonic()
            last_pending = self.index.pending_events()
            self._guarded(self._handle, events)

    def _deliver_landed(self) -> None:
        while True:
            try:
                i, tier, published = self._landed.get_nowait()
            except queue.Empty:
                return
            if published:
                self._guarded(self.policy.on_placed, i, tier)
            else:
                self._guarded(self.policy.on_failed, i)

    def _guarded(self, fn: Callable[..., None], *args: object) -> None:
        """A policy bug must not take the job down, nor print tracebacks on
        the user's terminal: each kind of error is logged once (with its
        traceback at -vv) and counted."""
        try:
            fn(*args)
        except Exception as e:
            self.stats.placement_errors += 1
            kind = f"{type(e).__name__}: {e}"
            self.stats.note(f"placement error: {kind}")
            if kind not in self._error_kinds:
                self._error_kinds.add(kind)
                log.warning("placement error (placement goes on): %s", kind)
                log.debug("placement error", exc_info=True)

    def _handle(self, events: np.ndarray | list[Event]) -> None:
        """One drained batch (NOTE [event batches]): opens go to the policy as
        arrays, in order; a write open invalidates its file where it stands."""
        if isinstance(events, list):
            events = events_array(events)
        n = len(events)
        self.stats.events += n
        if not n:
            return
        slots = events["entry"].astype(np.int64)
        files = np.full(n, -1, np.int64)
        known = slots < len(self.file_of_slot)
        files[known] = self.file_of_slot[slots[known]]
        kinds = events["kind"]
        catalogued = files >= 0
        opens = catalogued & ((kinds == lib.TIERING_EV_OPEN_PFS) | (kinds == lib.TIERING_EV_OPEN_TIER))
        writes = np.flatnonzero(catalogued & (kinds == lib.TIERING_EV_WRITE)).tolist()
        from_pfs = files[opens & (kinds == lib.TIERING_EV_OPEN_PFS)]
        if from_pfs.size:   # observation (snapshot): sizes of the files COMMAND opened on the PFS
            self.stats.job_pfs_bytes += int(self._sizes_array[from_pfs].sum())
        start = 0
        for w in [*writes, n]:
            seg = start + np.flatnonzero(opens[start:w])
            if seg.size:
                self._guarded(self.policy.on_opens, files[seg], kinds[seg] == lib.TIERING_EV_OPEN_TIER,
                              events["pid"][seg].astype(np.int64))
            if w < n:
                self._invalidate(int(files[w]))
                # the file's other paths: NOTE [alias invalidation] in docs/design.md
                for slot in self.index.aliases(int(slots[w]))[1:]:
                    if self.file_of_slot[slot] >= 0:
                        self._invalidate(int(self.file_of_slot[slot]))
            start = w + 1

    def _invalidate(self, i: int) -> None:
        with self._lock:
            if i in self._invalid:
                return
            self._invalid.add(i)
            tier = self._where[i]
            if tier != NOT_PLACED:
                self._drop_copy(i, tier)
                self.stats.invalidated += 1
        log.info("%s was opened for writing: never served from a tier again",
                 self.catalog.source_path(self.files[i]))

    def _drop_copy(self, i: int, tier: int) -> None:
        """Under the lock: unpublish, then delete, then account."""
        f = self.files[i]
        self.index.cas_state(self.slots[i], tier + 1, lib.TIERING_STATE_NONE)
        t = self.tiers[tier]
        t.remove_copy(f)
        t.used -= self._allocated.pop(i, allocation(f.size))
        t.files -= 1
        t.placed_bytes -= f.size
        self._where[i] = NOT_PLACED

    # -- the copy workers --------------------------------------------------------
    def _job_done(self, i: int, tier: int, reserved: int) -> Callable[[Future[None]], None]:
        def done(fut: Future[None]) -> None:
            with self._lock:
                self._futures.discard(fut)
                if fut.cancelled():
                    self._pending.pop(i, None)
                    self.tiers[tier].used -= reserved
        return done

    def _count_read(self, n: int) -> None:
        with self._lock:
            self.stats.pfs_bytes += n

    def _copy(self, src: str, f: CatalogFile, t: TierState) -> int | None:
        """One copy, inside the PFS semaphore (tests wrap it)."""
        return copy_file(src, f, t, self._stop, self._count_read)

    def _copy_job(self, i: int, tier: int, reserved: int) -> None:
        t = self.tiers[tier]
        f = self.files[i]
        src = self.catalog.source_path(f)
        allocated: int | None = None
        published = False
        try:
            with self._pfs:
                with self._lock:
                    self.stats.pfs_opens += 1
                    self._reading += 1
                try:
                    allocated = self._copy(src, f, t)
                finally:
                    with self._lock:
                        self._reading -= 1
            with self._lock:
                if allocated is not None and i not in self._invalid and not self._stop.is_set():
                    # the copy is complete under its final name: publish it
                    published = self.index.cas_state(self.slots[i], lib.TIERING_STATE_NONE, tier + 1)
                if published and allocated is not None:
                    self._where[i] = tier
                    t.files += 1
                    t.placed_bytes += f.size
                    t.used += allocated - reserved
                    self._allocated[i] = allocated
                    self.stats.copies += 1
        except SourceChanged:
            with self._lock:
                self.stats.changed_sources += 1
            log.info("%s changed since the scan: not placed", src)
        except Exception as e:  # a failed copy only means the PFS serves this file
            with self._lock:
                t.failures += 1
                self.stats.copy_failures += 1
                self.stats.note(f"{src}: {e}")
            log.debug("copy of %s to %s failed: %s", f.rel, t.name, e)
        finally:
            with self._lock:
                self._pending.pop(i, None)
                if not published:
                    t.used -= reserved
                    if allocated is not None:
                        t.remove_copy(f)
        self._landed.put((i, tier, published))

    # -- observation (NOTE [status file]) -------------------------------------------
    def snapshot(self) -> DaemonSnapshot:
        """A consistent copy of the counters and the tiers' fill, for the
        progress display, the status file and the time series (any thread)."""
        with self._lock:
            st = self.stats
            return DaemonSnapshot(
                tiers=[TierFill(t.name, t.capacity, t.used, t.files, t.placed_bytes) for t in self.tiers],
                copies=st.copies, copy_failures=st.copy_failures, evictions=st.evictions,
                in_flight=len(self._pending), reading=self._reading,
                pfs_opens=st.pfs_opens, pfs_bytes=st.pfs_bytes, job_pfs_bytes=st.job_pfs_bytes,
                events=st.events, invalidated=st.invalidated, changed_sources=st.changed_sources)

    # -- reporting -------------------------------------------------------------
    def tier_summary(self) -> list[dict[str, object]]:
        return [{"name": t.name, "kind": t.kind, "path": str(t.root), "capacity": t.capacity,
                 "files": t.files, "bytes": t.placed_bytes, "used": t.used,
                 "copy_failures": t.failures} for t in self.tiers]
