"""Queued copies (NOTE [queued copies]): the files next in a tier's queue
are QUEUED on their state words; an open of one steps back its open count
and waits for the copy (within the daemon's bound), so that the copy, not
the open, reads the file from the PFS; a bound that passes, a cancelled
queue or a write open ends the wait, and the file is then read once, by
the open."""
from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
from test_one_read import Job, answer, ask, end

from helpers import PYTHON, wait_for
from tiering.placement import daemon as daemon_mod
from tiering.placement import queued as queued_mod
from tiering.placement.index import lib
from tiering.placement.tiers import BATCH_BYTES, BATCH_FILES, WAITS_COPIES

QUEUED_RAM = lib.TIERING_STATE_QUEUED | 1


def states(job: Job, rels: list[str]) -> list[int]:
    return [job.index.state(job.slot[r]) for r in rels]


def queued_job(tmp_path, n: int) -> tuple[Job, dict[str, int], list[str]]:
    """A job of n small files, two PFS slots, every file placed (the daemon
    not started): all of them within the queue's window."""
    files = {f"d/f{k}.bin": 3000 + k for k in range(n)}
    job = Job(tmp_path, files, threads=2, start=False)
    rels = sorted(files)
    assert job.d.place_many(np.array([job.i[r] for r in rels], np.int64), 0).all()
    return job, files, rels


def test_only_the_head_of_the_queue_is_marked_and_every_mark_goes_with_its_copy(tmp_path):
    """One PFS slot: the small files among the first QUEUE_WINDOW_ROUNDS
    of the queue are QUEUED, the others NONE; a large file (copied alone, unclaimed) is never
    marked; a worker's batch is marked as far as its copies are made within
    the bound; once the copies ran every file is published and no mark is
    left."""
    files = {f"d/f{k:03d}.bin": 1000 + k for k in range(40)} | {"d/large.bin": BATCH_BYTES + 10}
    job = Job(tmp_path, files, threads=1, start=False)
    try:
        rels = sorted(files)
        order = ["d/large.bin"] + [r for r in rels if r != "d/large.bin"]
        assert job.d.place_many(np.array([job.i[r] for r in order], np.int64), 0).all()
        window = daemon_mod.QUEUE_WINDOW_ROUNDS * 1
        small = order[1:]
        # the window is the queue's first positions, the large file's among them
        assert states(job, small[:window - 1]) == [QUEUED_RAM] * (window - 1)
        assert set(states(job, small[window - 1:])) == {lib.TIERING_STATE_NONE}
        assert job.index.state(job.slot["d/large.bin"]) == lib.TIERING_STATE_NONE
        job.d.start()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert states(job, rels) == [1] * len(rels)
        # the batch's next copies were marked as the worker took it (and the later ones as it went)
        assert not job.d._marks.marked.any() and job.d._marks.count >= queued_mod.QUEUE_BATCH_MARKS
        assert all((job.tier.data / "0" / r).read_bytes() == job.contents[r] for r in rels)
        assert job.d.stats.pfs_opens == len(rels) and job.d.stats.claims_read == 0
    finally:
        job.close()


def test_an_open_of_a_queued_file_waits_for_its_copy_which_is_the_files_one_read(tmp_path):
    """The reader opens a queued file before any copy ran: it waits with its
    open count stepped back (the entry's counter reads 0 meanwhile), the
    copy claims it (the counter did not move), makes it and wakes the open,
    which is served the copy: the PFS read once, by the copy."""
    job, files, rels = queued_job(tmp_path, 6)
    try:
        rel = rels[2]
        assert job.index.state(job.slot[rel]) == QUEUED_RAM
        job.index.set_copy_wait(120.0, 120.0)   # far longer than the test: the copy's wake ends the wait
        p = job.reader()
        ask(p, job.root / rel)
        wait_for(lambda: int(job.index.header.copy_waits) == 1, "the open to wait for the queued copy")
        assert int(job.index.opens[job.slot[rel]]) == 0
        job.d.start()
        where, digest = answer(p)
        end(p)
        assert where == str(job.tier.data / "0" / rel) and digest == job.digest(rel)
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        c = job.index.counters()
        assert c["opens_pfs"] == 0 and c["opens_tier"] == [1] and int(job.index.opens[job.slot[rel]]) == 1
        assert job.d.stats.claims_read == 0 and job.d.stats.pfs_opens == len(files)
        assert job.d.stats.pfs_bytes == sum(files.values())
    finally:
        job.close()


