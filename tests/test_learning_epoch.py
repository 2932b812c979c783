"""The clairvoyant policy over a mapping learnt from tagged opens, driven
step by step against a fake daemon (NOTE [learnt mapping]): the order in
which the daemon reads the hook's messages and drains the opens is forced,
so each interleaving a loaded machine can produce is checked on counts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import PlaceEach, make_data
from tiering.catalog import scan
from tiering.clairvoyant.feeds import HookFeed
from tiering.clairvoyant.mapping import TAG_BITS
from tiering.clairvoyant.policy import Clairvoyant

SPACE = 9
PID = 4242


class Daemon(PlaceEach):
    """The daemon's side of placement: copies queue and land when told,
    evictions and copies are counted, a tier holds `capacity` bytes."""

    def __init__(self, files: int, capacity: int = 1 << 30):
        self.sizes = [4096] * files
        self.capacities = [capacity]
        self.stopping = False
        self.resident: dict[int, int] = {}
        self.pending: dict[int, int] = {}
        self.copies = 0
        self.evictions = 0
        self.policy: Clairvoyant | None = None

    def used(self) -> int:
        return 4096 * (len(self.resident) + len(self.pending))

    def where(self, i: int) -> int:
        return self.resident.get(i, -1)

    def placeable(self, i: int) -> bool:
        return i not in self.resident and i not in self.pending

    def free(self, tier: int) -> int:
        return self.capacities[tier] - self.used()

    def fastest_with_room(self, i: int) -> int | None:
        return 0 if self.free(0) >= 4096 else None

    def place(self, i: int, tier: int) -> bool:
        if not self.placeable(i) or self.free(tier) < 4096:
            return False
        self.pending[i] = tier
        self.copies += 1
        return True

    def evict(self, i: int) -> bool:
        if i not in self.resident:
            return False
        del self.resident[i]
        self.evictions += 1
        return True

    def placements(self):
        return iter([*self.resident.items(), *self.pending.items()])

    def copies_in_flight(self) -> int:
        return len(self.pending)

    def land(self) -> None:
        """Every queued copy lands (on_placed, as the event thread delivers them)."""
        while self.pending:
            i, t = next(iter(self.pending.items()))
            del self.pending[i]
            self.resident[i] = t
            assert self.policy is not None
            self.policy.on_placed(i, t)


class Job:
    """A learnt data set of n indices, index i reading file i, followed by
    the policy over a fake daemon; the hook's messages and the opens are
    delivered in the order a test chooses."""

    def __init__(self, tmp: Path, n: int, capacity: int = 1 << 30):
        root = tmp / "data"
        make_data(root, {f"f{i:04d}.bin": 10 for i in range(n)})
        cat = scan([str(root)])
        ids = {f.rel: k for k, f in enumerate(cat.files)}
        self.file = np.array([ids[f"f{i:04d}.bin"] for i in range(n)], np.int64)
        self.dir = tmp / "orders"
        self.dir.mkdir()
        self.feed = HookFeed(self.dir, cat)
        self.daemon = Daemon(n, capacity)
        self.policy = Clairvoyant(self.daemon, self.feed)  # type: ignore[arg-type]
        self.daemon.policy = self.policy
        self.n = n
        self.seq = 0
        self.from_tiers = 0
        self.message({"kind": "dataset", "loader": 0, "paths": None, "how": None, "why": "no attribute",
                      "learn": {"space": SPACE, "length": n}})

    def message(self, msg: dict) -> None:
        (self.dir / f"{self.seq:06d}.json").write_text(json.dumps(msg))
        self.seq += 1

    def epoch(self, epoch: int, indices: np.ndarray, nxt: np.ndarray | None) -> None:
        self.message({"kind": "epoch", "loader": 0, "epoch": epoch, "indices": indices.tolist(),
                      "next": None if nxt is None else nxt.tolist()})

    def drain(self, indices: np.ndarray) -> None:
        """One drained batch: the opens of these indices, tagged, in order."""
        files = self.file[indices]
        from_tier = np.array([self.daemon.where(int(f)) >= 0 for f in files], bool)
        self.from_tiers += int(from_tier.sum())
        self.policy.on_tagged(files, (SPACE << TAG_BITS) | (indices + 1))
        self.policy.on_opens(files, from_tier, np.full(len(files), PID, np.int64))

    def poll(self) -> None:
        self.policy.poll()


def orders(n: int, epochs: int, seed: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(epochs)]


def learning_epoch_read(tmp: Path, n: int, upto: int) -> tuple[Job, list[np.ndarray]]:
    """A job whose learning epoch 0 (order e0, next e1) was read up to
    position upto, its copies landed; and the orders of epochs 0 to 2."""
    job = Job(tmp, n)
    e0, e1, e2 = order = orders(n, 3)
    job.epoch(0, e0, e1)
    job.poll()
    job.drain(e0[:upto])
    job.daemon.land()
    return job, order


@pytest.mark.parametrize("interleaving", ["in order", "last opens after the message",
                                          "first opens before the message", "one late batch"])
def test_a_data_set_that_fits_is_read_from_the_tiers_from_the_epoch_after_the_learning_one(tmp_path, interleaving):
    """Epoch 0 learns the mapping; first touch copies every file.  However
    the daemon interleaves reading epoch 1's order with draining the opens
    around it, epoch 1 keeps those copies (no eviction, no copy made again)
    and its reads are followed."""
    n = 80
    job, (e0, e1, e2) = learning_epoch_read(tmp_path, n, 70)
    if interleaving == "in order":
        job.drain(e0[70:])
        job.daemon.land()
        job.epoch(1, e1, e2)
        job.poll()
        job.drain(e1[:40])
    elif interleaving == "last opens after the message":
        job.epoch(1, e1, e2)
        job.poll()                  # epoch 1's order is read before epoch 0's last opens are drained
        job.drain(e0[70:])
        job.daemon.land()
        job.drain(e1[:40])
    elif interleaving == "first opens before the message":
        job.drain(e0[70:])
        job.daemon.land()
        job.epoch(1, e1, e2)
        job.drain(e1[:40])          # a fast reader: drained before the order is read
        job.poll()
    else:
        job.epoch(1, e1, e2)
        job.poll()
        job.drain(np.r_[e0[70:], e1[:40]])   # a slow drain: both epochs' opens in one batch
        job.daemon.land()
    before = job.from_tiers
    job.poll()
    job.drain(e1[40:])
    job.poll()
    job.daemon.land()
    r = job.policy.report()
    assert job.daemon.evictions == 0 and job.daemon.copies == n, r
    if interleaving != "one late batch":
        assert job.from_tiers - before == 40            # epoch 1's last 40 reads, from the tiers
    assert r["following"] and not r["diverged"], r
    # every open of epoch 1 matched its position (the early ones included)
    assert r["matched_opens"] == n, r
    assert r["unmatched_opens"] == 0, r


def replacement_epoch(n: int, seed: int) -> np.ndarray:
    import torch
    from torch.utils.data import RandomSampler
    g = torch.Generator().manual_seed(seed)
    return np.array(list(RandomSampler(range(n), replacement=True, generator=g)), np.int64)


def read_learning_epoch(job: Job, order: np.ndarray, batch: int, between=None) -> tuple[int, int]:
    """Reads the learning epoch a batch at a time (the daemon lands its
    copies between batches; between(k) runs before the batch at k):
    (repeated reads of an index first read in an earlier batch, how many of
    them the tiers served)."""
    first: dict[int, int] = {}
    repeats = served = 0
    for k in range(0, len(order), batch):
        if between is not None:
            between(k)
        part = order[k:k + batch]
        for i in part.tolist():
            if first.setdefault(i, k) < k:
                repeats += 1
                served += job.daemon.where(int(job.file[i])) >= 0
        job.drain(part)
        job.poll()
        job.daemon.land()
    return repeats, served


def validation_at(job: Job, at: int):
    """A validation loader over another data set (another tag space) that
    announces its epoch before the batch at position `at`."""
    def between(k: int) -> None:
        if k == at:
            job.message({"kind": "dataset", "loader": 1, "paths": None, "how": None, "why": "-",
                         "learn": {"space": SPACE + 1, "length": 50}})
            job.message({"kind": "epoch", "loader": 1, "epoch": 0, "indices": list(range(50)), "next": None})
            job.poll()
    return between


@pytest.mark.parametrize("plan,validation", [(True, False), (False, False), (True, True)])
def test_indices_read_again_in_the_learning_epoch_are_prefetched_when_the_data_set_does_not_fit(tmp_path, plan,
                                                                                                 validation):
    """A sampler with replacement reads some indices twice in the epoch
    that learns the mapping.  Once an index is learnt, its later positions
    in that epoch are planned: prefetched ahead of the reader, evicting
    copies with no further use, so the second reads come from the tiers
    although the tiers hold a fifth of the data set.  First touch alone
    (no plan) serves only the repeats of the files it copied first."""
    n, cap = 200, 40
    job = Job(tmp_path, n, capacity=cap * 4096)
    if not plan:
        job.policy.least = n + 1          # never planned again: first touch, as without the feature
    e0, e1 = replacement_epoch(n, 3), replacement_epoch(n, 4)
    job.epoch(0, e0, e1)
    job.poll()
    # (validation: another data set's loader announces an epoch meanwhile; the training's is still planned)
    repeats, served = read_learning_epoch(job, e0, batch=8, between=validation_at(job, 96) if validation else None)
    r = job.policy.report()
    assert repeats == 79                   # of 200 reads of 121 distinct indices (seed 3)
    if plan:
        # planned each time the indices learnt grew by a quarter (and 16): 71 of the 79 repeats
        # (first touch: 43); the others fell between two plans
        assert served >= 0.85 * repeats, (served, r)
        assert r["following"] and r["replans"] >= 3 and r["unmatched_opens"] == 0, r
        # nothing beyond the tier's capacity; every copy that was made counted
        assert job.daemon.used() <= cap * 4096 and job.daemon.copies == len(job.daemon.resident) + job.daemon.evictions
    else:
        assert served == 43 and job.daemon.copies == cap and r["replans"] == 0, (served, r)


def test_a_learning_epoch_without_repeats_is_not_planned_again(tmp_path):
    """A permutation reads each index once: nothing learnt lies ahead of
    the reader, so the learning epoch costs no plan and no copy beyond
    first touch's."""
    n = 120
    job = Job(tmp_path, n, capacity=40 * 4096)
    e0, e1 = orders(n, 2)
    job.epoch(0, e0, e1)
    job.poll()
    repeats, served = read_learning_epoch(job, e0, batch=8)
    r = job.policy.report()
    assert repeats == 0 and r["replans"] == 0 and r["stream_length"] == 0, r
    assert job.daemon.copies == 40 and job.daemon.evictions == 0


