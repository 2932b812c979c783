"""Queued copies (NOTE [queued copies]) beyond tests/test_queued_copies.py:
the marks of a batch a worker takes."""
from __future__ import annotations

import threading

import numpy as np
from test_one_read import Job

from helpers import wait_for
from tiering.placement import daemon as daemon_mod
from tiering.placement import queued as queued_mod
from tiering.placement.index import lib
from tiering.placement.tiers import BATCH_FILES, WAITS_COPIES

QUEUED_RAM = lib.TIERING_STATE_QUEUED | 1


def test_a_batch_of_copies_that_do_not_wait_is_marked_only_as_far_as_the_bound(tmp_path):
    """Copies that do not wait (a source in the page cache): a worker takes
    BATCH_FILES of them in one run and makes them one after the other.  Only
    those it makes within an open's bound (QUEUE_WAIT_COPIES copies' time)
    are marked when it takes them, the next ones as it goes: marked all at
    once, the reader that reaches the batch waited for that one thread's
    copies, file after file (6,000 files of 20 kB, 4 reader threads: 0.9-1.2 s
    against 0.1-0.4 s without the batch's marks).  Every mark still goes."""
    files = {f"d/f{k:03d}.bin": 2000 + k for k in range(300)}
    job = Job(tmp_path, files, threads=1, start=False)
    release = threading.Event()
    real = job.d._copy_many

    def held(*args):   # type: ignore[no-untyped-def]
        assert release.wait(60)
        real(*args)
    try:
        job.d._copy_many = held
        job.d._waits[0] = (0.0, WAITS_COPIES)   # measured: the tier's copies do not wait
        rels = sorted(files)
        assert job.d.place_many(np.array([job.i[r] for r in rels], np.int64), 0).all()
        job.d.start()
        wait_for(lambda: job.d._running, "a worker to take a batch")
        assert job.d._running == BATCH_FILES
        marked = sum(job.index.state(job.slot[r]) == QUEUED_RAM for r in rels)
        window = daemon_mod.QUEUE_WINDOW_ROUNDS * 1
        assert marked <= window + queued_mod.QUEUE_WAIT_COPIES, marked
        release.set()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert [job.index.state(job.slot[r]) for r in rels] == [1] * len(rels)
        assert not job.d._marks.marked.any()
    finally:
        release.set()
        job.close()
