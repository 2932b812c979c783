"""The placement daemon: threads inside tier-run that copy data-set files onto
the local tiers and publish them in the shared index.

Threads: one event thread drains the shim's event ring, delivers copy
completions and calls the policy (every policy hook runs there: NOTE [one
policy thread]); per tier a set of copy workers that take the copies placed
on it from a queue without waking another thread, small files many to a C
call (NOTE [copy in C], NOTE [batch copy]); the PFS reads of all workers, each range of a chunked
copy too, share one semaphore sized for the PFS's concurrency.  The lock
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
import os
import queue
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..catalog import Catalog
from ..catalog.model import IntColumn
from . import index as index_mod
from .api import NOT_PLACED, Policy, allocation, allocations, data_fits
from .index import Event, SharedIndex, events_array, ffi, lib
from .queued import QUEUE_BATCH_MARKS, QUEUE_WINDOW_ROUNDS, QueueMarks, queue_wait
from .tiers import (
    BATCH_BYTES,
    SHARE_FILES,
    WAITS_COPIES,
    BatchSource,
    CopyOf,
    CopySource,
    PfsReads,
    SourceChanged,
    TierState,
    batch_failure,
    batch_share,
    copy_batch,
    copy_file,
    waits_average,
)

if TYPE_CHECKING:   # the peer tier (grpc) is imported only when the job has peers
    from ..clairvoyant.nodes import Relay
    from ..cluster.links import PeerLinks

log = logging.getLogger("tiering")

STOP_TIMEOUT = 10.0   # seconds stop() waits for running copies (a hung PFS read cannot be interrupted)
TICK = 0.005          # seconds between two turns of the event thread at least (NOTE [event batches])
IDLE_TICK = 0.02      # ... at most; sooner only when copies land or a turn drained BUSY_EVENTS or more
PATIENT_TICK = 0.1    # ... at most while the policy is patient (its lead is long): landings do not wake it,
PEAK_EVENTS = 400_000  # ... and at most what a quarter of the ring holds of this many events a second
BUSY_EVENTS = 1024    # events drained in one turn that count as many
MAX_ERRORS = 20       # error messages kept for the summary
COPY_WAIT_COPIES = 2.0   # an open waits for a copy in flight at most this many small copies' time,
COPY_WAIT_MIN = 0.001    # ... at least this long (seconds)
COPY_WAIT_MAX = 0.25     # ... and at most (NOTE [one read per file])
COPY_WAIT_WEIGHT = 0.1   # weight of a part of a batch in the average copy time
EVENT_NICE = 5        # the event thread's nice below the process's, where the system allows it


def raise_priority(by: int) -> int:
    """The calling thread's nice lowered by `by` below the process's (a
    higher priority) where the system allows it (root, or RLIMIT_NICE);
    returns by how much it was lowered, 0 where it was not.  For the event
    thread: readers that keep every core busy must not starve the thread
    that drains their events before the ring wraps (NOTE [event thread
    priority] in docs/design.md).  Never raises."""
    tid = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(-20, base - by))
        return base - os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:   # EPERM/EACCES for an ordinary user: the thread keeps its nice
        return 0


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
    claims_read: int = 0            # copies not made: COMMAND had opened the file (NOTE [one read per file])
    peer_fetches: int = 0           # copies fetched from another node instead of the PFS
    peer_bytes: int = 0             # their sizes
    peer_fallbacks: dict[str, int] = field(default_factory=dict)   # fetches given up, by reason: PFS copy
    peer: dict[str, Any] | None = None   # the job's peer tier at stop (Daemon.peer_report), None without peers
    errors: list[str] = field(default_factory=list)
    failure_reasons: dict[str, int] = field(default_factory=dict)   # copy_failures by reason (failure_reason)

    def note(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS and message not in self.errors:
            self.errors.append(message)

    def failed(self, reason: str, n: int = 1) -> None:
        self.copy_failures += n
        self.failure_reasons[reason] = self.failure_reasons.get(reason, 0) + n


PATH_MAX = 4096           # Linux's, the shim's limit on a path it serves (tier_path in shim/tiershim.c)
TOO_LONG = "path too long for the tier"


def failure_reason(e: Exception) -> str:
    """A copy failure's reason in a few words: the system's for an OSError
    ("too many open files", "no space left on device"), else its kind."""
    if isinstance(e, OSError) and e.errno:
        text = os.strerror(e.errno)
        return text[:1].lower() + text[1:]
    return type(e).__name__


def too_long_for(files: Any, tier_data: Path) -> np.ndarray | None:
    """Per file, whether its path in the tier (data dir + "/<root id>/" +
    rel) is too long for the shim to serve (None: no file is): such a copy
    would be made and never read (NOTE [paths too long for a tier])."""
    lengths = np.diff(np.asarray(files.offsets, np.int64))
    if not len(lengths):
        return None
    base = len(os.fsencode(str(tier_data)))
    roots = np.asarray(files.root, np.int64)
    ids = 2 + np.where(roots >= 10, 2, 1) + (roots >= 100)   # "/", the root id's digits, "/"
    long = base + ids + lengths >= PATH_MAX
    return long if long.any() else None


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


class _Tally(threading.local):
    """A copying thread's count of the bytes its copy of a small file read."""
    small = False
    n = 0


class _Held(threading.local):
    """Per tier, the copies a thread placed while their workers' wake-up is
    held (Daemon._waking_later); None: not held."""
    counts: list[int] | None = None