def test_a_learning_epoch_without_repeats_is_not_scanned_at_each_poll(tmp_path, monkeypatch):
    """The look that decides a new plan is a kept count, not numpy over the
    epoch at every poll: a permutation, whose epoch is never planned again,
    is never scanned (it was at each of the epoch's polls once 16 indices
    were learnt)."""
    from tiering.clairvoyant.learning import LiveEpoch
    scans = []
    upcoming = LiveEpoch.upcoming
    monkeypatch.setattr(LiveEpoch, "upcoming", lambda self, learner: scans.append(1) or upcoming(self, learner))
    n = 120
    job = Job(tmp_path, n, capacity=40 * 4096)
    e0, e1 = orders(n, 2)
    job.epoch(0, e0, e1)
    job.poll()
    read_learning_epoch(job, e0, batch=8)
    assert job.policy.report()["replans"] == 0 and scans == []


def two_sets(tmp: Path, n: int, dirs: tuple[str, str]) -> tuple[HookFeed, Path, np.ndarray, np.ndarray]:
    """A catalog with n files in each of two directories: (a feed, its order
    directory, the catalog ids of the first directory's files, of the second's)."""
    root = tmp / "data"
    make_data(root, {f"{d}/{i:04d}.bin": 10 for d in dirs for i in range(n)})
    cat = scan([str(root)])
    ids = {f.rel: k for k, f in enumerate(cat.files)}
    d = tmp / "orders"
    d.mkdir()
    return (HookFeed(d, cat), d, np.array([ids[f"{dirs[0]}/{i:04d}.bin"] for i in range(n)]),
            np.array([ids[f"{dirs[1]}/{i:04d}.bin"] for i in range(n)]))


