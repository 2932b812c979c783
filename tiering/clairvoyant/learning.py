"""The epoch being read while the index -> file mapping is still learnt
(NOTE [learnt mapping], "The epoch being learnt"): its index stream, which
of its positions have been read (from the tagged opens), and, as indices
become known, the positions ahead of the reader that can now be planned.

Memory: the epoch's indices (int64) and each position's occurrence number
(int32) per position, and the next epoch's indices (int64) when the hook
predicted them; per index its occurrences, those read and whether it was
known when last planned: 12 bytes a position (20 with the next epoch's)
and 9 an index.  Work: numpy per
drained batch over its tagged opens; numpy over the epoch only when enough
new indices were learnt to be worth a new plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .mapping import Learner, occurrences


@dataclass
class LiveEpoch:
    """One loader's epoch (hook numbering) in read order, as sample indices."""

    loader: int
    epoch: int
    space: int
    indices: np.ndarray                 # the epoch's index stream (the node's ranks interleaved)
    next: np.ndarray | None             # the next epoch's, when the hook predicted it
    length: int                         # indices of the data set
    occ: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)   # per index: its occurrences in the epoch
    taken: np.ndarray = field(init=False)    # per index: occurrences read so far
    known: np.ndarray = field(init=False)    # per index: mapped when the epoch was last planned
    marked: int = 0                          # indices learnt when the epoch was last planned
    gain: int = 0       # positions not read yet whose index is mapped now and was not then (kept as it changes)

    def __post_init__(self) -> None:
        ok = (self.indices >= 0) & (self.indices < self.length)
        self.indices = np.asarray(self.indices[ok], np.int64)
        self.occ = occurrences(self.indices)
        self.counts = np.bincount(self.indices, minlength=self.length).astype(np.int32)
        self.taken = np.zeros(self.length, np.int32)
        self.known = np.zeros(self.length, bool)

    def start(self, learner: Learner) -> None:
        """The epoch begins with what the learner knows now (none of it planned here)."""
        self.marked = learner.learnt
        self.gain = int(self.counts[learner.count > 0].sum())

    def learn(self, learner: Learner, indices: np.ndarray, files: np.ndarray) -> None:
        """learner.learn() of a batch's tagged opens of this space; the
        positions of the indices it mapped first add to gain (none of them
        was read: a read is a fetch, an open of the index's mapped first file)."""
        ok = (indices >= 0) & (indices < self.length)
        fresh = np.unique(indices[ok])
        fresh = fresh[learner.count[fresh] == 0]
        learner.learn(indices, files)
        fresh = fresh[learner.count[fresh] > 0]
        self.gain += int(self.counts[fresh].sum())

    def read(self, indices: np.ndarray, files: np.ndarray, tags: np.ndarray, learner: Learner) -> np.ndarray:
        """Counts the fetches among a batch's tagged opens of this space (an
        open of an index's first file, not the same open again at once: a
        sample that opens its file twice) and says which opens were of this
        epoch: those of an index whose occurrences in it were not all read
        before (the others were of the next epoch, read before its order
        came in)."""
        inside = np.ones(len(indices), bool)
        ok = (indices >= 0) & (indices < self.length)
        indices, files, tags = indices[ok], files[ok], tags[ok]
        if not len(indices):
            return inside
        first = learner.rows[indices, 0] == files
        fetch = first & ~np.r_[False, (tags[1:] == tags[:-1]) & (files[1:] == files[:-1])]
        # the fetches of the same index up to each open, this batch's included
        nth = occurrences(indices, fetch) + fetch
        this = self.taken[indices] + nth <= self.counts[indices]
        inside[np.flatnonzero(ok)] = this
        # a fetch maps its index (its first file): a position read that gain counted
        self.gain -= int(np.count_nonzero(this & fetch & ~self.known[indices]))
        np.add.at(self.taken, indices[fetch], 1)
        return inside

    def due(self, learner: Learner, share: float, least: int) -> bool:
        """Whether enough indices were learnt since the last plan to look again."""
        grown = learner.learnt - self.marked
        return grown >= least and learner.learnt >= self.marked * (1 + share)

    def upcoming(self, learner: Learner) -> np.ndarray:
        """The indices of the positions not read yet whose index is known now."""
        idx = self.indices
        return idx[(learner.count > 0)[idx] & (self.occ >= self.taken[idx])]

    def planned(self, learner: Learner) -> None:
        """The epoch was planned with what the learner knows now."""
        self.known = learner.count > 0
        self.marked = learner.learnt
        self.gain = 0
