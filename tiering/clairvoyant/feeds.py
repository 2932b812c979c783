"""Where the clairvoyant policy learns the stream: a known sampler or an order
file given on the command line (all epochs known ahead), or the messages the
zero-code hook publishes from inside the training process (tiering/hook).

Every feed hands out epochs as int64 arrays of catalog file ids.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import Catalog, PathIndex
from .learning import LiveEpoch
from .mapping import IndexMap, Learner, check_attribute, split_tags
from .samplers import interleave

log = logging.getLogger("tiering")

NO_LOADER = "none: no DataLoader announced a data set"   # the mapping's source before any did
MERGE_WAIT = 1.0   # seconds to wait for the other local ranks' order of an epoch


@dataclass
class EpochOrder:
    epoch: int
    order: np.ndarray                   # catalog file ids, in read order
    next: np.ndarray | None = None      # the next epoch's order, when the hook could predict it


class ListFeed:
    """Epochs known in advance (a sampler given on the command line, an order
    file), computed one at a time as the policy asks for them."""

    def __init__(self, epochs: Iterator[np.ndarray], first: np.ndarray | None = None):
        self._epochs = epochs
        self.first = first        # the first epoch, when known before COMMAND starts (--warm)
        self.number = 0

    def next_epoch(self) -> np.ndarray | None:
        try:
            order = next(self._epochs)
        except StopIteration:
            return None
        self.number += 1
        return order


HELLO = "hello"   # made by the first Python process of COMMAND that loads the hook (tiering/hook)


class HookWatch:
    """Whether the order hook started in COMMAND: its sitecustomize makes the
    file "hello" in the order directory as soon as Python runs it, before the
    first line of the training script (the HookFeed reads only *.json)."""

    def __init__(self, order_dir: Path):
        self.dir = order_dir

    def started(self) -> bool:
        return os.path.isfile(self.dir / HELLO)


@dataclass
class _Loader:
    key: int
    maps_by_rank: dict[int, IndexMap] = field(default_factory=dict)   # read from an attribute, checked
    space: int | None = None            # tag space of a mapping learnt from the opens
    how: str | None = None              # the attribute the mapping was read from
    why: str | None = None              # why it was not (or cannot be learnt)
    pending: dict[int, dict[int, dict]] = field(default_factory=dict)  # epoch -> rank -> message
    first_seen: dict[int, float] = field(default_factory=dict)
    polled: dict[int, int] = field(default_factory=dict)              # epoch -> poll it came in
    ranks: set[int] = field(default_factory=set)                       # ranks that announced the data set
    announced: int = -1                 # when its latest epoch was announced (the feed's count of them)


class HookFeed:
    """Reads the hook's messages from the order directory; learns the
    index -> file mapping of a data set from the tagged opens when its
    attributes do not give it (NOTE [learnt mapping])."""

    def __init__(self, order_dir: Path, catalog: Catalog):
        self.dir = order_dir
        self.paths = PathIndex(catalog)
        self.catalog = catalog
        self._dirs = catalog.files.dir         # int32 per file, the catalog's own (no copy)
        self.loaders: dict[int, _Loader] = {}
        self.learners: dict[int, Learner] = {}   # tag space -> what its opens taught
        self.clashes: set[int] = set()           # spaces of two data sets of different lengths: not learnt
        self.errors: list[str] = []
        self.main: int | None = None          # key of the loader whose stream is planned
        self.lives: dict[int, LiveEpoch] = {}      # tag space -> the epoch read while its mapping is learnt
        self.previous: dict[int, LiveEpoch] = {}   # ... the one before it, whose last opens may come late
        self._last_space: int | None = None        # the space of the epoch announced last
        self.opened_in = np.zeros(0, np.int64)   # the epoch of each open of the last learn() (-1: not known)
        self._done: set[str] = set()
        self._polls = 0
        self._epochs_announced = 0

    def poll(self, now: float | None = None) -> list[tuple[int, EpochOrder]]:
        """New complete epochs, as (loader key, order), oldest first."""
        now = time.monotonic() if now is None else now
        self._polls += 1
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json") and n not in self._done)
        except OSError:
            return []
        for name in names:
            self._done.add(name)
            try:
                msg = json.loads((self.dir / name).read_text())
                os.unlink(self.dir / name)
            except (OSError, ValueError) as e:
                log.info("order message %s unreadable: %s", name, e)
                continue
            self._take(msg, now)
        return self._complete(now)

    def learn(self, files: np.ndarray, tags: np.ndarray,
              pids: np.ndarray | None = None) -> list[tuple[int, EpochOrder]]:
        """Catalogued opens made while the hook's tag named a sample index
        (a drained batch: it holds every open posted before the epoch
        messages read so far); then the epochs of learnt mappings that
        waited for them."""
        spaces, indices = split_tags(tags)
        files = np.asarray(files, np.int64)
        self.opened_in = np.full(len(files), -1, np.int64)
        for space in np.unique(spaces).tolist():
            learner = self.learners.get(space)
            if learner is not None and space not in self.clashes:
                mine = spaces == space
                live = self.lives.get(space)
                if live is not None:
                    live.learn(learner, indices[mine], files[mine])
                else:
                    learner.learn(indices[mine], files[mine])
                if pids is not None:
                    learner.check_fetches(indices[mine], files[mine], np.asarray(pids, np.int64)[mine], self._dirs)
                    if learner.mixed():
                        self._mixed(space, learner)
                        continue
                self._epochs_of(space, np.flatnonzero(mine), indices, files, tags, learner)
        return self._complete(time.monotonic(), drained=True)

    def _epochs_of(self, space: int, at: np.ndarray, indices: np.ndarray, files: np.ndarray, tags: np.ndarray,
                   learner: Learner) -> None:
        """Which epoch each of these tagged opens read (opened_in): the one
        before the epoch being learnt (its last samples, drained late), that
        epoch, or the next (read before its order came in)."""
        for ep in (self.previous.get(space), self.lives.get(space)):
            if ep is None or not len(at):
                continue
            inside = ep.read(indices[at], files[at], tags[at], learner)
            self.opened_in[at] = np.where(inside, ep.epoch, ep.epoch + 1)
            at = at[~inside]

    def _mixed(self, space: int, learner: Learner) -> None:
        """Two data sets learn in one space (one class and length, and the
        same string attributes): their files would mix per index; the space
        is not learnt, its loaders fall back to first touch."""
        self.clashes.add(space)
        self.lives.pop(space, None)
        self.previous.pop(space, None)
        assert learner.stray is not None
        i, a, b = learner.stray
        why = (f"two data sets share a tag space (one class, one length): index {i} opened "
               f"{self.catalog.source_path(self.catalog.files[a])} in one fetch and "
               f"{self.catalog.source_path(self.catalog.files[b])} in another "
               f"({learner.strays} of {learner.fetches} fetches); the mapping is not learnt")
        for loader in self.loaders.values():
            if loader.space == space:
                loader.why = why
        log.info("order hook: %s; prefetching follows first touch (give each data set a root attribute "
                 "of its own, or the order with --order-file)", why)

    def taught_by_another(self, key: int) -> bool:
        """Whether the mapping loader `key` reads by was learnt from another
        DataLoader's opens (a pass before training, the loader of an earlier
        epoch when a script makes one per epoch)."""
        loader = self.loaders.get(key)
        learner = self._learner(loader) if loader is not None else None
        return learner is not None and learner.loader is not None and learner.loader != key

    def refused(self) -> bool:
        """Whether the main loader's tag space was found shared by two data sets."""
        loader = self.loaders.get(self.main) if self.main is not None else None
        return loader is not None and loader.space in self.clashes and not loader.maps_by_rank

    def _error(self, text: str) -> None:
        if text not in self.errors:
            self.errors.append(text)
            log.warning("order hook: %s", text)

    def _take(self, msg: dict, now: float) -> None:
        kind = msg.get("kind")
        key = int(msg.get("loader", 0))
        loader = self.loaders.setdefault(key, _Loader(key))
        rank = int(msg.get("rank", 0))
        if kind == "error":
            self._error(str(msg.get("message", "unknown problem")))
        elif kind == "dataset":
            self._dataset(loader, rank, msg)
            self._choose_main()
        elif kind == "epoch":
            epoch = int(msg["epoch"])
            loader.pending.setdefault(epoch, {})[rank] = msg
            loader.first_seen.setdefault(epoch, now)
            loader.polled.setdefault(epoch, self._polls)
            loader.announced = self._epochs_announced
            self._epochs_announced += 1
            learner = self._learner(loader)
            if learner is not None and learner.epoch is None:
                learner.epoch = epoch   # the epoch that learns: what is learnt before it starts is planned
                learner.loader = key

    def _dataset(self, loader: _Loader, rank: int, msg: dict) -> None:
        """The mapping read from an attribute if it checks out, else the
        tag space to learn it in."""
        paths = msg.get("paths")
        loader.ranks.add(rank)
        loader.why = msg.get("why")
        if paths is not None:
            index_map, ids = self._index_map(paths)
            problem = check_attribute(ids)
            if problem is None:
                loader.maps_by_rank[rank] = index_map
                loader.how = str(msg.get("how"))
                return
            if not (ids >= 0).any():
                first = paths[0] if paths and isinstance(paths[0], str) else (paths[0] or [""])[0]
                problem = f"its files (e.g. {first}) are not under any --data directory"
            loader.why = f"attribute {msg.get('how')}: {problem}"
        learn = msg.get("learn")
        if not learn:
            self._error(f"cannot map the data set to files ({loader.why}); prefetching follows first touch")
            return
        space, length = int(learn["space"]), int(learn["length"])
        learner = self.learners.setdefault(space, Learner(length))
        if learner.length != length:
            self.clashes.add(space)
            loader.why = "two data sets of different lengths share a tag space"
        loader.space = space

    def _index_map(self, paths: list[str | list[str]]) -> tuple[IndexMap, np.ndarray]:
        """The mapping of an attribute's paths, one per index or several
        (an image and its mask), and the catalog ids of every path named in
        index order (-1: not catalogued) for check_attribute; an index's
        file named twice counts once."""
        singles = [p for p in paths if isinstance(p, str)]
        if len(singles) == len(paths):
            ids = np.fromiter((self.paths.id_of(p) for p in singles), np.int64, len(singles))
            return IndexMap.one_each(ids), ids
        per = [list(dict.fromkeys([p] if isinstance(p, str) else p)) for p in paths]
        counts = np.fromiter(map(len, per), np.int64, len(per))
        ids = np.fromiter((self.paths.id_of(q) for p in per for q in p), np.int64, int(counts.sum()))
        keep = ids >= 0
        index_of = np.repeat(np.arange(len(per), dtype=np.int64), counts)
        offsets = np.zeros(len(per) + 1, np.int64)
        np.cumsum(np.bincount(index_of[keep], minlength=len(per)), out=offsets[1:])
        return IndexMap(offsets, ids[keep]), ids

    def _learner(self, loader: _Loader) -> Learner | None:
        if loader.space is None or loader.space in self.clashes or loader.maps_by_rank:
            return None
        return self.learners.get(loader.space)

    def _mapped(self, loader: _Loader) -> int:
        if loader.maps_by_rank:
            return max(m.mapped for m in loader.maps_by_rank.values())
        learner = self._learner(loader)
        return learner.learnt if learner is not None else 0

    def _choose_main(self) -> None:
        """The loader whose stream is planned: the one with the most indices
        mapped (the training set, not a smaller validation set); among equals
        (DataLoaders over one data set: a pass for its statistics before
        training, an evaluation on it) the one that announced an epoch last,
        the one being read now."""
        if self.loaders:
            best = max(self.loaders.values(), key=lambda ld: (self._mapped(ld), ld.announced))
            if self._mapped(best) > 0:
                self.main = best.key

    def _complete(self, now: float, drained: bool = False) -> list[tuple[int, EpochOrder]]:
        out: list[tuple[int, EpochOrder]] = []
        self._choose_main()
        for loader in self.loaders.values():
            learner = self._learner(loader)
            for epoch in sorted(loader.pending):
                msgs = loader.pending[epoch]
                ranks = loader.ranks or {0}
                if set(msgs) < ranks and now - loader.first_seen[epoch] < MERGE_WAIT:
                    continue  # the other ranks' orders are on their way
                if learner is not None and epoch == learner.epoch:
                    if drained:
                        continue   # planned from what was learnt when it started, by the poll that read it
                elif learner is not None and not drained and loader.polled[epoch] >= self._polls:
                    break     # the previous epoch's last opens are drained first: their tags teach
                del loader.pending[epoch]
                self._follow_learning(loader, learner, epoch, msgs)
                maps = self._maps(loader, learner)
                order = self._merge(maps, msgs, "indices")
                known = all(m.get("next") is not None for m in msgs.values())
                nxt = self._merge(maps, msgs, "next") if known else None
                if learner is not None and not len(order):
                    if epoch > (learner.epoch or 0) and not learner.learnt:
                        self._error(f"no catalogued file was opened inside dataset[i] in epoch {epoch}: the "
                                    "mapping from indices to files cannot be learnt (the data set reads its files "
                                    "elsewhere: in __init__, a thread, a batch fetch?); prefetching follows first "
                                    "touch; give the order with --order-file, or use --warm")
                    continue  # nothing learnt yet: first touch meanwhile
                out.append((loader.key, EpochOrder(epoch, order, nxt)))
        return out

    def _follow_learning(self, loader: _Loader, learner: Learner | None, epoch: int,
                         msgs: dict[int, dict]) -> None:
        """The epoch now read, as indices, while its mapping is incomplete
        (NOTE [learnt mapping], "The epoch being learnt")."""
        if learner is None or loader.space is None:
            return
        space = self._last_space = loader.space
        live = self.lives.pop(space, None)
        if live is not None and live.loader == loader.key:
            self.previous[space] = live
        else:
            self.previous.pop(space, None)
        if learner.learnt >= learner.length:
            return
        known = all(m.get("next") is not None for m in msgs.values())
        live = self.lives[space] = LiveEpoch(loader.key, epoch, space, self._indices(msgs, "indices"),
                                             self._indices(msgs, "next") if known else None, learner.length)
        live.start(learner)

    def live(self) -> LiveEpoch | None:
        """The epoch being learnt of the main loader's tag space (of the
        space announced last while no loader has a mapping)."""
        loader = self.loaders.get(self.main) if self.main is not None else None
        space = loader.space if loader is not None else self._last_space
        return self.lives.get(space) if space is not None else None

    @staticmethod
    def _indices(msgs: dict[int, dict], field_name: str) -> np.ndarray:
        return interleave([np.asarray(msgs[r][field_name], np.int64) for r in sorted(msgs)])

    def replan(self, share: float, least: int) -> tuple[int, EpochOrder] | None:
        """The rest of the epoch being learnt, when enough of its positions
        ahead of the reader have become known since it was last planned:
        (loader key, the files of its positions known and not read yet, and
        the next epoch's with the mapping as it is now)."""
        live = self.live()
        learner = self.learners.get(live.space) if live is not None else None
        if live is None or learner is None or live.space in self.clashes or not live.due(learner, share, least):
            return None
        if live.gain < max(1, live.length // 1024):
            return None     # (next to) nothing ahead that the plan does not hold: a new plan costs more
        indices = live.upcoming(learner)
        live.planned(learner)
        m = learner.index_map()
        nxt = m.order(live.next) if live.next is not None else None
        return live.loader, EpochOrder(live.epoch, m.order(indices), nxt)

    @staticmethod
    def _maps(loader: _Loader, learner: Learner | None) -> dict[int, IndexMap]:
        if learner is not None:
            return {0: learner.index_map()}
        return loader.maps_by_rank

    @staticmethod
    def _merge(maps: dict[int, IndexMap], msgs: dict[int, dict], field_name: str) -> np.ndarray:
        """One node reads the union of its ranks' streams, about in lockstep:
        interleave them position by position."""
        streams = []
        none = IndexMap.one_each(np.zeros(0, np.int64))
        for rank in sorted(msgs):
            m = maps.get(rank) or next(iter(maps.values()), none)
            streams.append(m.order(np.asarray(msgs[rank][field_name], dtype=np.int64)))
        return interleave(streams)

    def learnt(self) -> bool:
        """Whether the main loader's indices map to files through what the
        tagged opens taught (not through an attribute)."""
        loader = self.loaders.get(self.main) if self.main is not None else None
        return loader is not None and self._learner(loader) is not None

    def still_learning(self) -> bool:
        """Whether the main loader's mapping is learnt and some of its
        indices have not been seen opening a file yet."""
        loader = self.loaders.get(self.main) if self.main is not None else None
        learner = self._learner(loader) if loader is not None else None
        return learner is not None and learner.learnt < learner.length

    def mapping(self) -> dict[str, Any]:
        """How the main loader's indices were mapped to files, for the
        summary: source is "attribute NAME", "learnt in epoch N" or "none: why"."""
        loader = self.loaders.get(self.main) if self.main is not None else None
        if loader is None:
            loader = next(iter(self.loaders.values()), None)
        if loader is None:
            return {"source": NO_LOADER, "indices": 0, "mapped": 0}
        if loader.maps_by_rank:
            m = next(iter(loader.maps_by_rank.values()))
            return {"source": f"attribute {loader.how}", "indices": len(m), "mapped": m.mapped}
        learner = self._learner(loader)
        if learner is not None and learner.learnt:
            return {"source": f"learnt in epoch {(learner.epoch or 0) + 1}", "indices": learner.length,
                    "mapped": learner.learnt, "tagged_opens": learner.opens}
        why = loader.why or "unknown"
        if learner is not None:
            why = (f"{why}; no catalogued file was opened inside dataset[i] (the data set reads its files "
                   "elsewhere: in __init__, a thread, a batch fetch?)")
        return {"source": f"none: {why}", "indices": learner.length if learner else 0, "mapped": 0}
