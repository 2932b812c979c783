"""tier-run --warm [PERCENT]: fill the tiers before COMMAND starts, in the
order the training will read (known from --sampler/--order-file) or in
catalog order, up to PERCENT of what fits (NOTE [warm-up]).  Files opened
once at start and memory-mapped (HF datasets' Arrow files, HDF5, LMDB,
.npy) are then served from the tiers from the first read on."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..placement.api import allocations
from ..placement.daemon import Daemon
from .policy import Clairvoyant

IN_FLIGHT = 256       # copies queued at a time
TICK = 0.1            # seconds between looks at the copies (and progress updates)
# NOTE [few large files]: a data set of at most FEW_FILES files whose mean size is at least
# LARGE_MEAN is read as a few large files (opened once, memory-mapped): warmed without --warm
FEW_FILES = 4096
LARGE_MEAN = 32 << 20


def fits_whole(sizes: np.ndarray, capacities: Sequence[int]) -> bool:
    """Whether every file fits a tier of its own choosing, each tier filled
    to the warm-up's budget (Clairvoyant.margin of its capacity): the
    largest files first, each into the first tier with room (a few large
    files: the sum of the capacities is not the test, a file is not split)."""
    room = [int(c * Clairvoyant.margin) for c in capacities]
    for need in np.sort(allocations(np.asarray(sizes, np.int64)))[::-1].tolist():
        k = next((k for k, r in enumerate(room) if r >= need), None)
        if k is None:
            return False
        room[k] -= need
    return True


def few_large_files(sizes: np.ndarray) -> bool:
    """Whether a data set of these file sizes is a few large files (NOTE
    [few large files])."""
    n = len(sizes)
    return 0 < n <= FEW_FILES and int(np.sum(np.asarray(sizes, np.int64))) >= LARGE_MEAN * n


@dataclass
class WarmProgress:
    files: int            # to copy
    bytes: int
    done_files: int       # copied so far
    done_bytes: int
    seconds: float


@dataclass
class WarmResult:
    percent: int
    order: str            # "known order" or "catalog order"
    files: int            # copied
    bytes: int
    planned_files: int    # chosen to copy
    planned_bytes: int
    failed: int           # chosen but not copied (a copy failed, no room left)
    seconds: float
    auto: bool = False    # without --warm: the data set is a few large files (NOTE [few large files])

    def to_json(self) -> dict[str, object]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def warm_files(order: np.ndarray, sizes: np.ndarray, budget: int) -> np.ndarray:
    """The first files of the order (each once) whose allocated bytes add up
    to at most budget."""
    order = np.asarray(order, np.int64)
    _, first = np.unique(order, return_index=True)
    order = order[np.sort(first)]
    return order[np.cumsum(allocations(np.asarray(sizes, np.int64)[order])) <= budget]


def warm_up(daemon: Daemon, order: np.ndarray | None, percent: int,
            progress: Callable[[WarmProgress], None], clock: Callable[[], float] = time.monotonic) -> WarmResult:
    """Copies the chosen files with the daemon's copy workers and waits for
    them; the workers are ended before it returns (COMMAND is forked from a
    process without threads).  A signal (Interrupted) stops the copies."""
    sizes = np.asarray(daemon.sizes, np.int64)
    how = "known order" if order is not None else "catalog order"
    if order is None:
        order = np.arange(len(sizes), dtype=np.int64)
    budget = int(sum(daemon.capacities) * Clairvoyant.margin * percent / 100)
    files = warm_files(order, sizes, budget)
    total = int(sizes[files].sum())
    t0 = clock()
    before = daemon.snapshot()

    def report() -> WarmProgress:
        snap = daemon.snapshot()
        done_bytes = sum(t.bytes for t in snap.tiers) - sum(t.bytes for t in before.tiers)
        return WarmProgress(len(files), total, snap.copies - before.copies, done_bytes, clock() - t0)

    daemon.start_pools()
    try:
        last = clock()
        for i in files.tolist():
            while daemon.copies_in_flight() >= IN_FLIGHT:
                time.sleep(TICK / 10)
                if clock() - last >= TICK:
                    last = clock()
                    progress(report())
            tier = daemon.fastest_with_room(i)
            if tier is not None:
                daemon.place(i, tier)   # else: block rounding left no room for it
        while daemon.copies_in_flight():
            time.sleep(TICK / 10)
            if clock() - last >= TICK:
                last = clock()
                progress(report())
    except Exception:
        daemon.close_pools()   # COMMAND starts with colder tiers; placement goes on once it runs
        raise
    except BaseException:      # a signal: tier-run ends before COMMAND
        daemon.stop(timeout=1.0)   # running copies end at their next chunk
        raise
    daemon.close_pools()
    end = report()
    progress(end)
    return WarmResult(percent, how, end.done_files, end.done_bytes, len(files), total,
                      len(files) - end.done_files, end.seconds)