def test_two_data_sets_in_one_tag_space_are_not_learnt(tmp_path):
    """Two data sets of one class and length whose string attributes do not
    tell them apart share a tag space: the training set's index i opens
    train/i, the validation set's val/i.  The fetches of index i open
    either one, never both: the space is refused (first touch, said why),
    rather than every index mapping to both files."""
    n = 64
    feed, d, train, val = two_sets(tmp_path, n, ("train", "val"))
    policy = Clairvoyant(Daemon(len(train) + len(val)), feed)  # type: ignore[arg-type]
    learn = {"space": SPACE, "length": n}
    for key in (0, 1):
        message_to(d, f"{key}-0", {"kind": "dataset", "loader": key, "paths": None, "how": None, "why": "-",
                                   "learn": learn})
    message_to(d, "0-1", {"kind": "epoch", "loader": 0, "epoch": 0, "indices": list(range(n)), "next": None})
    policy.poll()
    tags = (SPACE << TAG_BITS) | (np.arange(n) + 1)
    policy.on_tagged(train, tags, np.full(n, 7))       # the training's epoch 1 learns train/i
    message_to(d, "1-1", {"kind": "epoch", "loader": 1, "epoch": 0, "indices": list(range(n)), "next": None})
    policy.poll()
    assert feed.learners[SPACE].learnt == n
    policy.on_tagged(val[:8], tags[:8], np.full(8, 9))   # the validation's first fetches: val/i alone
    assert not policy.gave_up                               # 7 of 70 fetches judged: not enough to tell
    policy.on_tagged(val[8:], tags[8:], np.full(n - 8, 9))
    assert policy.gave_up is not None and not policy.following
    assert "two data sets share a tag space" in policy.gave_up and "/val/" in policy.gave_up
    assert feed.mapping()["source"].startswith("none: two data sets share a tag space")
    r = policy.report()
    assert r["gave_up"] == policy.gave_up and r["mapping"]["mapped"] == 0


