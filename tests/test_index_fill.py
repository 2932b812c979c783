"""The index's fill (tiering_index_fill) on more paths than its lookahead:
every path in the slot its fingerprint gives, its record and size, the
rings of paths that share an identity, and a duplicate path anywhere named
(NOTE [index fill] in docs/design.md)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from helpers import private_dir
from tiering.placement.index import Root, SharedIndex, fingerprint

N = 5000


def names(n: int) -> list[str]:
    # paths of unlike lengths (the fingerprint reads 8 bytes at a time)
    return [f"c{k % 37}/{'x' * (k % 11)}{k}.jpg" for k in range(n)]


def identities(n: int) -> tuple[np.ndarray, np.ndarray]:
    """dev, ino of each path: the first 900 in threes (one file, three
    paths), every 50th unknown (ino 0: in no ring), the rest one each;
    two devices with the same inode numbers."""
    ino = np.arange(n, dtype=np.int64) + 10
    triples = min(900, n - n % 3)
    ino[:triples] = np.arange(triples) // 3 + 10
    dev = np.where(np.arange(n) % 2 == 0, 7, 8).astype(np.int64)
    dev[:triples] = 7
    ino[1000::50] = 0
    return dev, ino


def make(tmp_path: Path, rels: list[str], roots: list[int]) -> tuple[SharedIndex, np.ndarray]:
    dev, ino = identities(len(rels))
    run = private_dir(tmp_path / "run")
    return SharedIndex.create(run / "index", [Root(str(tmp_path / "a"), 0), Root(str(tmp_path / "b"), 1)],
                              [str(tmp_path)], rels, roots, np.arange(len(rels)) * 3 + 1,
                              np.arange(len(rels)), devs=dev, inos=ino, links=[False] * len(rels))


def test_every_path_lands_in_its_slot_with_its_record(tmp_path: Path) -> None:
    rels = names(N)
    roots = [k % 2 for k in range(N)]
    index, slots = make(tmp_path, rels, roots)
    assert len(set(slots.tolist())) == N
    mask = int(index.header.nslots) - 1
    assert int(index.header.nentries) == N
    for k in range(N):
        e = index.entry(int(slots[k]))
        lo, hi = fingerprint(roots[k], rels[k])
        assert (int(e.fp_lo), int(e.fp_hi)) == (lo, hi)
        assert int(e.file) == k and int(e.root) == roots[k] and int(e.size) == 3 * k + 1
        # linear probing from the fingerprint's slot, with no empty slot between
        s = lo & mask
        while s != int(slots[k]):
            assert int(index.entry(s).fp_lo) or int(index.entry(s).fp_hi)
            s = (s + 1) & mask
    index.close()


def test_paths_of_one_identity_share_a_ring(tmp_path: Path) -> None:
    rels = names(N)
    index, slots = make(tmp_path, rels, [0] * N)
    dev, ino = identities(N)
    for k in range(N):
        ring = sorted(index.aliases(int(slots[k])))
        if ino[k] == 0:
            expected = [int(slots[k])]
        else:
            expected = sorted(int(slots[j]) for j in np.flatnonzero((ino == ino[k]) & (dev == dev[k])))
        assert ring == expected, k
    assert sum(len(index.aliases(int(slots[k]))) == 3 for k in range(N)) == 900
    index.close()


@pytest.mark.parametrize("at", [1, 15, 16, 17, 2500, N - 1])
def test_a_path_given_twice_is_named(tmp_path: Path, at: int) -> None:
    rels = names(N)
    rels[at] = rels[at // 2]
    with pytest.raises(ValueError, match=re.escape(f"duplicate catalog path: {rels[at]!r}")):
        make(tmp_path, rels, [0] * N)


def test_the_same_relative_path_under_two_roots_is_two_entries(tmp_path: Path) -> None:
    rels = names(40) * 2
    index, slots = make(tmp_path, rels, [0] * 40 + [1] * 40)
    assert len(set(slots.tolist())) == 80
    index.close()