def test_an_open_reads_the_pfs_after_the_bound_and_the_claim_sees_it(tmp_path):
    """A queued copy that does not start within queue_wait_ns: the open is
    counted again and reads the data file after the bound; the copy's claim
    then sees the open and does not read the file now (the data set fits:
    it is made after the others, for later uses).  No queue bound: no
    wait."""
    job, files, rels = queued_job(tmp_path, 6)
    try:
        job.index.set_copy_wait(0.2, 0.0)
        p = job.reader()
        ask(p, job.root / rels[0])
        assert answer(p) == (str(job.root / rels[0]), job.digest(rels[0]))
        assert int(job.index.header.copy_waits) == 0
        job.index.set_copy_wait(0.2, 0.3)
        t0 = time.monotonic()
        ask(p, job.root / rels[1])
        assert answer(p) == (str(job.root / rels[1]), job.digest(rels[1]))
        waited = time.monotonic() - t0
        end(p)
        assert waited >= 0.3 and int(job.index.header.copy_waits) == 1
        assert int(job.index.opens[job.slot[rels[1]]]) == 1
        assert states(job, rels[:2]) == [QUEUED_RAM] * 2
        job.d.start()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert job.d.stats.claims_read == 2
        assert states(job, rels) == [1] * len(rels) and not job.d._marks.marked.any()
    finally:
        job.close()


def test_a_stop_or_a_write_open_ends_the_wait_for_a_queued_copy(tmp_path):
    """Two opens wait for queued copies (bounds of two minutes): a write
    open of one file wakes its waiter at once (the file is invalid); the
    daemon's stop cancels the queue, which puts the marks back to NONE and
    wakes the other.  Both read the data files, long before the bound; an
    open after a dead daemon's marks does not wait."""
    job, files, rels = queued_job(tmp_path, 4)
    try:
        job.index.set_copy_wait(120.0, 120.0)
        t0 = time.monotonic()
        p = job.reader()
        ask(p, job.root / rels[0])
        wait_for(lambda: int(job.index.header.copy_waits) == 1, "the open to wait for the queued copy")
        w = subprocess.run([PYTHON, "-c", f"import os; os.close(os.open({str(job.root / rels[0])!r}, os.O_WRONLY))"],
                           env=job.env, capture_output=True, text=True, timeout=60)
        assert w.returncode == 0, w.stderr
        assert answer(p) == (str(job.root / rels[0]), job.digest(rels[0]))
        assert job.index.state(job.slot[rels[0]]) == lib.TIERING_STATE_INVALID
        ask(p, job.root / rels[1])
        wait_for(lambda: int(job.index.header.copy_waits) == 2, "the open to wait for the queued copy")
        with job.d._lock:
            job.d._cancel_queued()
        assert answer(p) == (str(job.root / rels[1]), job.digest(rels[1]))
        assert time.monotonic() - t0 < 60
        assert states(job, rels[1:]) == [lib.TIERING_STATE_NONE] * 3 and not job.d._marks.marked.any()
        end(p)
        # a daemon killed with its marks set: an open does not wait for them
        assert job.index.cas_state(job.slot[rels[2]], lib.TIERING_STATE_NONE, QUEUED_RAM)
        dead = subprocess.Popen(["true"])
        dead.wait()
        job.index.header.daemon_pid = dead.pid
        p = job.reader()
        ask(p, job.root / rels[2])
        assert answer(p) == (str(job.root / rels[2]), job.digest(rels[2]))
        end(p)
        assert int(job.index.header.copy_waits) == 2
    finally:
        job.close()


def test_where_the_data_set_does_not_fit_no_copy_is_marked(tmp_path):
    """Tiers smaller than the data set: the claims alone keep each use read
    once (a copy the reader read first is not made), and an open does not
    wait for queued copies, which there are made only as the reader frees
    room: every state stays NONE until its copy runs."""
    files = {f"d/f{k}.bin": 1000 + k for k in range(20)}
    job = Job(tmp_path, files, threads=1, start=False, capacity=12 * 4096)
    try:
        placed = [rel for rel in sorted(files) if job.d.place(job.i[rel], 0)]
        assert len(placed) == 12 and job.d._marks.window == 0
        assert set(states(job, sorted(files))) == {lib.TIERING_STATE_NONE}
        job.d.start()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert states(job, placed) == [1] * len(placed) and job.d._marks.count == 0
    finally:
        job.close()


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
        # the queue's head marked when placed (now the batch's first files), the batch's next ones,
        # the queue's new head: far from the batch's BATCH_FILES
        assert marked <= 2 * window + queued_mod.QUEUE_BATCH_MARKS < BATCH_FILES // 8, marked
        release.set()
        wait_for(lambda: not job.d.copies_in_flight(), "the copies to settle")
        assert [job.index.state(job.slot[r]) for r in rels] == [1] * len(rels)
        assert not job.d._marks.marked.any()
    finally:
        release.set()
        job.close()
