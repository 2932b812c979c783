"""The sizes of a catalog scanned names first, taken while COMMAND runs
(NOTE [names first] in docs/design.md).

A cold start-up lists the data set and writes the shared index from the
names alone (every entry incomplete: the shim passes it through); COMMAND
starts; this thread then stats the files in parallel batches, fills the
catalog's columns and completes the index entry by entry, ends the fill
(the files opened for writing meanwhile are invalidated by identity) and
only then hands over to `then(place)`, which writes the catalog cache and,
unless COMMAND is done already (place False), builds and starts the
placement.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from .catalog import Catalog, save_in_child
from .catalog.scan import stat_deferred
from .command import as_plain_child, ignored_at_start
from .placement.index import SharedIndex, lib

log = logging.getLogger("tiering")

FillProgress = Callable[[int, int, int], None]    # files stat'ed, of files, their bytes
GATE_ENV = "TIERING_FILL_GATE"   # tests: the fill waits while this path exists (a fill slowed at will)


class SizeFill:
    """One fill; start() after COMMAND is forked, stop() before the index
    is closed (idempotent, waits for the thread)."""

    def __init__(self, cat: Catalog, index: SharedIndex, slots: np.ndarray, threads: int,
                 then: Callable[[bool], None], progress: FillProgress | None = None):
        assert cat.deferred is not None, "a catalog scanned names first"
        self.cat, self.index, self.slots, self.threads = cat, index, slots, threads
        self.then, self.progress = then, progress
        self.total = int(cat.deferred.pending.sum())
        self.saves = cat.deferred.saves  # the cache writes that wait for the sizes
        self.stat_ed = 0
        self.bytes = 0
        self.gone = 0
        self.complete = False            # every size known and the index whole
        self.seconds = 0.0               # from start to complete
        self.done = threading.Event()    # the thread ended (complete, stopped or failed)
        self._stop = threading.Event()      # stop reading the sizes
        self._no_then = threading.Event()   # read them, but place nothing (COMMAND is done)
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tiering-fill", daemon=True)
        self._thread.start()

    def stop(self, grace: float = 0.0) -> None:
        """No placement from now on; the sizes still being read are left
        up to grace seconds to finish (the report counts them), then the
        reading stops too.  Returns once the thread ended."""
        self._no_then.set()
        if self._thread is not None:
            self._thread.join(grace)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def cache_aside(self) -> int | None:
        """After stop(): when the sizes were not all read, a forked child
        reads the rest and writes the catalog cache, at nice 10, on its own
        (nobody waits for it: the next run finds the cache once it is done);
        its pid, or None when there is nothing to write."""
        saves, self.saves = self.saves, []
        if self.complete or not saves or self.cat.deferred is None:
            return None
        cat, threads = self.cat, self.threads
        gone = [0]

        def count(filled: np.ndarray, lost: np.ndarray) -> None:
            gone[0] += len(lost)

        # a file gone at its stat (removed, or the data root unmounted meanwhile) would be cached
        # with size 0, and the next run would find it changed: no cache then (the next run scans)
        return save_in_child(saves, self.writer_prepare,
                             first=lambda: stat_deferred(cat, threads, count) and not gone[0])

    def writer_prepare(self) -> None:
        """In the catalog cache writer the fill forks (here or once the sizes
        are known): the signals as COMMAND has them, and no mapping of the
        index (the writer may outlive the job: it must not keep the memory
        of the index the teardown removed)."""
        as_plain_child(ignored_at_start())
        self.index.unmap_in_child()

    def _gate(self) -> None:
        gate = os.environ.get(GATE_ENV)
        while gate and os.path.lexists(gate) and not self._stop.wait(0.02):
            pass

    def _run(self) -> None:
        try:
            if self.progress is not None:
                self.progress(0, self.total, 0)
            self._gate()
            if not stat_deferred(self.cat, self.threads, self._batch, self._stop.is_set):
                return     # stopped: the index stays filling (nothing served, write opens logged)
            self._end_fill()
            if self.complete:
                self.then(not self._no_then.is_set())
        except Exception as e:   # never the job's failure: COMMAND reads the PFS
            log.warning("reading the data set's sizes failed (%r): COMMAND reads everything from the PFS", e)
            self.index.set_disabled(True)
        finally:
            self.done.set()

    def _batch(self, filled: np.ndarray, gone: np.ndarray) -> None:
        self.index.complete(self.slots, self.cat, filled)
        for i in gone.tolist():   # gone or replaced since the listing: never served
            slot = int(self.slots[i])
            self.index.cas_state(slot, self.index.state(slot), lib.TIERING_STATE_INVALID)
        self.stat_ed += len(filled) + len(gone)
        self.gone += len(gone)
        self.bytes += int(self.cat.files.size[filled].sum())
        if self.progress is not None:
            self.progress(self.stat_ed, self.total, self.bytes)

    def _end_fill(self) -> None:
        written = self.index.filled()
        if written < 0:
            why = "the log of write opens overflowed" if written == -2 else "a write open did not finish its log entry"
            log.warning("the files written while the sizes were read cannot be known (%s): COMMAND reads "
                        "everything from the PFS", why)
            self.index.set_disabled(True)
            return
        if written:
            log.info("%d catalogued paths were written while the sizes were read: never served from the tiers",
                     written)
        if self.gone:
            log.warning("%d files were gone or no longer regular files when their sizes were read: "
                        "never served from the tiers", self.gone)
        self.complete = True
        self.seconds = time.monotonic() - self._t0
