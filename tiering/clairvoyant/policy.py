"""The clairvoyant policy: follows the planner (planner.py) over the stream
the job will read, as the feeds (feeds.py) make it known, and tracks the
reader through the open events (progress.py).  First-touch until the stream
is known, and again if the reads stop following it."""
from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from ..observe.epochs import EpochLog
from ..placement.api import Placement, Policy, data_fits
from ..placement.policies import STAGE_IN_FLIGHT, FirstTouch
from .feeds import EpochOrder, HookFeed, ListFeed
from .mapping import occurrences
from .planner import FETCH, INF, Actions, Planner
from .progress import Progress

STAGE_CHUNK = 1024   # files a turn of the staging places at once (NOTE [staging while waiting])

log = logging.getLogger("tiering")


def first_fetch(kind: np.ndarray) -> int | None:
    """The index of the first FETCH in `kind`, looked for in windows that
    grow eightfold: the plan held back by the horizon or the pace is one
    array of up to an epoch's actions, asked for its first fetch at every
    batch of opens (the lead), and evictions come before a fetch a few at a
    time, so the whole array is not compared each time."""
    start, step = 0, 64
    while start < len(kind):
        hit = np.flatnonzero(kind[start:start + step] == FETCH)
        if len(hit):
            return start + int(hit[0])
        start, step = start + step, step * 8
    return None


def first_at_or_beyond(need: np.ndarray, reach: int) -> int:
    """The index of the first action whose need is at least reach (len if
    none), looked for in windows that grow eightfold (as first_fetch): the
    head of the plan can be an epoch long, and this is asked at every
    hand-out, almost always answered by its first entry."""
    start, step = 0, 64
    while start < len(need):
        hit = np.flatnonzero(need[start:start + step] >= reach)
        if len(hit):
            return start + int(hit[0])
        start, step = start + step, step * 8
    return len(need)


