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

import numpy as np

from ..catalog import Catalog, PathIndex
from .samplers import interleave

log = logging.getLogger("tiering")

MERGE_WAIT = 1.0   # seconds to wait for the other local ranks' order of an epoch


@dataclass
class EpochOrder:
    epoch: int
    order: np.ndarray                   # catalog file ids, in read order
    next: np.ndarray | None = None      # the next epoch's order, when the hook could predict it


class ListFeed:
    """Epochs known in advance (a sampler given on the command line, an order
    file), computed one at a time as the policy asks for them."""

    def __init__(self, epochs: Iterator[np.ndarray]):
        self._epochs = epochs
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
    ids_by_rank: dict[int, np.ndarray] = field(default_factory=dict)   # dataset index -> catalog id (-1: none)
    mapped: int = 0
    pending: dict[int, dict[int, dict]] = field(default_factory=dict)  # epoch -> rank -> message
    first_seen: dict[int, float] = field(default_factory=dict)


class HookFeed:
    """Reads the hook's messages from the order directory."""

    def __init__(self, order_dir: Path, catalog: Catalog):
        self.dir = order_dir
        self.paths = PathIndex(catalog)
        self.loaders: dict[int, _Loader] = {}
        self.errors: list[str] = []
        self.main: int | None = None          # key of the loader whose stream is planned
        self._done: set[str] = set()

    def poll(self, now: float | None = None) -> list[tuple[int, EpochOrder]]:
        """New complete epochs, as (loader key, order), oldest first."""
        now = time.monotonic() if now is None else now
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

    def _take(self, msg: dict, now: float) -> None:
        kind = msg.get("kind")
        key = int(msg.get("loader", 0))
        loader = self.loaders.setdefault(key, _Loader(key))
        rank = int(msg.get("rank", 0))
        if kind == "error":
            text = str(msg.get("message", "unknown problem"))
            if text not in self.errors:
                self.errors.append(text)
                log.warning("order hook: %s", text)
        elif kind == "dataset":
            ids = np.fromiter((self.paths.id_of(p) for p in msg.get("paths", [])), np.int64)
            loader.ids_by_rank[rank] = ids
            loader.mapped = max(loader.mapped, int((ids >= 0).sum()))
            if loader.mapped == 0 and len(ids):
                text = (f"the data set's files (e.g. {msg['paths'][0]}) are not under any --data "
                        "directory; prefetching follows first touch")
                if text not in self.errors:
                    self.errors.append(text)
                    log.warning("order hook: %s", text)
            best = max(self.loaders.values(), key=lambda ld: ld.mapped)
            if best.mapped > 0:
                self.main = best.key
        elif kind == "epoch":
            epoch = int(msg["epoch"])
            loader.pending.setdefault(epoch, {})[rank] = msg
            loader.first_seen.setdefault(epoch, now)

    def _complete(self, now: float) -> list[tuple[int, EpochOrder]]:
        out: list[tuple[int, EpochOrder]] = []
        for loader in self.loaders.values():
            for epoch in sorted(loader.pending):
                msgs = loader.pending[epoch]
                ranks = set(loader.ids_by_rank) or {0}
                if set(msgs) < ranks and now - loader.first_seen[epoch] < MERGE_WAIT:
                    continue  # the other ranks' orders are on their way
                del loader.pending[epoch]
                order = self._merge(loader, msgs, "indices")
                known = all(m.get("next") is not None for m in msgs.values())
                nxt = self._merge(loader, msgs, "next") if known else None
                out.append((loader.key, EpochOrder(epoch, order, nxt)))
        return out

    @staticmethod
    def _merge(loader: _Loader, msgs: dict[int, dict], field_name: str) -> np.ndarray:
        """One node reads the union of its ranks' streams, about in lockstep:
        interleave them position by position."""
        streams = []
        none = np.zeros(0, np.int64)
        for rank in sorted(msgs):
            ids = loader.ids_by_rank.get(rank)
            if ids is None or not len(ids):
                ids = next(iter(loader.ids_by_rank.values()), none)
            idx = np.asarray(msgs[rank][field_name], dtype=np.int64)
            idx = idx[(idx >= 0) & (idx < len(ids))]
            got = ids[idx]
            streams.append(got[got >= 0])
        return interleave(streams)