def test_an_index_reading_an_image_and_a_mask_in_each_fetch_is_one_data_set(tmp_path):
    """img/i and mask/i opened in every fetch of index i (by two workers,
    a fetch's two opens now and then in two drained batches, judged as one
    fetch): learnt, not refused."""
    n = 64
    feed, d, img, mask = two_sets(tmp_path, n, ("img", "mask"))
    policy = Clairvoyant(Daemon(2 * n), feed)  # type: ignore[arg-type]
    message_to(d, "0", {"kind": "dataset", "loader": 0, "paths": None, "how": None, "why": "-",
                        "learn": {"space": SPACE, "length": n}})
    for epoch in range(3):
        message_to(d, f"{epoch + 1}", {"kind": "epoch", "loader": 0, "epoch": epoch, "indices": list(range(n)),
                                       "next": list(range(n))})
        policy.poll()
        files = np.stack([img, mask], 1).ravel()
        tags = np.repeat((SPACE << TAG_BITS) | (np.arange(n) + 1), 2)
        pids = np.repeat(np.where(np.arange(n) % 2 == 0, 7, 8), 2)
        for a, b in ((0, 9), (9, 41), (41, 2 * n)):         # batches that split fetches 4 and 20
            policy.on_tagged(files[a:b], tags[a:b], pids[a:b])
            policy.on_opens(files[a:b], np.zeros(b - a, bool), pids[a:b])
    assert policy.gave_up is None, policy.gave_up
    learner = feed.learners[SPACE]
    # every fetch judged but each worker's last (it may go on in the next batch)
    assert learner.learnt == n and learner.strays == 0 and learner.fetches == 3 * n - 2
    assert feed.mapping()["source"] == "learnt in epoch 1"


def message_to(d: Path, name: str, msg: dict) -> None:
    (d / f"{name}.json").write_text(json.dumps(msg))


def test_the_gain_kept_batch_by_batch_is_the_count_over_the_whole_epoch():
    """LiveEpoch.gain (what decides a new plan, looked at every poll) is kept
    as batches teach and read, not counted over the epoch at each look: it
    equals the count over the epoch after every batch, every plan and
    whatever the draws (repeats, an index's second file, the same open
    twice, opens of the next epoch, indices out of range)."""
    from tiering.clairvoyant.learning import LiveEpoch
    from tiering.clairvoyant.mapping import Learner

    def counted(live: LiveEpoch, learner: Learner) -> int:
        idx = live.indices
        ahead = (learner.count > 0)[idx] & (live.occ >= live.taken[idx])
        return int(np.count_nonzero(ahead & ~live.known[idx]))

    rng = np.random.default_rng(5)
    for trial in range(30):
        n = int(rng.integers(5, 60))
        learner = Learner(n)
        learner.learn(rng.integers(0, n, 3), rng.integers(0, n, 3))     # a pass before: some indices known
        live = LiveEpoch(0, 1, SPACE, rng.integers(-2, n + 2, int(rng.integers(1, 3 * n))), None, n)
        live.start(learner)
        assert live.gain == counted(live, learner), trial
        stream = np.r_[live.indices, rng.integers(0, n, n)]      # then the next epoch's first reads
        at = 0
        while at < len(stream):
            k = int(rng.integers(1, 12))
            idx = stream[at:at + k]
            at += k
            idx = np.repeat(idx, rng.integers(1, 3, len(idx)))    # an open twice, or the second file
            files = np.where(rng.random(len(idx)) < 0.8, idx, idx + n)
            tags = (SPACE << TAG_BITS) | (idx + 1)
            live.learn(learner, idx, files)
            live.read(idx, files, tags, learner)
            assert live.gain == counted(live, learner), (trial, at)
            if rng.random() < 0.2:
                live.planned(learner)
                assert live.gain == counted(live, learner) == 0


def test_the_bytes_read_by_late_opens_count_in_their_epoch(tmp_path):
    """Opens of the learning epoch drained after the next epoch's order was
    read (late: counted in the learning epoch): the bytes their closes report
    count there too (NOTE [read counters]), not nowhere."""
    n = 80
    job, (e0, e1, e2) = learning_epoch_read(tmp_path, n, 70)
    job.epoch(1, e1, e2)
    job.poll()                      # epoch 1's order is read before epoch 0's last opens are drained
    job.drain(e0[70:])
    late = job.file[e0[70:]]
    job.policy.on_closes(late, np.zeros(len(late), bool), np.full(len(late), 7, np.int64))
    log = job.policy.epoch_log
    by_epoch = {r["epoch"]: r for r in log.records()}
    assert by_epoch[0]["opens"] == n
    assert by_epoch[0]["pfs_read"] == 7 * len(late) and log.unattributed_read == 0