class Clairvoyant(Policy):
    """Places files ahead of the reader, in the order it will read them."""

    name = "clairvoyant"
    margin = 0.98        # of each tier's capacity, for allocation rounding
    ahead = 1            # epochs of a ListFeed kept known beyond the reader's
    in_flight = 1024     # copies queued in the daemon at most; the plan's other fetches wait here
    reorder = 8192       # how far ahead of the furthest match an open may match, at most
    chunk = 1024         # actions handed to the daemon per turn
    refill = 128         # a landed copy hands more only once this many have room (poll() does every turn)
    part = 4096          # opens matched at once (between them the next epoch may become known)
    early = 256          # opens kept while the hook's first order is on its way (NOTE [early opens])
    regrow = 0.25        # the epoch being learnt is planned again when the indices learnt grew by this share
    least = 16           # ... and by this many, and as many of its positions ahead became known
    # NOTE [prefetch horizon]: while the reader reads, copies are issued at most
    # this many seconds of its reading ahead of it (never fewer than lead_floor
    # positions); a reader that paused for rate_span seconds sets no bound
    horizon = 30.0
    lead_floor = 65536
    rate_span = 2.0
    # ... and once the lead is lead_min seconds of reading (never fewer than
    # lead_min_floor positions), fetches are handed out at most (1 + growth)
    # times the reader's rate: the lead grows to the horizon over minutes, not
    # in a burst of copies that takes the training's CPU
    lead_min = 5.0
    lead_min_floor = 8192
    growth = 0.25
    pace_batch = 512     # ... in batches of this many (the copy workers then sleep between them)
    pace_wait = 0.25     # seconds the pace is not looked at again after it held (at most)
    # NOTE [skip ahead]: a planned fetch of a position the reader reaches before a copy handed out
    # now lands (the copies in flight and itself at the copies' rate, times skip_margin) is not
    # handed out: the reader reads it, once
    skip_margin = 1.25
    skip_known = 0.25    # seconds of the reader's opens and of the copies' ends its rates need
    clock = staticmethod(time.monotonic)
    defers_read_copies = False   # the plan places each use (NOTE [one read per file])

    def __init__(self, placement: Placement, feed: ListFeed | HookFeed | None = None, window: int = 64,
                 pinned: np.ndarray | None = None):
        """pinned: a bool per file, the files this node keeps once it has
        them (its home files in a multi-node job, NOTE [home nodes])."""
        super().__init__(placement)
        self.feed = feed
        self.window = window
        self.pinned = pinned
        self.first_touch = FirstTouch(placement)
        self.planner: Planner | None = None
        self.progress: Progress | None = None
        self.epoch_starts: list[int] = []   # stream position where each known epoch begins
        self.epochs: list[int] = []         # their numbers
        self.predicted: dict[int, np.ndarray] = {}
        self.diverged = False
        self.gave_up: str | None = None     # why the plan was given up without a divergence
        self.resets = 0
        self.fetches = 0
        self.evictions = 0
        self.refused = 0
        self._loader: int | None = None
        self._actions: deque[Actions] = deque()   # planned, not yet handed to the daemon
        self.epoch_log = EpochLog()         # opens per epoch, for the report
        self._sizes = np.asarray(placement.sizes, dtype=np.int64)
        self._early: deque[tuple[np.ndarray, np.ndarray]] = deque()   # (files, pids) before the first order
        self._early_n = 0
        self._partial: set[int] = set()     # epochs planned from a partly learnt mapping
        self._ahead = np.zeros(0, np.int64)   # opens beyond the epoch being learnt while no plan exists
        self._late: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._pace: deque[tuple[float, int]] = deque()   # (time, reader position) of the last rate_span s
        self._held_back = False             # the last turn's fetches were held by the horizon or the pace
        self._long_lead = False             # ... or it had none to hand out, its lead long (patient())
        self.held = 0                       # turns that issued nothing because of the horizon
        self.paced = 0                      # turns that issued fewer fetches than had room: the pace
        self._tokens = 0.0                  # fetches the pace allows now
        self._paced_at: float | None = None   # when _tokens was last topped up; None: not pacing
        self._resume_at = 0.0               # the pace let nothing out: not looked at again before then
        self._relay: Any = None             # a multi-node job's relay rule (nodes.Relay), once the nodes met
        self._view: tuple[Planner, list[int], list[int]] | None = None   # the plan and its epochs, for next_epoch
        # staging while no order is followed (NOTE [staging while waiting]): only where the whole data
        # set fits the plan's capacities, on one node; the next file of the catalog to stage, and the
        # files the reader opened (not staged: its read was their one read)
        self._stage_fits = pinned is None and data_fits(self._sizes, self.plan_capacities(placement.capacities))
        self._stage_next = 0
        self._opened = np.zeros(len(self._sizes), bool)   # ... and by NOTE [skip ahead]
        self.staged = 0                     # copies placed by the staging
        self._landings: deque[tuple[float, int]] = deque()   # (time, copies ended) of the last rate_span s
        self._landed_sum = 0                # the copies in _landings
        self.passed_over = 0                # planned fetches left to the reader (NOTE [skip ahead])

    # -- the stream ----------------------------------------------------------
    def start(self) -> None:
        if isinstance(self.feed, ListFeed):
            self._extend_from_list()
            if self.planner is not None:
                self._pump()  # known from the start: begin now

    def pin(self, pinned: np.ndarray) -> None:
        """This node's home files from now on, in this plan and every later one."""
        self.pinned = pinned
        if self.planner is not None:
            self.planner.pin(pinned)

    def keep(self, files: np.ndarray, on: bool) -> None:
        """Pins (on) or unpins these files, in this plan and every later one
        (the relay rule, NOTE [relay])."""
        if self.pinned is None:
            if not on:
                return
            self.pinned = np.zeros(len(self._sizes), bool)
        self.pinned[files] = on
        if self.planner is not None:
            self.planner.keep(files, on)

    def relay(self, relay: Any) -> None:
        self._relay = relay
        self._relay_step()

    def _relay_step(self, files: np.ndarray | None = None, positions: np.ndarray | None = None) -> None:
        """The relay's turn, with the files just read at these stream
        positions (none: a turn without reads): after the reads are consumed
        and before the plan advances, so that a file read for another node
        is pinned before it can be chosen as a victim (NOTE [relay])."""
        relay = self._relay
        if relay is None:
            return
        if not self.following or not self.epochs:
            relay.drop_served()
            return
        p = self.planner
        assert p is not None
        if files is None or positions is None:
            files = positions = np.zeros(0, np.int64)
        epochs = self._epochs_at(positions)
        assert epochs is not None
        relay.step(files, epochs, p.held(files), self.epochs[self._reader_epoch()], self.keep)

    def next_epoch(self, i: int) -> int | None:
        view = self._view   # one plan with its own epochs (a copy thread asks while a reset makes another)
        if view is None or not self.following:
            return None
        p, starts, numbers = view
        pos = p.need.get(i)
        k = bisect.bisect_right(starts, pos) - 1
        return numbers[k] if pos < INF and 0 <= k < len(numbers) else None

    @classmethod
    def plan_capacities(cls, capacities: Sequence[int]) -> list[int]:
        """The capacity of each tier the plan fills: its margin off."""
        return [int(c * cls.margin) for c in capacities]

    def _fresh(self) -> None:
        """A new plan over what is placed now."""
        p = self.placement
        self.planner = Planner(p.sizes, self.plan_capacities(p.capacities), window=self.window, pinned=self.pinned)
        placed = np.fromiter(chain.from_iterable(p.placements()), np.int64).reshape(-1, 2)   # no list of tuples
        self.planner.adopt_many(placed[:, 0], placed[:, 1])
        self.progress = Progress(self.planner, window=max(256, 4 * self.window))
        self.epoch_starts, self.epochs = [], []
        self._view = (self.planner, self.epoch_starts, self.epochs)
        self._actions.clear()
        self._pace.clear()                  # positions of another plan: the rate is measured anew
        self._held_back = self._long_lead = False   # of the plan before: the next turn says anew

    def _add(self, epoch: int, order: np.ndarray) -> None:
        if self.planner is None:
            self._fresh()
        assert self.planner is not None and self.progress is not None
        if not self.epochs:
            # opens match within this many positions of the reader: more than
            # DataLoader workers read out of order (workers x prefetch x batch),
            # well under an epoch
            self.progress.window = max(32, min(max(self.reorder, 4 * self.window), len(order) // 4))
            # a worker lagging behind by a few windows (at most a third of an
            # epoch, so that another order shows) is late, not reading another order
            self.progress.late_span = min(4 * self.progress.window, len(order) // 3)
        self.epoch_starts.append(self.planner.end)
        self.epochs.append(epoch)
        self.planner.extend(order)

    def _reset(self, epoch: int, orders: list[np.ndarray]) -> None:
        self.resets += 1
        self.planner = None
        self._view = None
        for k, order in enumerate(orders):
            self._add(epoch + k, order)

    def _extend_from_list(self) -> None:
        assert isinstance(self.feed, ListFeed)
        while len(self.epochs) < self._reader_epoch() + 1 + self.ahead:
            order = self.feed.next_epoch()
            if order is None:
                return
            self._add(self.feed.number - 1, order)

    def _reader_epoch(self) -> int:
        """Index (into self.epochs) of the epoch the reader is in."""
        if self.planner is None:
            return -1
        k = 0
        while k + 1 < len(self.epoch_starts) and self.epoch_starts[k + 1] <= self.planner.reader:
            k += 1
        return k

    def poll(self) -> None:
        if isinstance(self.feed, HookFeed):
            first = self.planner is None
            for key, eo in self.feed.poll():
                self._take(key, eo)
            if not self.diverged:
                # after the opens drained so far: an open that taught an index is not matched to its next use
                learning = self.feed.replan(self.regrow, self.least)
                if learning is not None:
                    self._take(*learning, again=True)
            if first and self.planner is not None:
                if self.feed.learnt():
                    self._match_ahead()   # the others taught the mapping (a learning epoch, a pass before training)
                else:
                    self._match_early()
        if not self.following:
            self._stage()
        self._relay_step()
        self._issue()
        self._note_lead()

    def _stage(self) -> None:
        """While no order is followed (waiting for the hook, learning the
        mapping, first touch) and the data set fits: the catalog in order,
        at most STAGE_IN_FLIGHT copies queued, fastest tier first, but for
        the files the reader opened (NOTE [staging while waiting]).  A plan
        made later adopts what is placed and in flight."""
        p = self.placement
        n = len(self._sizes)
        if not self._stage_fits:
            return
        while self._stage_next < n and not p.stopping:
            room = STAGE_IN_FLIGHT - p.copies_in_flight()
            if room < STAGE_CHUNK:
                return
            chunk = np.arange(self._stage_next, min(n, self._stage_next + STAGE_CHUNK), dtype=np.int64)
            self._stage_next += len(chunk)
            chunk = chunk[~self._opened[chunk]]
            for tier in range(len(p.capacities)):
                if not len(chunk):
                    break
                placed = p.place_many(chunk, tier)
                self.staged += int(placed.sum())
                chunk = chunk[~placed]

    def _keep_early(self, files: np.ndarray, pids: np.ndarray) -> None:
        """The last opens made before the hook's first order came in: a fast
        reader's first batches may be drained before the order file is read
        (NOTE [early opens])."""
        if not isinstance(self.feed, HookFeed) or self.diverged or not len(files):
            return
        self._early.append((files[-self.early:].copy(), pids[-self.early:].copy()))
        self._early_n += min(len(files), self.early)
        while self._early_n - len(self._early[0][0]) >= self.early:
            self._early_n -= len(self._early.popleft()[0])

    def _match_early(self) -> None:
        """Matches the opens kept before the first order against its start:
        only files the new stream reads near its beginning, so opens of
        something else (a validation pass before training) are left alone."""
        if not self._early or self.planner is None:
            return
        files = np.concatenate([f for f, _ in self._early])
        pids = np.concatenate([p for _, p in self._early])
        self._drop_early()
        near = self.planner.need_of(files) < self.planner.reader + 2 * len(files) + self.window
        if near.any():
            self._follow(files[near], pids[near])

    def _take(self, key: int, eo: EpochOrder, again: bool = False) -> None:
        """An epoch's order (again: the rest of the epoch being learnt, planned anew)."""
        feed = self.feed
        assert isinstance(feed, HookFeed)
        if key != feed.main or self.diverged:
            return
        orders = [eo.order] + ([eo.next] if eo.next is not None else [])
        if key != self._loader or again:  # a new main loader (e.g. after a validation pass), or a re-plan
            if key != self._loader:
                self._number_rows(key, eo.epoch)
            self._loader = key
            self.predicted.clear()
            self._partial.clear()
            self._reset(eo.epoch, orders)
        elif eo.epoch in self.predicted:
            if not np.array_equal(self.predicted.pop(eo.epoch), eo.order):
                log.info("epoch %d is not in the predicted order: planning anew", eo.epoch)
                self._reset(eo.epoch, orders)
            elif eo.next is not None and eo.epoch + 1 not in self.epochs:
                self._add(eo.epoch + 1, eo.next)
        elif not self.epochs or eo.epoch != self.epochs[-1] + 1:
            self._reset(eo.epoch, orders)
        else:
            self._add(eo.epoch, eo.order)
            if eo.next is not None:
                self._add(eo.epoch + 1, eo.next)
        if eo.next is not None:
            self.predicted[eo.epoch + 1] = eo.next
        if feed.still_learning():
            self._partial.update((eo.epoch, eo.epoch + 1))
        else:
            self._partial.difference_update((eo.epoch, eo.epoch + 1))
        self._pump()

    def _number_rows(self, key: int, epoch: int) -> None:
        """The report's epochs go on across DataLoaders (NOTE [epoch rows]):
        a new main loader's epoch `epoch` is numbered after the epochs counted
        so far (a training script that makes a DataLoader per epoch starts
        each at epoch 0); the first loader's, when another loader's opens
        taught the mapping, after the opens that taught it."""
        if self._loader is not None:
            self.epoch_log.number_from(epoch)
        elif isinstance(self.feed, HookFeed) and self.feed.taught_by_another(key):
            self.epoch_log.number_from(epoch, after_pending=True)

    # -- events ------------------------------------------------------------------
    def on_tagged(self, files: np.ndarray, tags: np.ndarray, pids: np.ndarray | None = None) -> None:
        """Learns from a batch's tagged opens; says which of its opens were
        of an epoch before the plan's (not matched: on_opens skips them)
        and keeps those of the epoch after the one being learnt while no
        plan exists (matched when it starts)."""
        if not isinstance(self.feed, HookFeed):
            return
        started = self.planner is None
        got = self.feed.learn(files, tags, pids)
        opened_in = self.feed.opened_in
        if self.feed.refused() and not self.diverged:
            self._give_up(str(self.feed.mapping()["source"]).removeprefix("none: "))
        for key, eo in got:
            self._take(key, eo)
        if self.planner is None:
            live = self.feed.live()
            if live is not None:
                ahead = opened_in > live.epoch
                self._ahead = np.r_[self._ahead, files[ahead]][-self.early:]
            return
        if started:   # a learnt order: the early opens were the learning epoch's, except those read after it
            self._match_ahead()
        if self.epochs:
            late = (opened_in >= 0) & (opened_in < self.epochs[0])
            self._late = (files[late], opened_in[late])

    def _match_ahead(self) -> None:
        """At the start of a learnt order: the opens kept while there was
        none that read beyond the epoch being learnt are the new order's
        first (a fast reader's, drained before its order was read)."""
        ahead, self._ahead = self._ahead, np.zeros(0, np.int64)
        self._drop_early()
        if len(ahead) and self.following:
            self._follow(ahead, np.full(len(ahead), -1, np.int64))

    def _skip_late(self, files: np.ndarray, from_tier: np.ndarray) -> np.ndarray:
        """Which opens are not the late ones of an epoch before the plan's
        (told by on_tagged for this batch); those are counted in their epoch."""
        late, epochs = self._late
        self._late = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if not len(late):
            return np.ones(len(files), bool)
        uniq, first, count = np.unique(late, return_index=True, return_counts=True)
        at = np.minimum(np.searchsorted(uniq, files), len(uniq) - 1)
        skip = (uniq[at] == files) & (occurrences(files) < count[at])
        self.epoch_log.opened_many(epochs[first][at[skip]], from_tier[skip], self._sizes[files[skip]], None,
                                   files[skip])   # their closes count there too
        return ~skip

    def _drop_early(self) -> None:
        self._early.clear()
        self._early_n = 0

    @property
    def following(self) -> bool:
        return self.planner is not None and not self.diverged

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        self.on_opens(np.array([i], np.int64), np.array([from_tier]), np.array([pid], np.int64))

    def on_opens(self, files: np.ndarray, from_tier: np.ndarray, pids: np.ndarray) -> None:
        # a late drain may span several epochs: the next epoch is made known
        # between parts (each shorter than the matching window, so shorter
        # than a quarter of an epoch) as the reader gets there
        if len(self._late[0]):
            keep = self._skip_late(files, from_tier)
            files, from_tier, pids = files[keep], from_tier[keep], pids[keep]
        self._opened[files] = True
        part = min(self.part, self.progress.window) if self.progress is not None else self.part
        for k in range(0, len(files), part):
            if not self.following:
                self.first_touch.on_opens(files[k:], from_tier[k:], pids[k:])
                self._observe(files[k:], from_tier[k:], None)
                if self.planner is None:
                    self._keep_early(files[k:], pids[k:])
                return
            got = self._follow(files[k:k + part], pids[k:k + part])
            self._observe(files[k:k + part], from_tier[k:k + part], got)
            self._note_lead()
            if self._partial and self.epochs and self.epochs[self._reader_epoch()] in self._partial:
                # opens outside an epoch planned from a partly learnt mapping are
                # most likely of the indices not learnt then: copied on first touch
                off = got < 0
                self.first_touch.on_opens(files[k:k + part][off], from_tier[k:k + part][off],
                                          pids[k:k + part][off])

    def on_closes(self, files: np.ndarray, from_tier: np.ndarray, nbytes: np.ndarray) -> None:
        self.epoch_log.closed_many(files, from_tier, nbytes)

    def _follow(self, files: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """The stream position each open matched (-1: none)."""
        assert self.progress is not None
        out = np.full(len(files), -1, np.int64)
        planned = self.progress.in_stream(files)   # others are not part of the plan: left on the PFS
        if not planned.any():
            return out
        got = self.progress.on_opens(files[planned], pids[planned])
        out[planned] = got
        matched = got >= 0
        if matched.any():
            self._note_reader()
            if isinstance(self.feed, ListFeed):
                self._extend_from_list()
            self._relay_step(files[planned][matched], got[matched])
            self._pump()
        if self.progress.diverged:
            self._diverge()
        return out

    # -- observation ---------------------------------------------------------------
    def _observe(self, files: np.ndarray, from_tier: np.ndarray, matched: np.ndarray | None) -> None:
        """Counts the opens per epoch for the report: the epoch of the matched
        position, else the reader's; none while no order is followed."""
        sizes = self._sizes[files]
        epochs = self._epochs_at(matched) if matched is not None else None
        self.epoch_log.opened_many(epochs, from_tier, sizes, self.lead(), files)

    def _epochs_at(self, positions: np.ndarray) -> np.ndarray | None:
        """The epoch number of each stream position (-1: the reader's), None
        when no order is followed."""
        if not self.following or not self.epochs:
            return None
        assert self.planner is not None
        pos = np.where(positions >= 0, positions, self.planner.reader)
        k = np.maximum(0, np.searchsorted(np.asarray(self.epoch_starts), pos, side="right") - 1)
        return np.asarray(self.epochs, np.int64)[k]

    def lead(self) -> int | None:
        """Stream positions ahead of the reader whose copies have landed
        (handed to the daemon less in flight: the plan's fetches still held
        here, by the horizon or the in-flight bound, are not), None when no
        order is followed."""
        if not self.following:
            return None
        assert self.planner is not None
        return max(0, self._handed_to() - self.planner.reader - self.placement.copies_in_flight())

    def _handed_to(self) -> int:
        """The stream position of the first planned fetch not handed to the
        daemon yet (the plan's cursor when all were)."""
        assert self.planner is not None
        for actions in self._actions:
            at = first_fetch(actions.kind)
            if at is not None:
                return int(actions.need[at])
        return self.planner.cursor

    def _give_up(self, why: str) -> None:
        """The mapping the plan was made with is wrong (the feed said why,
        once): first touch from now on."""
        self.diverged = True
        self.gave_up = why
        self._actions.clear()

    def _diverge(self) -> None:
        assert self.progress is not None
        self.diverged = True
        self._actions.clear()
        log.warning("the reads no longer follow the announced order (%d of the last opens did not "
                    "match: a different seed, a resumed run?); placing by first touch from now on",
                    self.progress.mismatched)

    def _pump(self) -> None:
        assert self.planner is not None
        actions = self.planner.advance()
        if len(actions):
            self._actions.append(actions)
        self._issue()

    def _issue(self) -> None:
        """Hands the planned actions to the daemon in order, while fewer than
        in_flight copies are queued there (a plan of a million fetches is
        not a million queued copies; NOTE [event batches])."""
        p = self.placement
        rate = self._rate()
        if rate is None:
            self._paced_at, self._resume_at = None, 0.0
        elif self._resume_at and self.clock() < self._resume_at:
            return      # held by the pace: not a numpy pass per landed copy
        self._held_back = False
        self._skip_ahead(rate if rate is not None else self._rate(self.skip_known))
        bound = self._lead_bound(rate)
        while self._actions and self.following:
            if p.stopping:
                return    # the job ended: nothing more is placed (not a refusal per planned copy)
            room = self.in_flight - p.copies_in_flight()
            if room <= 0:
                return
            head = self._actions[0]
            if bound is not None and head.kind[0] == FETCH and int(head.need[0]) >= bound:
                self.held += 1
                self._held_back = True
                return
            part = self._paced(head[:min(self.chunk, room)], rate)    # at most room fetches
            if not len(part):
                self.paced += 1
                self._held_back = True
                return
            self._hand_out(part)
            if len(part) < len(head):
                self._actions[0] = head[len(part):]
            else:
                self._actions.popleft()

    def _copy_rate(self) -> float | None:
        """Copies ended per second over the last rate_span (None: not known
        yet, fewer than skip_known seconds of them)."""
        if len(self._landings) < 2:
            return None
        t0, t1 = self._landings[0][0], self._landings[-1][0]
        if self.clock() - t1 > self.rate_span or t1 - t0 < self.skip_known:
            return None
        return (self._landed_sum - self._landings[0][1]) / (t1 - t0)

    def _skip_ahead(self, rate: float | None) -> None:
        """NOTE [skip ahead]: the planned fetches at the head of the plan
        whose positions the reader reaches before a copy handed out now can
        land are not handed out (the evictions among them are); the plan
        takes each such file up again at its next use."""
        if rate is None or rate <= 0 or not self._actions or self.planner is None:
            return
        if self.pinned is not None or getattr(self.placement, "peers", None) is not None:
            return   # a job of several nodes: a node's copy serves the other nodes too (NOTE [home nodes])
        copies = self._copy_rate()
        if not copies:
            return
        land = (self.placement.copies_in_flight() + 1) / copies * self.skip_margin
        reach = self.planner.reader + int(rate * land)
        while self._actions:
            head = self._actions[0]
            k = first_at_or_beyond(head.need, reach)   # fetches' needs ascend; evictions' are -1
            if k == 0:
                return
            part = head[:k]
            fetch = part.kind == FETCH
            # not a file read before, nor, where the data set fits, one used again: their copies stay
            skip = fetch & ~self._opened[part.file]
            if self._stage_fits and skip.any():
                skip &= ~self.planner.used_later(part.need)
            # a use the reader has passed: a copy now cannot serve it, only a later use, for which it
            # is planned again (behind the reader, it would take the copies' slots from what is ahead)
            skip |= fetch & (part.need < self.planner.reader)
            if (~fetch).any():
                self._hand_out(part[np.flatnonzero(~fetch)])
            if skip.any():
                self.planner.pass_over(part.file[skip], part.need[skip], reach)
                self.passed_over += int(skip.sum())
            keep = fetch & ~skip
            if keep.any():    # handed out next, before the rest of the head
                if k < len(head):
                    self._actions[0] = head[k:]
                else:
                    self._actions.popleft()
                self._actions.appendleft(part[np.flatnonzero(keep)])
                return
            if k < len(head):
                self._actions[0] = head[k:]
                return
            self._actions.popleft()
        # a cursor taken back has the next uses of the files passed over to plan
        self._actions.append(self.planner.advance())
        if not len(self._actions[-1]):
            self._actions.pop()

    def _hand_out(self, part: Actions) -> None:
        """Evictions one by one, each run of fetches to one tier in one
        place_many (NOTE [batch copy]), in the plan's order; a refused fetch
        is dropped from the plan."""
        assert self.planner is not None
        p = self.placement
        kind, tier = part.kind, part.tier
        # runs: where the kind or the tier changes, and around every eviction
        cut = (np.flatnonzero((kind[1:] != kind[:-1]) | (tier[1:] != tier[:-1]) | (kind[1:] != FETCH)) + 1).tolist()
        for a, b in zip([0, *cut], [*cut, len(part)]):
            if kind[a] != FETCH:
                self.evictions += b - a
                for f in part.file[a:b].tolist():
                    p.evict(f)  # a copy still in flight is dropped when it lands
                continue
            placed = p.place_many(part.file[a:b], int(tier[a]))
            n = int(placed.sum())
            self.fetches += n
            if n < b - a:
                refused = part.file[a:b][~placed]
                self.refused += len(refused)
                for f in refused.tolist():
                    self.planner.drop(f)

    def _note_reader(self) -> None:
        """The reader's position now, for its rate (NOTE [prefetch horizon])."""
        assert self.planner is not None
        now = self.clock()
        self._pace.append((now, self.planner.reader))
        while len(self._pace) > 2 and self._pace[1][0] <= now - self.rate_span:
            self._pace.popleft()

    def _rate(self, least: float | None = None) -> float | None:
        """The reader's positions per second over the last rate_span (NOTE
        [prefetch horizon]); None: not reading (it has not read for
        rate_span seconds, or its rate is not known yet: fewer than
        `least` seconds of reading, rate_span / 2 unless given)."""
        if self.planner is None or len(self._pace) < 2:
            return None
        (t0, r0), (t1, r1) = self._pace[0], self._pace[-1]
        if self.clock() - t1 > self.rate_span or t1 - t0 < (self.rate_span / 2 if least is None else least):
            return None
        return (r1 - r0) / (t1 - t0)

    def _starting(self) -> bool:
        """The reader has begun to read (it opened files in the last
        rate_span) but not for long enough for its rate (NOTE [prefetch
        horizon])."""
        if self.planner is None or not self._pace or self.planner.reader <= 0:
            return False
        return self.clock() - self._pace[-1][0] <= self.rate_span

    def _lead_bound(self, rate: float | None) -> int | None:
        """The stream position copies are not issued at or beyond while the
        reader reads at `rate` (NOTE [prefetch horizon]): the horizon; while
        it has begun to read and its rate is not known yet, the lead any
        rate needs (lead_min_floor), no more; None: no bound."""
        if self.planner is None:
            return None
        if rate is None:
            return self.planner.reader + self.lead_min_floor if self._starting() else None
        return self.planner.reader + max(self.lead_floor, int(rate * self.horizon))

    def _paced(self, part: Actions, rate: float | None) -> Actions:
        """The head of `part` the pace lets out now (NOTE [prefetch horizon]):
        all of it while the reader's rate is not known; else the fetches of
        positions less than lead_min ahead of the reader, and beyond them as
        many fetches as (1 + growth) x rate has allowed since (evictions are
        not counted)."""
        assert self.planner is not None
        if rate is None:
            self._paced_at = None
            return part
        now = self.clock()
        if self._paced_at is not None:
            self._tokens = min(self._tokens + (now - self._paced_at) * rate * (1 + self.growth), self.chunk)
        else:
            self._tokens = 0.0
        self._paced_at = now
        fetch = part.kind == FETCH
        near = ~fetch | (part.need < self.planner.reader + max(self.lead_min_floor, rate * self.lead_min))
        free = len(part) if near.all() else int(np.argmin(near))   # below the minimum lead: not paced
        fetches = np.cumsum(fetch)
        batch = min(self.pace_batch, int(fetches[-1]) - (int(fetches[free - 1]) if free else 0))
        paced = int(np.searchsorted(fetches, self._tokens, side="right")) if self._tokens >= batch else 0
        take = max(free, paced)
        if take > free:
            self._tokens -= int(fetches[take - 1]) - (int(fetches[free - 1]) if free else 0)
        if take < len(part):   # held: the next batch is due when its tokens are (a reader standing still: never)
            speed = rate * (1 + self.growth)
            due = max(0.0, batch - self._tokens) / speed if speed > 0 else self.pace_wait
            self._resume_at = now + min(self.pace_wait, due)
        else:
            self._resume_at = 0.0
        return part[:take]

    def on_placed(self, i: int, tier: int) -> None:
        self._count_landed(1)
        self._landed(i, tier, True)
        self._refill()

    def on_failed(self, i: int) -> None:
        self._count_landed(1)
        self._landed(i, -1, False)
        self._refill()

    def _count_landed(self, n: int) -> None:
        """n copies ended now: for the copies' rate (NOTE [skip ahead])."""
        now = self.clock()
        self._landings.append((now, n))
        self._landed_sum += n
        while len(self._landings) > 2 and self._landings[1][0] <= now - self.rate_span:
            self._landed_sum -= self._landings.popleft()[1]

    def patient(self) -> bool:
        """While the horizon or the pace holds the fetches back, the lead is
        at least lead_min of the reader's reading (NOTE [prefetch horizon]);
        so it is when every planned fetch was handed out and the copies
        lead the reader by as much (a data set in the tiers): the next turn
        can wait (NOTE [event batches])."""
        # the actions are looked at now: a re-plan since the last turn has fetches to hand out
        return self.following and (self._held_back or (self._long_lead and not self._actions))

    def _note_lead(self) -> None:
        """After a turn's hand-out (event thread): nothing is left to hand
        out and the lead is at least lead_min of reading (lead_min_floor
        positions while the reader stands still).  Never while the reader
        has begun and its rate is not known yet: a fast one could read
        lead_min_floor positions within one patient turn."""
        rate = self._rate()
        if self.planner is None or self._actions or (rate is None and self._starting()):
            self._long_lead = False
            return
        lead = self.lead()
        self._long_lead = lead is not None and lead >= max(self.lead_min_floor, (rate or 0.0) * self.lead_min)

    def on_landed(self, files: np.ndarray, tier: int, published: np.ndarray) -> None:
        """on_placed and on_failed of a batch's copies, then one refill; a
        published copy where the plan holds it (most) asks for nothing.
        Each file at most once (Policy.on_landed)."""
        self._count_landed(len(files))
        if self.planner is not None:
            files, published = np.asarray(files, np.int64), np.asarray(published, bool)
            rest = ~(published & self.planner.held_on(files, tier))
            for i, ok in zip(files[rest].tolist(), published[rest].tolist()):
                self._landed(i, tier, ok)
        self._refill()

    def _landed(self, i: int, tier: int, published: bool) -> None:
        """The plan learns of a copy that ended: adopted where it landed (else
        evicted: the plan holds it elsewhere or has no room for it), or
        dropped when it was not published."""
        planner = self.planner
        if planner is None:
            return
        if not published:
            planner.drop(i)
        elif self.following and not planner.adopt_if_room(i, tier):
            self.placement.evict(i)

    def _refill(self) -> None:
        """Issues in batches, not one action per landed copy (NOTE [copy in C])."""
        if self.in_flight - self.placement.copies_in_flight() >= self.refill:
            self._issue()

    def report(self) -> dict[str, Any]:
        p, pr = self.planner, self.progress
        return {
            "following": self.following,
            "diverged": self.diverged,
            "gave_up": self.gave_up,
            "epochs_known": len(self.epochs),
            "stream_length": p.end if p else 0,
            "reader_position": p.reader if p else 0,
            "matched_opens": pr.matched if pr else 0,
            "unmatched_opens": pr.mismatched if pr else 0,
            "duplicate_opens": pr.duplicates if pr else 0,
            "skipped_positions": pr.skipped if pr else 0,
            "late_opens": pr.late if pr else 0,
            "resyncs": pr.resyncs if pr else 0,
            "planned_not_issued": sum(len(a) for a in self._actions),
            "held_by_horizon": self.held,
            "held_by_pace": self.paced,
            "fetches": self.fetches,
            "staged": self.staged,
            "passed_over": self.passed_over,
            "evictions": self.evictions,
            "refused": self.refused,
            "replans": self.resets,
            "hook_errors": list(self.feed.errors) if isinstance(self.feed, HookFeed) else [],
            "mapping": self.feed.mapping() if isinstance(self.feed, HookFeed) else None,
            "prefetch_lead": self.lead(),
            "per_epoch": self.epoch_log.records(),
        }
