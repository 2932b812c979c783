"""A set of integers in [0, size) that finds its largest and smallest member
in a few steps, kept in numpy arrays: a 64-ary tree of bit words (NOTE
[planner arrays] in docs/design.md).

Level 0 has one bit per possible member; a bit of level k+1 says whether
the word below it is non-zero.  A million members take 16 KiB per level 0
word array and four levels.  Single members are added and removed through
memoryviews (Python ints, no numpy scalar per step); many at once with numpy.
"""
from __future__ import annotations

import numpy as np

_BIT = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))


def distinct_small(values: np.ndarray, bound: int) -> np.ndarray:
    """np.unique of values known to lie in 0..bound-1, through a mask of
    that size instead of a hash table or a sort (the words of a level, the
    tiers or numbers of uses of a set of files)."""
    seen = np.zeros(bound, bool)
    seen[values] = True
    return np.flatnonzero(seen)


class BitSet:
    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._levels: list[np.ndarray] = []
        n = self.size
        while True:
            words = -(-n // 64)
            self._levels.append(np.zeros(-(-words // 64) * 64, np.uint64))  # whole parent words
            if words == 1:
                break
            n = words
        self._mv = [a.data.cast("B").cast("Q") for a in self._levels]
        self._top = self._mv[-1]
        self._down = self._mv[-2::-1]

    def __contains__(self, i: int) -> bool:
        return bool(self._mv[0][i >> 6] >> (i & 63) & 1)

    def __bool__(self) -> bool:
        return bool(self._top[0])

    def add(self, i: int) -> None:
        for mv in self._mv:
            w = i >> 6
            old = mv[w]
            mv[w] = old | (1 << (i & 63))
            if old:
                return
            i = w

    def discard(self, i: int) -> None:
        for mv in self._mv:
            w = i >> 6
            new = mv[w] & ~(1 << (i & 63))
            mv[w] = new
            if new:
                return
            i = w

    def max(self) -> int:
        """The largest member, -1 when empty."""
        top = self._top[0]
        if not top:
            return -1
        i = top.bit_length() - 1
        for mv in self._down:
            i = (i << 6) | (mv[i].bit_length() - 1)
        return i

    def min(self) -> int:
        """The smallest member, -1 when empty."""
        top = self._top[0]
        if not top:
            return -1
        i = (top & -top).bit_length() - 1
        for mv in self._down:
            w = mv[i]
            i = (i << 6) | ((w & -w).bit_length() - 1)
        return i

    def add_many(self, members: np.ndarray) -> None:
        self._update(np.asarray(members, np.int64), True)

    def discard_many(self, members: np.ndarray) -> None:
        self._update(np.asarray(members, np.int64), False)

    def _update(self, idx: np.ndarray, on: bool) -> None:
        if idx.size == 0:
            return
        if idx.size > len(self._levels[0]):   # many: cheaper to rebuild level 0 from a bitmap
            bits = self.members_mask()
            bits[idx] = on
            self._levels[0][:] = 0
            packed = np.packbits(bits, bitorder="little")
            self._levels[0].view(np.uint8)[:len(packed)] = packed
            self._refresh(None)
            return
        words = idx >> 6
        if on:
            np.bitwise_or.at(self._levels[0], words, _BIT[idx & 63])
        else:
            np.bitwise_and.at(self._levels[0], words, ~_BIT[idx & 63])
        self._refresh(distinct_small(words, len(self._levels[0])))

    def _refresh(self, changed: np.ndarray | None) -> None:
        """Recomputes the upper levels over the changed words (all when None)."""
        for k in range(1, len(self._levels)):
            blocks = self._levels[k - 1].reshape(-1, 64)
            if changed is None:
                parents = np.arange(len(blocks))
            else:
                parents = distinct_small(changed >> 6, len(blocks))
            words = np.packbits(blocks[parents] != 0, axis=1, bitorder="little").view(np.uint64).ravel()
            self._levels[k][parents] = words
            if changed is not None:
                changed = parents

    def members_mask(self) -> np.ndarray:
        """One bool per possible member."""
        return np.unpackbits(self._levels[0].view(np.uint8), bitorder="little")[:self.size].astype(bool)

    def members(self) -> np.ndarray:
        return np.flatnonzero(self.members_mask())