class Daemon:
    """Implements the Placement contract (placement/api.py) for its policy."""

    def __init__(self, index: SharedIndex, catalog: Catalog, slots: IntColumn,
                 tiers: list[TierState], pfs_threads: int, policy_factory: Callable[[Daemon], Policy],
                 peers: PeerLinks | None = None):
        self.index = index
        # a small ring (a small data set) is not left to fill for as long (NOTE [event batches])
        self._patient_tick = max(IDLE_TICK, min(PATIENT_TICK, int(index.header.nevents) / 4 / PEAK_EVENTS))
        self.peers = peers                  # the other nodes of a multi-node job (None: one node)
        self.event_nice = 0                 # how far the event thread's nice was lowered (raise_priority)
        self._homes: object | None = None   # the homes the policy keeps (peers.plans, once known)
        self._relay: Relay | None = None    # this node's holds for the other nodes (NOTE [relay])
        self.catalog = catalog
        self.files = catalog.files
        self.slots = np.asarray(slots, np.uint64)   # the index's slot of each file (the same array when given one)
        self.tiers = tiers
        self.stats = DaemonStats()
        self._sizes_array = np.asarray(catalog.files.size, dtype=np.int64)
        self._sizes = self._sizes_array
        self._lock = threading.Lock()
        self.pfs_threads = max(1, pfs_threads)
        self._reads = PfsReads(self.pfs_threads)   # NOTE [chunked copy]
        self._stop = threading.Event()
        self._stop_flag = ffi.new("int32_t *")    # the same, for copies in C (NOTE [batch copy])
        self._batch = BatchSource(catalog.files, catalog.roots, self._stop_flag, index.records(),
                                  index.entries, self.slots)
        # per file: its entry's open counter when its copy was queued (NOTE [one read per file])
        self._opens_at = np.zeros(len(self.files), np.uint32)
        # the whole data set fits the tiers: a copy COMMAND read first is deferred, not dropped (else
        # only when the policy says so: Policy.defers_read_copies)
        self._fits = data_fits(self._sizes_array, (t.capacity for t in tiers))
        # the files next in each tier's queue, QUEUED on their state words where the data set fits the
        # tiers (NOTE [queued copies])
        self._marks = QueueMarks(index, self.slots, len(self.files),
                                 QUEUE_WINDOW_ROUNDS * self.pfs_threads if self._batch.claims and self._fits else 0,
                                 self._batched)
        self._copy_ns = 0.0                 # a small copy's seconds, averaged (copy_wait_ns is made from it)
        # catalog index by slot, and where each file is (tier or NOT_PLACED)
        self.file_of_slot = np.full(int(index.header.nslots), -1, np.int32)
        self.file_of_slot[np.asarray(slots, np.int64)] = np.arange(len(slots), dtype=np.int32)
        self._where = array("b", [NOT_PLACED]) * len(self.files)
        # per file: the tier of its copy in flight (-1: none), and how many there are (read without the
        # lock: its 0 means every copy settled); an array, for place_many's checks of a run at once
        self._flight = np.full(len(self.files), -1, np.int8)
        self._in_flight = 0
        # per file: bytes its published copy was counted for (-1: none); an
        # array, not a dict: every file of the data set may have a copy
        self._allocated = np.full(len(self.files), -1, np.int64)
        self._invalid: set[int] = set()
        # per tier: copies placed and not started (file, bytes reserved), and a
        # condition on the lock its idle workers wait on
        self._queued: list[deque[tuple[int, int]]] = [deque() for _ in tiers]
        # ... and copies of files COMMAND read itself before their copy began, made when the tier's
        # queue is empty: for the files' later uses (NOTE [one read per file])
        self._later: list[deque[tuple[int, int]]] = [deque() for _ in tiers]
        self._work = [threading.Condition(self._lock) for _ in tiers]
        self._idle = [0] * len(tiers)       # per tier: workers waiting for copies
        # per tier: times a small copy waits, averaged, and the copies measured (NOTE [batch share])
        self._waits = [(0.0, 0)] * len(tiers)
        self._running = 0                   # copies taken from a queue and not finished
        self._quiet = threading.Condition(self._lock)   # notified when _running drops to 0
        self._tally = _Tally()              # per copying thread: the bytes its small copy read so far
        self._held = _Held()                # the event thread's wake-ups of workers held for a turn
        self._workers: list[threading.Thread] = []
        self._closing = False                # close_pools(): workers end when idle
        # copies that ended, for the policy: (files, tier, published), one item per copy or part of a batch
        self._landed: queue.SimpleQueue[tuple[np.ndarray, int, np.ndarray]] = queue.SimpleQueue()
        self._wake = threading.Event()      # set when copies land or the daemon stops: the event thread turns
        self._thread: threading.Thread | None = None
        self._error_kinds: set[str] = set()
        # opens drained, [from the PFS, tier 0, ...] (opens_seen, NOTE [open counters])
        self._opens_seen = np.zeros(1 + int(index.header.ntiers), np.int64)
        self.stuck = 0                      # copies stop() gave up waiting for
        self._reading = 0                   # copies reading the PFS now (inside the semaphore)
        # per tier: the files whose path there is too long to serve (None: none), and those refused once
        self._too_long = [too_long_for(self.files, t.data) for t in tiers]
        self._long_refused = [np.zeros(len(self.files), bool) if m is not None else None for m in self._too_long]
        self.policy = policy_factory(self)

    # -- the Placement contract ----------------------------------------------
    @property
    def sizes(self) -> IntColumn:
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
        return (self._where[i] == NOT_PLACED and self._flight[i] < 0 and i not in self._invalid
                and not self._stop.is_set())

    def free(self, tier: int) -> int:
        return self.tiers[tier].free()

    def fastest_with_room(self, i: int) -> int | None:
        need = allocation(int(self._sizes[i]))
        for k, t in enumerate(self.tiers):
            if t.free() >= need:
                return k
        return None

    def place(self, i: int, tier: int) -> bool:
        with self._lock:
            if not self.placeable(i):
                return False
            if (long := self._too_long[tier]) is not None and long[i]:
                self._refuse_long(np.array([i], np.int64), tier)
                return False
            t = self.tiers[tier]
            need = allocation(int(self._sizes[i]))
            if t.free() < need:
                return False
            t.used += need
            self._flight[i] = tier
            self._opens_at[i] = self.index.opens[self.slots[i]]
            self._in_flight += 1
            self._queued[tier].append((i, need))
            self._marks.mark_head(self._queued[tier], tier)
            self._wake_workers(tier, 1)
        return True

    def place_many(self, files: np.ndarray, tier: int) -> np.ndarray:
        """place(i, tier) of each file in order, in one hold of the lock
        (NOTE [batch copy]: a lock per file was the event thread's largest
        cost while prefetching), its checks on arrays: whether each was
        placed.  A file repeated in `files` counts at its first place."""
        ids = np.asarray(files, np.int64)
        placed = np.zeros(len(ids), bool)
        if not len(ids):
            return placed
        needs = allocations(self._sizes_array[ids])
        first = np.zeros(len(ids), bool)
        first[np.unique(ids, return_index=True)[1]] = True
        with self._lock:
            if self._stop.is_set():
                return placed
            t = self.tiers[tier]
            ok = first & (np.frombuffer(self._where, np.int8)[ids] == NOT_PLACED) & (self._flight[ids] < 0)
            if self._invalid:
                ok &= ~np.isin(ids, np.fromiter(self._invalid, np.int64, len(self._invalid)))
            if (long := self._too_long[tier]) is not None and long[ids[ok]].any():
                self._refuse_long(ids[ok & long[ids]], tier)
                ok &= ~long[ids]
            take = np.flatnonzero(ok)
            free = t.free()
            room = np.cumsum(needs[take])
            if len(take) and room[-1] > free:      # the tier fills up: each file that still fits, in order
                fit = int(np.searchsorted(room, free, side="right"))
                left = free - (int(room[fit - 1]) if fit else 0)
                more = []
                for k, need in zip(take[fit:].tolist(), needs[take[fit:]].tolist()):
                    if need <= left:
                        left -= need
                        more.append(k)
                take = np.concatenate([take[:fit], np.array(more, np.int64)])
            taken = ids[take]
            self._flight[taken] = tier
            self._opens_at[taken] = self.index.opens[self.slots[taken]]
            self._in_flight += len(take)
            self._queued[tier].extend(zip(taken.tolist(), needs[take].tolist()))
            self._marks.mark_head(self._queued[tier], tier)
            t.used += int(needs[take].sum())
            self._wake_workers(tier, len(take))
        placed[take] = True
        return placed

    def _refuse_long(self, ids: np.ndarray, tier: int) -> None:
        """Under the lock: copies of files whose path in the tier is too long
        to serve are not made; each counts once as a copy failure."""
        refused = self._long_refused[tier]
        assert refused is not None
        new = ids[~refused[ids]]
        if not len(new):
            return
        refused[new] = True
        t = self.tiers[tier]
        t.failures += len(new)
        self.stats.failed(TOO_LONG, len(new))
        rel = self.files.rel(int(new[0]))
        self.stats.note(f"{self.catalog.source_path(CopyOf.of(self.files, int(new[0])))}: its path in tier "
                        f"{t.name} ({t.data}/{int(self.files.root[int(new[0])])}/{rel[:40]}...) is longer than "
                        f"PATH_MAX ({PATH_MAX} bytes): read from the PFS")

    def _wake_workers(self, tier: int, n: int) -> None:
        """Under the lock: n copies were queued on the tier; its workers are
        woken now, or at the end of the thread's _waking_later block."""
        held = self._held.counts
        if held is not None:
            held[tier] += n
        elif n:
            self._work[tier].notify(n)

    @contextmanager
    def _waking_later(self) -> Iterator[None]:
        """The copies placed by this thread inside the block wake their
        tier's workers once, at its end (NOTE [batch copy]): woken at each
        place, a worker took the one or two copies queued so far."""
        self._held.counts = counts = [0] * len(self.tiers)
        try:
            yield
        finally:
            self._held.counts = None
            if any(counts):
                with self._lock:
                    for tier, n in enumerate(counts):
                        if n:
                            self._work[tier].notify(n)

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
            where = np.frombuffer(self._where, np.int8)
            held = np.flatnonzero(where != NOT_PLACED)     # numpy over the catalog: a new plan adopts them
            placed = list(zip(held.tolist(), where[held].tolist()))
            flying = np.flatnonzero(self._flight >= 0)
            placed += list(zip(flying.tolist(), self._flight[flying].tolist()))
        return iter(placed)

    def copies_in_flight(self) -> int:
        return self._in_flight

    # -- lifecycle ----------------------------------------------------------
    def start_pools(self) -> None:
        """The copy workers (place() needs them); start() makes them if
        they are not there (--warm copies before COMMAND and the event thread start)."""
        if self._workers:
            return
        self._closing = False
        for k, t in enumerate(self.tiers):
            # a copy waits on the PFS most of the time: enough workers that the
            # PFS's concurrency (the semaphore) is what bounds the reads
            for n in range(max(1, t.threads, self.pfs_threads)):
                w = threading.Thread(target=self._worker, args=(k,), name=f"tiering-{t.name}-{n}", daemon=True)
                w.start()
                self._workers.append(w)

    def close_pools(self) -> None:
        """Ends the copy workers (queued copies are cancelled, running ones
        end at their next chunk when stopping) and waits for their threads,
        so that COMMAND is forked from a process without them."""
        with self._lock:
            self._closing = True
            self._cancel_queued()
        for w in self._workers:
            w.join()
        self._reads.close()
        self._workers = []
        self._closing = False

    def start(self) -> None:
        self.start_pools()
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
        with self._lock:  # a place() past its stop check has queued already
            self._stop.set()
            self._stop_flag[0] = 1
            self._cancel_queued()
        self._wake.set()
        if self.peers is not None:
            self.peers.wake()   # copies waiting for the homes
        if self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._cancel_queued()   # placed by the event thread before it saw the stop
            self._quiet.wait_for(lambda: not self._running, max(0.0, deadline - time.monotonic()))
            stuck = self._running
        self._reads.close(wait=not stuck)
        if self._thread is None or not self._thread.is_alive():   # the ring has one reader at a time
            # the rest, in bounded batches: at most a ring's worth (what writers post meanwhile is left)
            for _ in range(int(self.index.header.nevents) // index_mod.BATCH_EVENTS + 1):
                events = self.index.drain_batch(force=True)
                self._guarded(self._handle, events)
                if len(events) < index_mod.BATCH_EVENTS:
                    break
        self.stats.peer = self.peer_report()
        if stuck:
            self.stuck = stuck
            log.warning("%d cop%s still blocked reading the PFS after %.0f s; not waiting for %s",
                        stuck, "y is" if stuck == 1 else "ies are", timeout, "it" if stuck == 1 else "them")
            return False
        return True

    def _cancel_queued(self) -> None:
        """Under the lock: the copies not started are dropped, their room
        released; idle workers wake up to end."""
        for tier, (q, later) in enumerate(zip(self._queued, self._later)):
            self.tiers[tier].used -= sum(reserved for _, reserved in q) + sum(reserved for _, reserved in later)
            ids = [i for i, _ in q] + [i for i, _ in later]
            self._marks.unmark(ids, tier)
            q.clear()
            later.clear()
            self._out_of_flight(ids)   # last, as in _publish
            self._work[tier].notify_all()

    # -- the event thread -------------------------------------------------------
    def _event_loop(self) -> None:
        self.event_nice = raise_priority(EVENT_NICE)
        log.debug("event thread: nice %+d from the process's", -self.event_nice)
        self._guarded(self.policy.start)
        last_tail_move = time.monotonic()
        last_pending = -1
        busy = False
        while True:
            # a turn at most every TICK; the next one comes at IDLE_TICK unless copies landed (or
            # the last turn drained many events): a turn costs the policy's numpy calls whatever
            # its batch (NOTE [event batches])
            if self._stop.wait(TICK):
                return
            if not busy:
                self._wake.wait((self._patient_tick if self.policy.patient() else IDLE_TICK) - TICK)
                if self._stop.is_set():
                    return
            self._wake.clear()
            with self._waking_later():
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
                self._guarded(self._take_homes)
            busy = len(events) >= BUSY_EVENTS

    def _deliver_landed(self) -> None:
        """Tells the policy of the copies that landed."""
        while True:
            try:
                files, tier, published = self._landed.get_nowait()
            except queue.Empty:
                return
            self._guarded(self.policy.on_landed, files, tier, published)

    def _land(self, files: list[int], tier: int, published: list[bool]) -> None:
        """Copies that ended, for the policy; the event thread is woken unless
        the policy is patient (Policy.patient)."""
        self._landed.put((np.asarray(files, np.int64), tier, np.asarray(published, bool)))
        if not self.policy.patient():
            self._wake.set()

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
        on_pfs = opens & (kinds == lib.TIERING_EV_OPEN_PFS)
        from_pfs = files[on_pfs]
        if from_pfs.size:   # observation (snapshot): sizes of the files COMMAND opened on the PFS
            self.stats.job_pfs_bytes += int(self._sizes_array[from_pfs].sum())
        # the opens counted, for opens_seen (one writer: this thread)
        seen, ntiers = self._opens_seen, len(self._opens_seen) - 1
        seen[0] += from_pfs.size
        on_tier = opens & ~on_pfs
        if on_tier.any():
            seen[1:] += np.bincount(events["tier"][on_tier].astype(np.int64), minlength=ntiers)[:ntiers]
        closes = catalogued & (kinds == lib.TIERING_EV_CLOSE)
        tagged = opens & (events["tag"] != 0)
        if tagged.any():
            self._guarded(self.policy.on_tagged, files[tagged], events["tag"][tagged].astype(np.int64),
                          events["pid"][tagged].astype(np.int64))
        start = 0
        for w in [*writes, n]:
            seg = start + np.flatnonzero(opens[start:w])
            if seg.size:
                self._guarded(self.policy.on_opens, files[seg], kinds[seg] == lib.TIERING_EV_OPEN_TIER,
                              events["pid"][seg].astype(np.int64))
            shut = start + np.flatnonzero(closes[start:w])
            if shut.size:
                self._closed(files[shut], events["tier"][shut] != 0, events["bytes"][shut].astype(np.int64))
            if w < n:
                self._invalidate(int(files[w]))
                # the file's other paths: NOTE [alias invalidation] in docs/design.md
                for slot in self.index.aliases(int(slots[w]))[1:]:
                    if self.file_of_slot[slot] >= 0:
                        self._invalidate(int(self.file_of_slot[slot]))
            start = w + 1

    def _closed(self, files: np.ndarray, from_tier: np.ndarray, nbytes: np.ndarray) -> None:
        """Closes of a segment of a batch, after its opens: the bytes read."""
        self._guarded(self.policy.on_closes, files, from_tier, nbytes)

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
                 self.catalog.source_path(CopyOf.of(self.files, i)))

    def _drop_copy(self, i: int, tier: int) -> None:
        """Under the lock: unpublish, then delete, then account."""
        f = CopyOf.of(self.files, i)
        self.index.cas_state(self.slots[i], tier + 1, lib.TIERING_STATE_NONE)
        t = self.tiers[tier]
        t.remove_copy(f)
        allocated = int(self._allocated[i])
        self._allocated[i] = -1
        t.used -= allocated if allocated >= 0 else allocation(f.size)
        t.files -= 1
        t.placed_bytes -= f.size
        self._where[i] = NOT_PLACED

    # -- the copy workers --------------------------------------------------------
    def _worker(self, tier: int) -> None:
        """Copies what is placed on the tier, in order, until stop: a small
        file with the small files queued after it, as many as batch_share
        says (NOTE [batch copy], NOTE [batch share]), a large one alone."""
        queued, later, work = self._queued[tier], self._later[tier], self._work[tier]
        while True:
            with self._lock:
                while not queued and not later and not self._stop.is_set() and not self._closing:
                    self._idle[tier] += 1
                    try:
                        work.wait()
                    finally:
                        self._idle[tier] -= 1
                if self._stop.is_set() or self._closing:
                    return
                q = queued if queued else later
                batch = [q.popleft()]
                if self._batched(batch[0][0]):
                    share = batch_share(len(q) + 1, self._idle[tier], self._waits_known(tier))
                    self._take_strided(q, batch, share, self._idle[tier] + 1 if share <= SHARE_FILES else 1)
                    # its next copies, made within the bound (NOTE [queued copies]); the rest as it goes
                    self._marks.mark_head(batch, tier, QUEUE_BATCH_MARKS)
                else:   # not claimed, so not left marked
                    self._marks.unmark([batch[0][0]], tier)
                self._marks.mark_head(queued, tier)
                self._running += len(batch)
            if len(batch) == 1 and not self._batched(batch[0][0]):
                self._copy_job(batch[0][0], tier, batch[0][1])   # ends _running's count of it
            else:
                self._copy_batch_job(batch, tier)

    def _take_strided(self, q: deque[tuple[int, int]], batch: list[tuple[int, int]], share: int,
                      stride: int) -> None:
        """Under the lock: the batch's small copies after its first, up to
        `share`, every `stride`-th of the queue's run of small copies (the
        others stay queued, in order): the workers that share the queue
        copy its next files side by side, so that the copies' front is the
        queue's head and not one file in each worker's run (NOTE [one read
        per file]: a reader that reaches the front finds its files in flight
        and waits for them instead of reading them itself)."""
        skipped: list[tuple[int, int]] = []
        while q and len(batch) < share and self._batched(q[0][0]):
            for _ in range(stride - 1):
                if not q or not self._batched(q[0][0]):
                    break
                skipped.append(q.popleft())
            else:
                if q and self._batched(q[0][0]):
                    batch.append(q.popleft())
                    continue
            break
        q.extendleft(reversed(skipped))

    def _batched(self, i: int) -> bool:
        """File i is copied in a batch: small, and no peer may serve it."""
        return int(self._sizes_array[i]) < BATCH_BYTES and (
            self.peers is None or not self.peers.may_serve(i, self.policy.next_epoch(i)))

    def _time_copies(self, seconds: float, copies: int) -> None:
        """A part of a batch took `seconds` for `copies` copies: the average
        small copy's time, and from it how long an open waits for a copy in
        flight (NOTE [one read per file]): COPY_WAIT_COPIES times it, within
        COPY_WAIT_MIN..COPY_WAIT_MAX; no wait before a copy was timed."""
        if copies <= 0:
            return
        each = seconds / copies
        self._copy_ns = each if not self._copy_ns else self._copy_ns + COPY_WAIT_WEIGHT * (each - self._copy_ns)
        wait = min(COPY_WAIT_MAX, max(COPY_WAIT_MIN, COPY_WAIT_COPIES * self._copy_ns))
        self.index.set_copy_wait(wait, queue_wait(self._copy_ns, wait) if self._marks.window else 0.0)

    def _count_read(self, n: int) -> None:
        """The bytes a copy read: a small file's are added up in its thread and
        counted with the copy's end (one hold of the lock less per copy); a
        chunked copy's (read by several threads, for minutes) as they come."""
        tally = self._tally
        if tally.small:
            tally.n += n
            return
        with self._lock:
            self.stats.pfs_bytes += n

    def _copy(self, src: str, f: CopySource, t: TierState) -> int | None:
        """One copy, inside the PFS semaphore (tests wrap it)."""
        return copy_file(src, f, t, self._stop, self._count_read, self._reads)

    def _copy_from_pfs(self, src: str, f: CopySource, t: TierState) -> int | None:
        """A copy read from the PFS, inside its semaphore."""
        tally = self._tally
        with self._reads.semaphore:
            with self._lock:
                self.stats.pfs_opens += 1
                self._reading += 1
            tally.small, tally.n = f.size < t.chunked_bytes, 0
            try:
                return self._copy(src, f, t)
            finally:
                tally.small = False
                with self._lock:
                    self._reading -= 1
                    self.stats.pfs_bytes += tally.n

    def _copy_job(self, i: int, tier: int, reserved: int) -> None:
        """One copy: read inside the PFS semaphore, then published and
        accounted (and no longer counted as running) in one hold of the lock."""
        t = self.tiers[tier]
        src = ""
        allocated: int | None = None
        failure: Exception | None = None
        published = False
        try:
            f = CopyOf.of(self.files, i)    # not a CatalogFile: ~7 us less per copy (NOTE [copy in C])
            src = self.catalog.source_path(f)
            allocated = self._from_peer(i, t)
            if allocated is None:
                allocated = self._copy_from_pfs(src, f, t)
        except Exception as e:  # a failed copy only means the PFS serves this file
            failure = e
        finally:
            with self._lock:
                try:
                    published = self._settle(i, tier, reserved, allocated, failure, src)
                finally:
                    self._running -= 1
                    if not self._running:
                        self._quiet.notify_all()
        if isinstance(failure, SourceChanged):
            log.info("%s changed since the scan: not placed", src)
        elif failure is not None:
            log.debug("copy of %s to %s failed: %s", src, t.name, failure)
        self._land([i], tier, [published])

    def _copy_many(self, ids: np.ndarray, t: TierState, done: Callable[[np.ndarray, int], None]) -> None:
        """A batch of small copies, inside the PFS semaphore (tests wrap it);
        each claims its file and publishes it (NOTE [one read per file])."""
        copy_batch(ids, self._batch, t, done, claim=self.tiers.index(t) + 1, opens=self._opens_at[ids])

    def _copy_batch_job(self, batch: list[tuple[int, int]], tier: int) -> None:
        """Small copies in C (NOTE [batch copy]) in one PFS slot; each part
        of the batch the C routine hands back is published and accounted,
        and no longer counted as running, in one hold of the lock."""
        t = self.tiers[tier]
        ids = np.fromiter((i for i, _ in batch), np.int64, len(batch))
        settled = 0

        began = time.monotonic()

        def done(out: np.ndarray, waits: int) -> None:
            nonlocal settled, began
            now = time.monotonic()
            self._time_copies(now - began, int(np.count_nonzero(out["copied"])))
            began = now
            self._settle_batch(batch[settled:settled + len(out)], tier, out, None, waits)
            settled += len(out)
            if settled < len(batch) and self._marks.window:   # the batch's next copies (NOTE [queued copies])
                with self._lock:
                    self._marks.mark_head(batch[settled:], tier, QUEUE_BATCH_MARKS)
        failure: Exception | None = None
        try:
            with self._reads.semaphore:
                with self._lock:
                    self._reading += 1
                try:
                    self._copy_many(ids, t, done)
                finally:
                    with self._lock:
                        self._reading -= 1
        except Exception as e:   # the files not settled read from the PFS
            failure = e
        finally:
            if settled < len(batch):
                self._settle_batch(batch[settled:], tier, None, failure)

    def _defer(self, part: list[tuple[int, int]], tier: int) -> None:
        """Copies of files COMMAND opened since they were queued (their
        claims saw it: NOTE [one read per file]), when the data set fits the
        tiers or the policy places once: not made now, for its read was the file's one read; they stay
        in flight, their room reserved, and are made once the tier's queue is
        empty, for the files' later uses, unless COMMAND opens them again
        first.  (Where it does not fit and the policy plans each use, it is
        told the copy was not made and plans the file's next use itself.)"""
        ids = np.fromiter((i for i, _ in part), np.int64, len(part))
        with self._lock:
            try:
                self._marks.unmark(ids.tolist(), tier)
                self.stats.claims_read += len(part)
                if self._stop.is_set() or self._closing:
                    for i, reserved in part:
                        self._discard(i, self.tiers[tier], reserved, copied=False)
                    return
                self._opens_at[ids] = self.index.opens[self.slots[ids]]
                self._later[tier].extend(part)
                self._work[tier].notify(1)
            finally:
                self._running -= len(part)
                if not self._running:
                    self._quiet.notify_all()

    def _settle_batch(self, part: list[tuple[int, int]], tier: int, out: np.ndarray | None,
                      failure: Exception | None, waits: int = -1) -> None:
        """Settles files of a batch, with their outcomes (None: not copied,
        failed with `failure` when given) in one hold of the lock; logs and
        tells the policy after it.  `waits`: the times their copying thread
        waited (-1: not known), for the tier's average (NOTE [batch share])."""
        noted: list[tuple[str, Exception]] = []
        published: list[bool] = []
        if out is not None and self._batch.claims and (self._fits or self.policy.defers_read_copies) and (
                read := out["status"] == lib.TIERING_COPY_READ).any():
            self._defer([p for p, r in zip(part, read.tolist()) if r], tier)
            part, out = [p for p, r in zip(part, read.tolist()) if not r], out[~read]
            if not part:
                return
        files = [i for i, _ in part]
        stopped = lib.TIERING_COPY_STOPPED
        status = out["status"] if out is not None else np.full(len(part), stopped)
        if out is not None:   # not claimed (NOTE [one read per file]): as if stopped, no failure
            read = status == lib.TIERING_COPY_READ
            status = np.where((status == lib.TIERING_COPY_TAKEN) | read, stopped, status)
        with self._lock:
            try:
                self._marks.unmark(files, tier)   # a mark the claim did not take goes (NOTE [queued copies])
                if out is not None:
                    self._waits[tier] = waits_average(*self._waits[tier], waits, len(part))
                    self.stats.pfs_opens += int(np.count_nonzero(status != stopped))
                    self.stats.claims_read += int(np.count_nonzero(read))
                    self.stats.pfs_bytes += int(out["copied"].sum())
                by_copy = out["published"].astype(bool) if out is not None and self._batch.claims else None
                if out is not None and bool((status == lib.TIERING_COPY_OK).all()) and not self._stop.is_set():
                    published = self._publish(part, tier, out["blocks"].astype(np.int64) * 512, by_copy)
                else:
                    statuses = status.tolist()
                    for k, (i, reserved) in enumerate(part):
                        allocated, error, src = None, failure, ""
                        if by_copy is not None and by_copy[k] and self._stop.is_set():   # published, not kept
                            self.index.cas_state(self.slots[i], tier + 1, lib.TIERING_STATE_NONE)
                        if statuses[k] == lib.TIERING_COPY_OK and out is not None:
                            allocated = int(out["blocks"][k]) * 512
                        elif statuses[k] != stopped and out is not None:
                            src = self.catalog.source_path(CopyOf.of(self.files, i))
                            error = batch_failure(statuses[k], int(out["error"][k]), src)
                        if error is not None:
                            src = src or self.catalog.source_path(CopyOf.of(self.files, i))
                            noted.append((src, error))
                        published.append(self._settle(i, tier, reserved, allocated, error, src,
                                                      None if by_copy is None else by_copy[k:k + 1]))
            finally:
                self._running -= len(files)
                if not self._running:
                    self._quiet.notify_all()
        for src, error in noted:
            if isinstance(error, SourceChanged):
                log.info("%s changed since the scan: not placed", src)
            else:
                log.debug("copy of %s to %s failed: %s", src, self.tiers[tier].name, error)
        self._land(files, tier, published)

    # -- the peer tier (NOTE [node-aware plan]) -----------------------------------
    def _take_homes(self) -> None:
        """Once the homes are known (the nodes met, NOTE [home nodes]), the
        policy keeps this node's home files: once, in the event thread (the
        policy's)."""
        peers = self.peers
        if peers is not None and peers.plans is not None and peers.plans is not self._homes:
            self._homes = peers.plans
            self.policy.pin(peers.plans.pinned())
            from ..clairvoyant.nodes import NodePlans, Relay
            if isinstance(peers.plans, NodePlans):
                from ..cluster.peer import peer_is_faster_each
                asked = peer_is_faster_each(self._sizes_array, peers.network, peers.pfs_bandwidth,
                                            peers.pfs_latency_ms)
                self._relay = Relay(peers.plans, peers.budget, asked)
                peers.served = self._relay.served
                self.policy.relay(self._relay)

    def _from_peer(self, i: int, t: TierState) -> int | None:
        """File i copied from the node whose plan holds it now, put in place like a
        PFS copy (not yet published): the bytes it takes on the tier.  None:
        read the PFS (no node holds it: there are no homes before the nodes
        met, for which a copy that may come from a peer waits a little,
        PeerLinks.await_homes; or counted by reason: the network is not
        faster for this size; the peer tier is closed, "unlinked"; the fetch
        failed)."""
        peers = self.peers
        if peers is None:
            return None
        f = self.files[i]
        from ..cluster.peer import PeerUnavailable, fetch_copy, fetch_deadline, peer_is_faster
        epoch = self.policy.next_epoch(i)
        if not peer_is_faster(f.size, peers.network, peers.pfs_bandwidth, peers.pfs_latency_ms):
            if peers.plans is not None and peers.plans.holder(i, epoch) is not None:
                self._peer_fallback("slower")   # a copy the peer would not serve faster never waits
            return None
        plans = peers.await_homes(i)   # a copy planned before the nodes met, of a file homed elsewhere
        node = plans.holder(i, epoch) if plans is not None else None
        if node is None:
            return None
        client = peers.client(node)
        if client is None:
            self._peer_fallback("unlinked")
            return None
        try:
            allocated = fetch_copy(client, f, t, fetch_deadline(f.size, peers.network), self._stop)
        except PeerUnavailable as e:
            self._peer_fallback(e.reason)
            log.debug("%s from node %d: %s; reading the PFS", f.rel, node, e)
            return None
        except OSError as e:   # the local write: the PFS copy says what is wrong, if it fails too
            self._peer_fallback("error")
            log.debug("%s from node %d: %s; reading the PFS", f.rel, node, e)
            return None
        with self._lock:
            self.stats.peer_fetches += 1
            self.stats.peer_bytes += f.size
        return allocated

    def _peer_fallback(self, reason: str) -> None:
        with self._lock:
            self.stats.peer_fallbacks[reason] = self.stats.peer_fallbacks.get(reason, 0) + 1

    def peer_report(self) -> dict[str, Any] | None:
        """The peer tier for the job's record: this daemon's fetches, bytes and
        fallbacks by reason, and the clients' counters; None without peers."""
        peers = self.peers
        if peers is None:
            return None
        with self._lock:
            st = self.stats
            mine = {"fetches": st.peer_fetches, "bytes": st.peer_bytes, "fallbacks": dict(st.peer_fallbacks)}
        return {**mine, "nodes": peers.nodes, "node_rank": peers.node_rank, "linked": peers.ready.is_set(),
                "planned": peers.plans is not None, "budget": peers.budget, "budgets": peers.budgets,
                "homes": peers.homes, "relay": self._relay.report() if self._relay is not None else None,
                "client": peers.counters.snapshot()}

    # -- settling copies -------------------------------------------------------------
    def _waits_known(self, tier: int) -> float:
        """Under the lock: the tier's average of the times a small copy
        waits, -1 while fewer than WAITS_COPIES copies were measured."""
        average, seen = self._waits[tier]
        return average if seen >= WAITS_COPIES else -1.0

    def _publish(self, part: list[tuple[int, int]], tier: int, allocated: np.ndarray,
                 by_copy: np.ndarray | None = None) -> list[bool]:
        """Under the lock, the daemon not stopping: publishes complete copies
        (file, bytes reserved; `allocated`, each copy's blocks) unless their
        file was written meanwhile, and does the accounting, on arrays (per
        file only the state word's compare-and-swap: NOTE [batch copy]);
        whether each was published.  A copy not published is removed.
        `by_copy`: per file, whether the copy published its state word itself
        (claimed copies, NOTE [one read per file]; None: none did)."""
        t = self.tiers[tier]
        ids = np.fromiter((i for i, _ in part), np.int64, len(part))
        reserved = np.fromiter((r for _, r in part), np.int64, len(part))
        invalid = self._invalid
        try:
            ok = np.zeros(len(ids), bool)
            valid = np.array([i not in invalid for i in ids.tolist()], bool) if invalid else np.ones(len(ids), bool)
            if by_copy is None:
                ok[valid] = self.index.cas_states(self.slots[ids[valid]], lib.TIERING_STATE_NONE, tier + 1)
            else:   # published already: still so unless a write open invalidated it
                ok = by_copy & valid
                if ok.any():
                    ok[ok] = self.index.state_of(self.slots[ids[ok]]) == tier + 1
                if (back := by_copy & ~valid).any():   # invalidated by an event only: unpublished
                    self.index.cas_states(self.slots[ids[back]], tier + 1, lib.TIERING_STATE_NONE)
                # published, maybe served, then written before this accounting: dropped after a write
                self.stats.invalidated += int(np.count_nonzero(by_copy & ~ok))
            done = ids[ok]
            np.frombuffer(self._where, np.int8)[done] = tier
            t.files += len(done)
            t.placed_bytes += int(self._sizes_array[done].sum())
            t.used += int((allocated[ok] - reserved[ok]).sum())
            self._allocated[done] = allocated[ok]
            self.stats.copies += len(done)
            for i, r in zip(ids[~ok].tolist(), reserved[~ok].tolist()):   # written meanwhile: its copy goes
                self._discard(i, t, r, copied=True)
        finally:
            self._out_of_flight(ids)   # last: copies_in_flight() reads it without the lock, its 0 means all settled
        return ok.tolist()

    def _out_of_flight(self, ids: np.ndarray | list[int]) -> None:
        """Under the lock: the files' copies are no longer in flight."""
        gone = self._flight[ids] >= 0
        self._flight[ids] = -1
        self._in_flight -= int(np.count_nonzero(gone))

    def _discard(self, i: int, t: TierState, reserved: int, copied: bool) -> None:
        """Under the lock: a copy that is not published gives its reservation
        back, and its file, when one was made, is removed."""
        try:
            t.used -= reserved
            if copied:
                t.remove_copy(CopyOf.of(self.files, i))
        finally:
            self._out_of_flight([i])   # last, as in _publish

    def _settle(self, i: int, tier: int, reserved: int, allocated: int | None, failure: Exception | None,
                src: str, by_copy: np.ndarray | None = None) -> bool:
        """Under the lock: publishes a complete copy (unless its file was
        written meanwhile or the daemon stops) and does the accounting;
        True when published."""
        t = self.tiers[tier]
        if isinstance(failure, SourceChanged):
            self.stats.changed_sources += 1
        elif failure is not None:
            t.failures += 1
            self.stats.failed(failure_reason(failure))
            self.stats.note(f"{src}: {failure}")
        elif allocated is not None and not self._stop.is_set():
            # the copy is complete under its final name: publish it
            return self._publish([(i, reserved)], tier, np.array([allocated], np.int64), by_copy)[0]
        self._discard(i, t, reserved, copied=allocated is not None)
        return False

    # -- observation (NOTE [status file]) -------------------------------------------
    def opens_seen(self) -> np.ndarray | None:
        """The opens counted from the events drained so far, [from the PFS,
        from tier 0, ...], while the event thread runs and no event was
        lost: what the entries' counters sum to, but for the events still in
        the ring (NOTE [open counters]); None otherwise."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self.index.header.counters.events_dropped:
            return None
        return self._opens_seen.copy()

    def snapshot(self) -> DaemonSnapshot:
        """A consistent copy of the counters and the tiers' fill, for the
        progress display, the status file and the time series (any thread)."""
        with self._lock:
            st = self.stats
            return DaemonSnapshot(
                tiers=[TierFill(t.name, t.capacity, t.used, t.files, t.placed_bytes) for t in self.tiers],
                copies=st.copies, copy_failures=st.copy_failures, evictions=st.evictions,
                in_flight=self._in_flight, reading=self._reading,
                pfs_opens=st.pfs_opens, pfs_bytes=st.pfs_bytes, job_pfs_bytes=st.job_pfs_bytes,
                events=st.events, invalidated=st.invalidated, changed_sources=st.changed_sources)

    # -- reporting -------------------------------------------------------------
    def tier_summary(self) -> list[dict[str, object]]:
        return [{"name": t.name, "kind": t.kind, "path": str(t.root), "capacity": t.capacity,
                 "files": t.files, "bytes": t.placed_bytes, "used": t.used,
                 "copy_failures": t.failures} for t in self.tiers]
