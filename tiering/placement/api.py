"""The contract between the placement daemon and its policies.

A policy decides which file goes to which tier and when; the daemon owns the
tiers, the copies, the accounting and the shared index.  A policy sees the
daemon only through `Placement` and is called only from the daemon's event
thread (NOTE [one policy thread] in docs/design.md): no policy takes a lock
or touches daemon state, and every hook sees a consistent picture.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..catalog.model import IntColumn

BLOCK = 4096
NOT_PLACED = -1


def allocation(size: int) -> int:
    """Bytes a file of this size is expected to take on a tier (whole 4 KiB
    blocks, at least one): the one block rule of the daemon and the planner."""
    return max(BLOCK, int(size + BLOCK - 1) // BLOCK * BLOCK)


def allocations(sizes: np.ndarray) -> np.ndarray:
    """allocation() of each size (int64 array)."""
    return np.maximum(BLOCK, (sizes + BLOCK - 1) // BLOCK * BLOCK)


def data_fits(sizes: np.ndarray, capacities: Iterable[int]) -> bool:
    """Whether files of these sizes, allocated whole, fit the capacities'
    sum (the data set fits the tiers: NOTE [one read per file], NOTE
    [queued copies], NOTE [staging while waiting])."""
    return int(allocations(sizes).sum()) <= sum(capacities)


class Placement(Protocol):
    """What a policy may ask of the daemon and tell it to do."""

    @property
    def sizes(self) -> IntColumn:
        """Catalogued size of every file, by catalog id."""
        ...

    @property
    def capacities(self) -> Sequence[int]:
        """Capacity of each tier in bytes, fastest first."""
        ...

    @property
    def stopping(self) -> bool: ...

    def where(self, i: int) -> int:
        """The tier holding a published copy of file i, or NOT_PLACED."""
        ...

    def placeable(self, i: int) -> bool:
        """True when file i has no copy, none in flight, and was not written
        during the job (invalidated files are never placed again)."""
        ...

    def free(self, tier: int) -> int:
        """Bytes of the tier not taken by copies or reservations."""
        ...

    def fastest_with_room(self, i: int) -> int | None: ...

    def place(self, i: int, tier: int) -> bool:
        """Reserves room and queues a copy of file i; False if it cannot
        (not placeable, no room, stopping).  on_placed or on_failed follows."""
        ...

    def place_many(self, files: np.ndarray, tier: int) -> np.ndarray:
        """place(i, tier) of each file in order: whether each was placed."""
        ...

    def evict(self, i: int) -> bool:
        """Unpublishes and deletes the copy of file i; False if there is none
        (a copy still in flight is not evicted: on_placed tells when it lands)."""
        ...

    def placements(self) -> Iterator[tuple[int, int]]:
        """(file, tier) of every published copy and every copy in flight."""
        ...

    def copies_in_flight(self) -> int: ...


class Policy:
    """Base class: every hook does nothing."""

    name = "base"
    # a copy not made because COMMAND opened its file first (NOTE [one read per file]) is made later,
    # for the file's later uses, by the daemon: the policies that place once; a policy that plans
    # each use (clairvoyant) says False and hears the copy was not made, unless the data set fits
    defers_read_copies = True

    def __init__(self, placement: Placement):
        self.placement = placement

    def start(self) -> None:
        """Called once, before any other hook."""

    def poll(self) -> None:
        """Called before each batch of events (about every 5 ms)."""

    def pin(self, pinned: np.ndarray) -> None:
        """From now on keep these files (a bool per file) once placed: this
        node's home files in a multi-node job, NOTE [home nodes]."""

    def relay(self, relay: Any) -> None:
        """A multi-node job's relay rule from now on (clairvoyant/nodes.Relay,
        NOTE [relay]): at each of its turns the policy tells it what was read
        and pins and unpins what it says.  The event thread's."""

    def next_epoch(self, i: int) -> int | None:
        """The epoch of the next planned read of file i (any thread), None when not known."""
        return None

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        """File i was opened by process pid of the job, from a tier or from the PFS."""

    def on_opens(self, files: np.ndarray, from_tier: np.ndarray, pids: np.ndarray) -> None:
        """A batch of opens in the order they happened (catalog ids, bools,
        pids; NOTE [event batches]): on_open for each unless overridden."""
        for i, t, pid in zip(files.tolist(), from_tier.tolist(), pids.tolist()):
            self.on_open(i, bool(t), pid)

    def on_closes(self, files: np.ndarray, from_tier: np.ndarray, nbytes: np.ndarray) -> None:
        """A batch of closes of descriptors of catalogued files (catalog ids,
        opened on a tier or not, bytes read through each: NOTE [read
        counters]), after the batch's opens."""

    def on_tagged(self, files: np.ndarray, tags: np.ndarray, pids: np.ndarray | None = None) -> None:
        """The opens of a batch made under a thread tag (NOTE [open tags]):
        catalog ids, tags and pids, in order; called before on_opens of the batch."""

    def on_placed(self, i: int, tier: int) -> None:
        """A copy of file i was published on tier."""

    def on_failed(self, i: int) -> None:
        """A queued copy of file i was not published (failure, change, stop, write)."""

    def patient(self) -> bool:
        """Whether the policy's next turn can wait (any thread asks; NOTE
        [event batches]): its copies are far enough ahead of the reader that
        a landing need not wake the event thread and a turn comes every
        PATIENT_TICK (not IDLE_TICK) when few events arrive."""
        return False

    def on_landed(self, files: np.ndarray, tier: int, published: np.ndarray) -> None:
        """Copies onto tier that ended together, in order (catalog ids, each
        at most once: a file is queued once until its copy ends, and whether
        each was published): on_placed or on_failed for each unless
        overridden (NOTE [batch copy])."""
        for i, ok in zip(files.tolist(), published.tolist()):
            if ok:
                self.on_placed(i, tier)
            else:
                self.on_failed(i)

    def report(self) -> dict[str, Any]:
        """Policy-specific statistics for the summary."""
        return {}
