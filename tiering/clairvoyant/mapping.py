"""Data-set index -> catalog files, as the order hook reports it
(tiering/hook): read from an attribute of the data set and checked here, or
learnt from the tagged opens of the samples (NOTE [learnt mapping])."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..catalog.model import spans

TAG_BITS = 24                  # the hook's tag: (space << TAG_BITS) | (index + 1)
INDEX_MASK = (1 << TAG_BITS) - 1
MAX_FILES = 8                  # files kept per index (image + mask + json ...), in open order
CHECK = 1024                   # indices checked of a mapping read from an attribute


def occurrences(keys: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """For each position, how many earlier positions hold the same key
    (weights: the sum of their weights instead), as int32."""
    out = np.zeros(len(keys), np.int32)
    if not len(keys):
        return out
    by_key = np.argsort(keys, kind="stable")
    s = keys[by_key]
    w = np.ones(len(s), np.int64) if weights is None else np.asarray(weights, np.int64)[by_key]
    before = np.cumsum(w) - w          # over the earlier positions in key order
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    out[by_key] = before - np.repeat(before[starts], np.diff(np.r_[starts, len(s)]))
    return out


@dataclass
class IndexMap:
    """Each index's catalog ids, in open order (CSR: index k owns
    files[offsets[k]:offsets[k+1]]; none when the two are equal)."""

    offsets: np.ndarray        # int64, length n + 1
    files: np.ndarray          # int64

    @classmethod
    def one_each(cls, ids: np.ndarray) -> IndexMap:
        """One id per index, -1 for none."""
        ids = np.asarray(ids, np.int64)
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(ids >= 0, out=offsets[1:])
        return cls(offsets, ids[ids >= 0])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @cached_property
    def mapped(self) -> int:
        """Indices with at least one file (counted once: the feed asks at every batch)."""
        return int(np.count_nonzero(np.diff(self.offsets)))

    def order(self, indices: np.ndarray) -> np.ndarray:
        """The catalog ids the indices read, in order; unmapped indices and
        indices out of range are skipped."""
        idx = np.asarray(indices, np.int64)
        idx = idx[(idx >= 0) & (idx < len(self))]
        starts = self.offsets[idx]
        counts = self.offsets[idx + 1] - starts
        total = int(counts.sum())
        if total == len(idx):          # one file each: the common case
            return self.files[starts]
        return self.files[spans(starts, counts)]


def check_attribute(ids: np.ndarray) -> str | None:
    """Why a mapping read from an attribute is not used, None when it is:
    on a sample of the indices, every path must be a catalogued file and no
    two indices the same file."""
    n = len(ids)
    if not n:
        return "the attribute is empty"
    sample = ids[np.unique(np.linspace(0, n - 1, min(n, CHECK)).astype(np.int64))]
    missing = int((sample < 0).sum())
    if missing:
        return f"{missing} of {len(sample)} paths checked are not catalogued files under --data"
    if len(np.unique(sample)) != len(sample):
        return "several indices name the same file"
    return None


class Learner:
    """The files each index opened while the hook's tag said that index was
    being fetched: up to MAX_FILES per index, distinct, in open order."""

    def __init__(self, length: int):
        self.length = length
        self.rows = np.full((length, 1), -1, np.int64)
        self.count = np.zeros(length, np.int16)
        self.learnt = 0                 # indices with at least one file
        self.opens = 0                  # tagged catalogued opens seen
        self.epoch: int | None = None   # the epoch (hook numbering) learning started in
        self.loader: int | None = None  # ... and the key of the DataLoader that read it
        self.fetches = 0                # fetches seen (runs of one process's opens under one index)
        self.strays = 0                 # ... that opened none of the index's first file's directory
        self.stray: tuple[int, int, int] | None = None   # (index, its first file, a file of such a fetch)
        self._tails: dict[int, tuple[int, bool, tuple[int, int, int]]] = {}   # pid -> its last run, not judged

    def learn(self, indices: np.ndarray, files: np.ndarray) -> int:
        """Records tagged opens (index, catalog id); the number of new pairs.
        Vectorised: pairs already known cost one comparison; the new ones
        are appended in rounds of distinct indices (a round per file of an
        index new in this batch: image, mask, ...)."""
        ok = (indices >= 0) & (indices < self.length)
        indices, files = indices[ok], files[ok]
        self.opens += len(indices)
        if not len(indices):
            return 0
        new = ~(self.rows[indices] == files[:, None]).any(axis=1)
        indices, files = indices[new], files[new]
        if not len(indices):
            return 0
        # each new pair once (its first occurrence, batch order kept)
        _, first = np.unique(indices * (int(files.max()) + 1) + files, return_index=True)
        keep = np.sort(first)
        indices, files = indices[keep], files[keep]
        # the rank of each pair among the new pairs of its index: rounds of distinct indices
        rank = occurrences(indices)
        added = 0
        for r in range(int(rank.max()) + 1):
            mine = rank == r
            added += self._append(indices[mine], files[mine])
        return added

    def _append(self, indices: np.ndarray, files: np.ndarray) -> int:
        """Appends files[k] to the row of indices[k] (distinct indices), where there is room."""
        c = self.count[indices].astype(np.int64)
        room = c < MAX_FILES
        indices, files, c = indices[room], files[room], c[room]
        if len(c) and c.max() >= self.rows.shape[1]:
            self.rows = np.hstack([self.rows, np.full((self.length, 1), -1, np.int64)])
        self.rows[indices, c] = files
        self.count[indices] += 1
        self.learnt += int((c == 0).sum())
        return len(indices)

    def check_fetches(self, indices: np.ndarray, files: np.ndarray, pids: np.ndarray, dirs: np.ndarray) -> None:
        """Counts the fetches (runs of one process's opens under one index)
        that opened neither the index's first file nor any file of its
        directory: another data set's fetch of the same index, when two data
        sets share the tag space (NOTE [learnt mapping]).  Each process's
        last run of a batch is judged with the next batch, which may go on
        with it (a sample's mask opened after its image was drained)."""
        ok = (indices >= 0) & (indices < self.length)
        indices, files, pids = indices[ok], files[ok], pids[ok]
        if not len(indices):
            return
        by_pid = np.argsort(pids, kind="stable")
        p, ix, f = pids[by_pid], indices[by_pid], files[by_pid]
        starts = np.flatnonzero(np.r_[True, (p[1:] != p[:-1]) | (ix[1:] != ix[:-1])])
        fid = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(p)]))
        first = self.rows[ix, 0]
        home = np.bincount(fid, weights=(f == first) | (dirs[f] == dirs[first])) > 0
        run_pid, run_index = p[starts], ix[starts]
        last = np.r_[run_pid[1:] != run_pid[:-1], True]
        judged = ~last
        for k in np.flatnonzero(np.r_[True, run_pid[1:] != run_pid[:-1]]).tolist():
            tail = self._tails.pop(int(run_pid[k]), None)
            if tail is None:
                continue
            if tail[0] == int(run_index[k]):
                home[k] |= tail[1]                       # the same fetch, drained in two parts
            else:
                self._judge(np.array([tail[1]]), [tail[2]])
        for k in np.flatnonzero(last).tolist():
            self._tails[int(run_pid[k])] = (int(run_index[k]), bool(home[k]), (int(run_index[k]),
                                            int(first[starts[k]]), int(f[starts[k]])))
        self._judge(home[judged], [(int(run_index[k]), int(first[starts[k]]), int(f[starts[k]]))
                                   for k in np.flatnonzero(judged & ~home).tolist()])

    def _judge(self, home: np.ndarray, strays: list[tuple[int, int, int]]) -> None:
        self.fetches += len(home)
        self.strays += int((~home).sum())
        if strays:
            self.stray = strays[0]

    def mixed(self) -> bool:
        """Whether the fetches say that two data sets share the space: many
        of them, and a quarter, opened another directory than the first
        file's (a sample's files split over two drained batches are few)."""
        return self.strays >= 16 and self.strays >= 0.25 * self.fetches

    def index_map(self) -> IndexMap:
        offsets = np.zeros(self.length + 1, np.int64)
        np.cumsum(self.count, out=offsets[1:])
        return IndexMap(offsets, self.rows[self.rows >= 0])


def split_tags(tags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(space, index) of each tag; index -1 for an untagged open."""
    tags = np.asarray(tags, np.int64)
    return tags >> TAG_BITS, (tags & INDEX_MASK) - 1
