"""The copies next in a tier's queue, marked on their entries' state words so
that a read-only open of one waits for its copy instead of reading the file
itself (NOTE [queued copies] in docs/design.md).

The daemon holds one `QueueMarks` and calls it under its lock: `mark_head`
after copies are queued or taken, `unmark` when a batch's files leave the
queue (the claim took the mark, or the copy was not made), `unmark` of the
queue's files when it is cancelled.  Only the first `window` files of a
queue, and of a batch taken from it the next QUEUE_BATCH_MARKS copies, are
marked: a file deep in the queue, or in a batch its worker makes one after
the other, is not made soon, and an open that waited for it would only be
slower."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice

import numpy as np

from .index import SharedIndex, lib

QUEUE_WINDOW_ROUNDS = 4   # files marked per PFS slot: the copies of this many rounds of the workers
QUEUE_WAIT_COPIES = 2.0   # an open waits for a queued copy at most this many small copies' time,
QUEUE_WAIT_MAX = 0.25     # ... and at most this long (seconds)
QUEUE_BATCH_MARKS = int(QUEUE_WAIT_COPIES)  # of a worker's batch, the next this many copies are
                                           # marked: it makes them one after the other


def queue_wait(copy_seconds: float, copy_wait: float) -> float:
    """How long an open waits for a queued copy: QUEUE_WAIT_COPIES small
    copies' time (the queue's window and a worker's next marked copies are
    made within a few of them), at most QUEUE_WAIT_MAX and never less than the wait
    for a copy in flight, `copy_wait`."""
    return max(copy_wait, min(QUEUE_WAIT_MAX, QUEUE_WAIT_COPIES * copy_seconds))


class QueueMarks:
    """Per file, whether its state word is QUEUED by this daemon; the
    marking and unmarking of runs of files on the index."""

    def __init__(self, index: SharedIndex, slots: np.ndarray, nfiles: int, window: int,
                 markable: Callable[[int], bool]) -> None:
        self.index = index
        self.slots = slots
        self.window = window
        self.markable = markable     # a file whose copy claims it (small, copied in a batch)
        self.marked = np.zeros(nfiles, bool)
        self.count = 0               # marks set over the job (for the report)

    def mark_head(self, q: deque[tuple[int, int]] | list[tuple[int, int]], tier: int, first: int | None = None) -> None:
        """The first `first` (default: `window`) files of tier's queue, or of
        a batch a worker took from it, not marked yet get QUEUED | (tier + 1)
        where their state is NONE."""
        if not q or self.window <= 0:
            return
        ids = np.fromiter((i for i, _ in islice(q, self.window if first is None else first)), np.int64)
        ids = ids[~self.marked[ids]]
        ids = ids[[self.markable(i) for i in ids.tolist()]] if len(ids) else ids
        if not len(ids):
            return
        swapped = self.index.cas_states(self.slots[ids], lib.TIERING_STATE_NONE, lib.TIERING_STATE_QUEUED | (tier + 1))
        self.marked[ids[swapped]] = True
        self.count += int(np.count_nonzero(swapped))

    def unmark(self, files: Iterable[int], tier: int) -> None:
        """Files that left the queue: a mark the claim did not take goes
        back to NONE (waking the opens that wait on it)."""
        ids = np.fromiter(files, np.int64)
        ids = ids[self.marked[ids]] if len(ids) else ids
        if len(ids):
            self.marked[ids] = False
            self.index.cas_states(self.slots[ids], lib.TIERING_STATE_QUEUED | (tier + 1), lib.TIERING_STATE_NONE)
