"""The copy of files onto a tier (placement/tiers.py, shim/tiercopy.c):
small files many to one call of the C routine, others one per call, large
ones in parallel chunks (NOTE [copy in C], NOTE [batch copy], NOTE [chunked
copy])."""
from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from test_daemon import Setup

from helpers import EVENT_TIMEOUT, private_dir, staged, wait_for
from tiering.catalog import scan
from tiering.placement.daemon import Daemon
from tiering.placement.index import ffi, lib
from tiering.placement.tiers import (
    BATCH_DTYPE,
    BATCH_FILES,
    SHARE_FILES,
    BatchSource,
    PfsReads,
    SourceChanged,
    TierState,
    copy_batch,
    copy_file,
)

MIB = 1 << 20


def _tier(tmp: Path, chunked_mb: int = 1, threads: int = 3) -> TierState:
    return TierState("ram", "memory", private_dir(tmp / "tier"), 1 << 30, threads,
                     chunked_bytes=chunked_mb * MIB, chunk_threads=threads)


def _source(tmp: Path, sizes: dict[str, int]) -> tuple[Path, dict[str, bytes]]:
    data = tmp / "pfs"
    contents = {}
    for rel, size in sizes.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        contents[rel] = os.urandom(size)
        (data / rel).write_bytes(contents[rel])
    return data, contents


@pytest.fixture
def reads():  # type: ignore[no-untyped-def]
    """copy_file's PFS slots and chunk pool, as a daemon of 3 PFS threads has."""
    r = PfsReads(3)
    yield r
    r.close()


def _file(data: Path, rel: str):  # type: ignore[no-untyped-def]
    return next(f for f in scan([str(data)]).files if f.rel == rel)


@pytest.mark.parametrize("size", [0, 1, 4096, 5 * MIB + 12345, 3 * MIB])
def test_copies_are_byte_equal_in_one_call_or_in_chunks(tmp_path, reads, size):
    data, contents = _source(tmp_path, {"d/f.bin": size})
    tier = _tier(tmp_path)
    f = _file(data, "d/f.bin")
    read: list[int] = []
    lock = threading.Lock()

    def on_read(n: int) -> None:
        with lock:
            read.append(n)
    used = copy_file(str(data / "d/f.bin"), f, tier, threading.Event(), on_read, reads)
    copy = tier.copy_path(f)
    assert copy.read_bytes() == contents["d/f.bin"]
    assert used == copy.stat().st_blocks * 512
    assert copy.stat().st_mode & 0o777 == 0o400
    assert sum(read) == size
    if size >= MIB:
        assert len(read) >= 3        # one range per thread at least
    assert staged(tier.staging) == []


def test_a_chunked_copy_is_invisible_until_complete(tmp_path, reads):
    data, contents = _source(tmp_path, {"big.bin": 6 * MIB})
    tier = _tier(tmp_path)
    f = _file(data, "big.bin")
    entered, release = threading.Event(), threading.Event()

    def on_read(n: int) -> None:
        entered.set()
        release.wait(60)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(copy_file(str(data / "big.bin"), f, tier,
                                                                threading.Event(), on_read, reads)))
    t.start()
    try:
        assert entered.wait(60)
        assert not tier.copy_path(f).exists()                   # nothing under the final name
        assert [p.suffix for p in staged(tier.staging)] == [".part"]
    finally:
        release.set()
        t.join(60)
    assert isinstance(result[0], int)
    assert tier.copy_path(f).read_bytes() == contents["big.bin"]


@pytest.mark.parametrize("size", [5 * MIB, 1000])
def test_a_stop_halfway_leaves_nothing(tmp_path, reads, size):
    data, _ = _source(tmp_path, {"big.bin": size})
    tier = _tier(tmp_path)
    f = _file(data, "big.bin")
    stop = threading.Event()
    assert copy_file(str(data / "big.bin"), f, tier, stop, lambda n: stop.set(), reads) is None
    assert not tier.copy_path(f).exists()
    assert staged(tier.staging) == []


@pytest.mark.parametrize("chunked_mb", [1, 64], ids=["chunks", "one-call"])
@pytest.mark.parametrize("change", ["grew", "shrank"])
def test_a_source_growing_or_shrinking_while_copied_is_refused(tmp_path, reads, chunked_mb, change):
    """Both paths (the C routine in one call, the chunks between its open and
    finish steps): the source changes after the first step of the copy; 10
    MiB is more than one step of the C routine (8 MiB)."""
    size = 10 * MIB
    data, _ = _source(tmp_path, {"big.bin": size})
    tier = _tier(tmp_path, chunked_mb=chunked_mb)
    f = _file(data, "big.bin")
    changed = threading.Event()

    def on_read(n: int) -> None:
        if not changed.is_set():
            changed.set()
            with open(data / "big.bin", "r+b") as out:
                if change == "grew":
                    out.seek(0, os.SEEK_END)
                    out.write(b"z" * MIB)
                else:
                    out.truncate(size - 3 * MIB)
    # the chunks of a shrinking file may all have been read before the cut:
    # then the check after the copy sees it
    either = "|changed since the scan" if chunked_mb == 1 and change == "shrank" else ""
    with pytest.raises(SourceChanged, match=f"big.bin ({change} while it was copied{either})"):
        copy_file(str(data / "big.bin"), f, tier, threading.Event(), on_read, reads)
    assert changed.is_set()
    assert not tier.copy_path(f).exists()
    assert staged(tier.staging) == []


def _replace(path: Path, change: str) -> None:
    """What another process does to a source while its copy is in flight:
    renames a new file over it (the atomic-save idiom) or removes it."""
    if change == "renamed over":
        new = path.with_suffix(".tmp")
        new.write_bytes(b"new bytes")
        os.replace(new, path)
    else:
        path.unlink()


@pytest.mark.parametrize("chunked_mb", [1, 64], ids=["chunks", "one-call"])
@pytest.mark.parametrize("change", ["renamed over", "removed"])
def test_a_source_renamed_over_while_copied_is_not_published(tmp_path, reads, chunked_mb, change):
    """NOTE [renamed while copied]: the copy read the old file to its end
    through its fd, whose size and mtime still match; the path names
    another file (or none) by the time the copy would be renamed into place."""
    data, _ = _source(tmp_path, {"big.bin": 3 * MIB})
    tier = _tier(tmp_path, chunked_mb=chunked_mb)
    f = _file(data, "big.bin")
    changed = threading.Event()

    def on_read(n: int) -> None:         # between a step of the copy and its finish
        if not changed.is_set():
            changed.set()
            _replace(data / "big.bin", change)
    with pytest.raises(SourceChanged, match="big.bin was renamed over or removed while it was copied"):
        copy_file(str(data / "big.bin"), f, tier, threading.Event(), on_read, reads)
    assert changed.is_set()
    assert not tier.copy_path(f).exists()
    assert staged(tier.staging) == []


@pytest.mark.slow
def test_a_chunked_copy_that_fails_to_start_a_helper_ends_only_when_no_helper_copies(tmp_path, reads, monkeypatch):
    """A helper of the chunk pool that cannot be started (a limit on threads)
    fails the copy; the copy ends (closing its descriptors) only once no
    helper copies a range through them any more: a helper's write through a
    number that another copy reused would corrupt that copy."""
    from tiering.placement import tiers
    data, _ = _source(tmp_path, {"big.bin": 6 * MIB})
    tier = _tier(tmp_path)
    f = _file(data, "big.bin")
    entered, release = threading.Event(), threading.Event()
    real_submit, real_range = reads.submit, tiers._copy_range
    submitted = [0]

    def submit(fn):  # type: ignore[no-untyped-def]
        submitted[0] += 1
        if submitted[0] > 1:
            assert entered.wait(60)      # the first helper is copying a range
            raise RuntimeError("can't start new thread")
        real_submit(fn)

    def copy_range(*args):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("tiering-chunk"):
            entered.set()
            release.wait(60)
        return real_range(*args)
    monkeypatch.setattr(reads, "submit", submit)
    monkeypatch.setattr(tiers, "_copy_range", copy_range)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            copy_file(str(data / "big.bin"), f, tier, threading.Event(), lambda n: None, reads)
        except RuntimeError as e:
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    try:
        assert entered.wait(60)
        t.join(1.0)                      # a bound: the copy waits for its helper
        assert t.is_alive(), "the copy ended while a helper was copying through its descriptors"
    finally:
        release.set()
        t.join(60)
    assert [str(e) for e in errors] == ["can't start new thread"]
    assert not tier.copy_path(f).exists() and staged(tier.staging) == []


@pytest.mark.parametrize("size", [5 * MIB, 1000])
def test_an_error_of_the_counting_callback_reaches_the_caller(tmp_path, reads, size):
    data, _ = _source(tmp_path, {"big.bin": size})
    tier = _tier(tmp_path)
    f = _file(data, "big.bin")

    def on_read(n: int) -> None:
        raise RuntimeError("counting failed")
    with pytest.raises(RuntimeError, match="counting failed"):
        copy_file(str(data / "big.bin"), f, tier, threading.Event(), on_read, reads)
    assert not tier.copy_path(f).exists()
    assert staged(tier.staging) == []


class HeldDaemon(Daemon):
    """Its copies wait after their first step until released."""
    entered = threading.Event()
    release = threading.Event()

    def _count_read(self, n: int) -> None:
        super()._count_read(n)
        HeldDaemon.entered.set()
        HeldDaemon.release.wait(60)


def test_the_daemon_publishes_a_large_copy_only_when_complete_and_stop_removes_it(tmp_path):
    """A reader that opens the file while its chunks are copied finds no copy
    in the index (it reads the PFS); stop() ends the copy and removes its
    staging file."""
    HeldDaemon.entered.clear()
    HeldDaemon.release.clear()
    s = Setup(tmp_path, {"big.bin": 3 * MIB, "small.bin": 100}, daemon_cls=HeldDaemon)
    try:
        s.tier.chunked_bytes, s.tier.chunk_threads = MIB, 3
        assert s.d.place(s.i["big.bin"], 0)
        assert HeldDaemon.entered.wait(60)
        assert s.state("big.bin") == lib.TIERING_STATE_NONE
        assert not (s.tier.data / "0" / "big.bin").exists()
        stopper = threading.Thread(target=s.d.stop, kwargs={"timeout": 60})
        stopper.start()
        wait_for(lambda: s.d.stopping, "the stop")
        HeldDaemon.release.set()
        stopper.join(60)
        assert not s.d.copies_in_flight()
        assert s.state("big.bin") == lib.TIERING_STATE_NONE
        assert staged(s.tier.staging) == []
        assert not (s.tier.data / "0" / "big.bin").exists()
        assert s.tier.used == 0 and s.tier.files == 0
    finally:
        HeldDaemon.release.set()
        s.d.stop()
        s.index.close()


def test_every_read_of_a_chunked_copy_takes_a_pfs_slot_beside_small_copies(tmp_path, monkeypatch):
    """The PFS reads of all copy workers share one semaphore, the ranges of a
    chunked copy too: with 2 PFS threads, a file copied in 4 chunks beside
    small copies never has more than 2 reads of the PFS at once.  Each read
    waits (bounded, generously) until the slots have been full once; after
    that each lingers a little, so that a read beyond them would show (a
    busy host can only hide an overlap then, never make one up)."""
    from tiering.placement import tiers
    slots = 2
    cond = threading.Condition()
    now, peak = [0], [0]

    def counted(fn):  # type: ignore[no-untyped-def]
        def read(*args):  # type: ignore[no-untyped-def]
            with cond:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
                cond.notify_all()
                if peak[0] < slots:
                    cond.wait_for(lambda: peak[0] >= slots, timeout=EVENT_TIMEOUT)
                else:
                    cond.wait_for(lambda: now[0] >= slots, timeout=0.2)
            try:
                return fn(*args)
            finally:
                with cond:
                    now[0] -= 1
        return read
    monkeypatch.setattr(tiers, "_copy_range", counted(tiers._copy_range))
    monkeypatch.setattr(tiers, "_transfer", counted(tiers._transfer))
    monkeypatch.setattr(tiers, "_transfer_many", counted(tiers._transfer_many))
    files = {"big.bin": 4 * MIB, **{f"s{k}.bin": 1000 + k for k in range(8)}}
    s = Setup(tmp_path, files, pfs_threads=slots, threads=4)
    try:
        s.tier.chunked_bytes, s.tier.chunk_threads = MIB, 4
        for rel in files:
            assert s.d.place(s.i[rel], 0)
        s.wait()
        for rel in files:
            assert s.state(rel) == 1
            assert (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert peak[0] == slots
    finally:
        s.close()


# -- small files in batches (NOTE [batch copy]) ------------------------------------------

def _batch(tmp: Path, sizes: dict[str, int], roots: int = 1):  # type: ignore[no-untyped-def]
    """A catalog of `roots` data roots holding the files `sizes` each, a
    tier, and a BatchSource over them with a stop flag."""
    datas, contents = [], {}
    for r in range(roots):
        data, c = _source(tmp / f"root{r}", sizes)
        datas.append(data)
        contents.update({(r, rel): v for rel, v in c.items()})
    cat = scan([str(d) for d in datas])
    stop = ffi.new("int32_t *")
    return cat, contents, _tier(tmp), BatchSource(cat.files, cat.roots, stop), stop


def _copied(ids: np.ndarray, source: BatchSource, tier: TierState, parts: list[int] | None = None,
            waits: list[int] | None = None) -> np.ndarray:
    """copy_batch's outcomes of ids, joined (parts: the length of each;
    waits: the times the thread waited in each)."""
    got: list[np.ndarray] = []
    waited: list[int] = []

    def done(out: np.ndarray, w: int) -> None:
        got.append(out)
        waited.append(w)
    copy_batch(ids, source, tier, done)
    if parts is not None:
        parts.extend(len(g) for g in got)
    if waits is not None:
        waits.extend(waited)
    out = np.concatenate(got) if got else np.zeros(0, BATCH_DTYPE)
    assert out["id"].tolist() == ids.tolist()    # every file once, in order
    return out


def test_a_batch_copies_files_of_many_directories_and_roots_byte_equal(tmp_path):
    sizes = {f"c{k % 7}/deep/er/f{k}.bin": 37 * k for k in range(40)} | {"top.bin": 5000, "e.bin": 0}
    cat, contents, tier, source, _ = _batch(tmp_path, sizes, roots=2)
    ids = np.arange(len(cat.files), dtype=np.int64)
    seen = 0
    for part in np.array_split(ids, -(-len(ids) // BATCH_FILES)):
        out = _copied(part, source, tier)
        assert out["id"].tolist() == part.tolist()
        assert (out["status"] == lib.TIERING_COPY_OK).all(), out
        for (i, copied, blocks) in zip(part.tolist(), out["copied"].tolist(), out["blocks"].tolist()):
            f = cat.files[i]
            copy = tier.copy_path(f)
            assert copy.read_bytes() == contents[(f.root, f.rel)]
            assert copied == f.size and blocks == copy.stat().st_blocks
            assert copy.stat().st_mode & 0o777 == 0o400
            seen += 1
    assert seen == len(sizes) * 2
    # the directories it made are private, whatever the umask
    assert all(d.stat().st_mode & 0o777 == 0o700 for d in tier.data.rglob("*") if d.is_dir())
    assert staged(tier.staging) == []


def test_a_batch_goes_on_past_files_that_cannot_be_copied(tmp_path):
    """A vanished source, one changed since the scan and one replaced by a
    symlink each get their own status; the files around them are copied."""
    sizes = {f"d/f{k}.bin": 1000 + k for k in range(6)}
    cat, contents, tier, source, _ = _batch(tmp_path, sizes)
    root = Path(cat.roots[0])
    (root / "d/f1.bin").unlink()
    (root / "d/f3.bin").write_bytes(b"other bytes")
    (root / "d/f4.bin").unlink()
    (root / "d/f4.bin").symlink_to(root / "d/f5.bin")
    ids = np.array([next(i for i, f in enumerate(cat.files) if f.rel == rel) for rel in sizes], np.int64)
    out = _copied(ids, source, tier)
    assert out["status"].tolist() == [lib.TIERING_COPY_OK, lib.TIERING_COPY_SOURCE_ERROR, lib.TIERING_COPY_OK,
                                      lib.TIERING_COPY_CHANGED, lib.TIERING_COPY_NOT_REGULAR, lib.TIERING_COPY_OK]
    assert out["error"][1] == errno.ENOENT
    for k, rel in enumerate(sizes):
        copy = tier.data / "0" / rel
        assert copy.exists() == (out["status"][k] == lib.TIERING_COPY_OK)
        if copy.exists():
            assert copy.read_bytes() == contents[(0, rel)]
    assert staged(tier.staging) == []


def test_a_batch_does_not_publish_a_source_renamed_over_while_copied(tmp_path):
    """NOTE [renamed while copied], in a batch: the file after the one being
    copied is renamed over from the copy's progress call."""
    sizes = {f"d/f{k}.bin": 1000 + k for k in range(3)}
    cat, contents, tier, source, _ = _batch(tmp_path, sizes)
    root = Path(cat.roots[0])
    ids = np.array([next(i for i, f in enumerate(cat.files) if f.rel == rel) for rel in sizes], np.int64)
    calls: list[int] = []

    @ffi.callback("int(void *, uint64_t)")
    def progress(arg, n):  # type: ignore[no-untyped-def]
        calls.append(n)
        if len(calls) == 2:           # in the middle file's copy
            _replace(root / "d/f1.bin", "renamed over")
        return 0
    source.fields["progress"] = progress
    out = _copied(ids, source, tier)
    assert out["status"].tolist() == [lib.TIERING_COPY_OK, lib.TIERING_COPY_REPLACED, lib.TIERING_COPY_OK]
    assert not (tier.data / "0/d/f1.bin").exists()
    for rel in ("d/f0.bin", "d/f2.bin"):
        assert (tier.data / "0" / rel).read_bytes() == contents[(0, rel)]
    assert staged(tier.staging) == []


def test_a_stopped_batch_tries_nothing_more_and_leaves_nothing(tmp_path):
    sizes = {f"f{k}.bin": 2000 for k in range(10)}
    cat, _, tier, source, stop = _batch(tmp_path, sizes)
    stop[0] = 1
    waits: list[int] = []
    out = _copied(np.arange(10, dtype=np.int64), source, tier, waits=waits)
    assert (out["status"] == lib.TIERING_COPY_STOPPED).all() and out["copied"].sum() == 0
    assert waits == [-1]     # nothing tried: no measure of the copies' waits (NOTE [batch share])
    assert list(tier.data.rglob("*")) == [] and staged(tier.staging) == []
    with pytest.raises(ValueError, match="at most"):
        _copied(np.arange(BATCH_FILES + 1, dtype=np.int64) % 10, source, tier)


def test_a_batch_hands_back_its_copies_as_its_time_budget_runs_out(tmp_path, monkeypatch):
    """With a budget of 1 ns each C call copies one file and hands it back
    (to be published) before the next is copied."""
    from tiering.placement import tiers
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 1)
    sizes = {f"f{k}.bin": 100 * k for k in range(7)}
    cat, contents, tier, source, _ = _batch(tmp_path, sizes)
    parts: list[int] = []
    out = _copied(np.arange(7, dtype=np.int64), source, tier, parts)
    assert parts == [1] * 7 and (out["status"] == lib.TIERING_COPY_OK).all()
    for f in cat.files:
        assert tier.copy_path(f).read_bytes() == contents[(0, f.rel)]


def test_a_batch_stopped_in_the_middle_of_a_file_removes_its_staging_file(tmp_path):
    """The C routine's progress function sees the stop between steps: the
    file being copied is not published and the rest is not tried."""
    sizes = {f"f{k}.bin": 3000 for k in range(4)}
    cat, _, tier, source, stop = _batch(tmp_path, sizes)
    calls = []

    def progress(arg, n):  # type: ignore[no-untyped-def]
        calls.append(n)
        if len(calls) == 2:      # the second file's first step
            stop[0] = 1
        return stop[0]
    cb = ffi.callback("int(void *, uint64_t)", progress)
    source.fields.update(progress=cb, arg=ffi.NULL)
    out = _copied(np.arange(4, dtype=np.int64), source, tier)
    assert out["status"].tolist() == [lib.TIERING_COPY_OK] + [lib.TIERING_COPY_STOPPED] * 3
    assert [p.name for p in tier.data.rglob("*.bin")] == [cat.files[0].rel]
    assert staged(tier.staging) == []


def test_a_batch_counts_the_times_its_thread_waited(tmp_path, monkeypatch):
    """The C routine reports the voluntary context switches of its call
    (NOTE [batch share]): at least one per file when each copy waits (here a
    progress function that sleeps, as a read of a PFS that answers late)."""
    import time

    from tiering.placement import tiers
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 0)     # one C call, one part
    sizes = {f"f{k}.bin": 500 for k in range(5)}
    cat, contents, tier, source, _ = _batch(tmp_path, sizes)
    waits: list[int] = []
    out = _copied(np.arange(5, dtype=np.int64), source, tier, waits=waits)
    assert (out["status"] == lib.TIERING_COPY_OK).all() and len(waits) == 1 and waits[0] >= 0

    def progress(arg, n):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        return 0
    cb = ffi.callback("int(void *, uint64_t)", progress)
    cat, contents, tier, source, _ = _batch(tmp_path / "slow", sizes)
    source.fields.update(progress=cb, arg=ffi.NULL)
    waits.clear()
    out = _copied(np.arange(5, dtype=np.int64), source, tier, waits=waits)
    assert (out["status"] == lib.TIERING_COPY_OK).all() and sum(waits) >= 5, waits
    for f in cat.files:
        assert tier.copy_path(f).read_bytes() == contents[(0, f.rel)]


def test_a_worker_takes_its_share_of_the_queue_or_a_whole_batch_by_the_copies_waits():
    """NOTE [batch share]: not known yet or waiting, the queue is shared out
    among the idle workers (at most SHARE_FILES each); copies that do not
    wait go BATCH_FILES to a call."""
    from tiering.placement.tiers import WAITS_QUICK, batch_share
    assert batch_share(1000, 3, -1) == SHARE_FILES and batch_share(100, 3, -1) == 25
    assert batch_share(1000, 3, 2.0) == SHARE_FILES and batch_share(10, 7, 2.0) == 2
    assert batch_share(1, 7, 2.0) == 1 and batch_share(1, 0, -1) == 1
    assert batch_share(1000, 3, 0.0) == BATCH_FILES and batch_share(1000, 3, WAITS_QUICK) == BATCH_FILES
    assert batch_share(100, 3, 0.0) == 100 and batch_share(1000, 3, WAITS_QUICK * 1.01) == SHARE_FILES


def test_the_average_of_the_waits_weighs_each_copy():
    """NOTE [batch share]: a part whose waits are not known (a stopped
    rest, -1) or that tried nothing leaves the average as it was; the first
    part sets it; then each copy weighs 1/WAITS_COPIES, so that one copy
    moves it little and a whole batch nearly replaces it."""
    from tiering.placement.tiers import WAITS_COPIES, waits_average
    assert waits_average(0.0, 0, -1, 10) == (0.0, 0) and waits_average(0.5, 80, 3, 0) == (0.5, 80)
    assert waits_average(0.0, 0, 6, 3) == (2.0, 3)
    one, seen = waits_average(0.0, 100, 1, 1)
    assert one == pytest.approx(1 / WAITS_COPIES) and seen == 101
    whole, seen = waits_average(0.0, 100, BATCH_FILES, BATCH_FILES)
    assert whole > 0.95 and seen == 100 + BATCH_FILES
    assert waits_average(2.0, 100, -1, 64) == (2.0, 100)


@pytest.mark.parametrize("per_copy", [0, 3])
def test_the_daemon_sizes_its_batches_by_the_waits_of_its_copies(tmp_path, monkeypatch, per_copy):
    """The waits the C routine reports (here set to `per_copy` per file)
    go into the tier's average, which sizes the batches the workers take
    next: whole batches when the copies do not wait, shares of at most
    SHARE_FILES when they do.  Every file is published byte-equal."""
    from tiering.placement import tiers
    calls: list[int] = []
    real = tiers._transfer_many

    def many(b, files, n):  # type: ignore[no-untyped-def]
        calls.append(n)
        k = real(b, files, n)
        b.waits = per_copy * k
        return k
    monkeypatch.setattr(tiers, "_transfer_many", many)
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 0)     # one C call, one part, per batch
    files = {f"d{k % 9}/f{k}.bin": 50 + k for k in range(700)}
    s = Setup(tmp_path, files, pfs_threads=2, threads=2)
    try:
        s.d.close_pools()
        for rel in files:
            assert s.d.place(s.i[rel], 0)
        s.d.start_pools()
        s.wait()
        assert s.d.stats.copies == len(files) and sum(calls) == len(files)
        for rel in files:
            assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert calls[0] == SHARE_FILES and s.d._waits[0] == (per_copy, len(files))
        assert max(calls) == (BATCH_FILES if per_copy == 0 else SHARE_FILES), calls
    finally:
        s.close()


def test_the_daemon_copies_queued_small_files_in_batches(tmp_path, monkeypatch):
    """Small files queued together are copied many to a C call, a file of
    BATCH_BYTES or more on its own; every one is published byte-equal."""
    from tiering.placement import tiers
    calls: list[int] = []
    single: list[int] = []
    real_many, real_one = tiers._transfer_many, tiers._transfer

    def many(b, files, n):  # type: ignore[no-untyped-def]
        calls.append(n)
        return real_many(b, files, n)

    def one(*args):  # type: ignore[no-untyped-def]
        single.append(1)
        return real_one(*args)
    monkeypatch.setattr(tiers, "_transfer_many", many)
    monkeypatch.setattr(tiers, "_transfer", one)
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 0)     # one C call per batch
    files = {f"d{k % 5}/f{k}.bin": 100 + k for k in range(300)} | {"medium.bin": tiers.BATCH_BYTES}
    s = Setup(tmp_path, files, pfs_threads=2, threads=2)
    try:
        s.d.close_pools()       # everything queued before a worker looks
        for rel in files:
            assert s.d.place(s.i[rel], 0)
        s.d.start_pools()
        s.wait()
        assert s.d.stats.copies == len(files) and s.d.stats.copy_failures == 0
        assert s.d.stats.pfs_opens == len(files) and s.d.stats.pfs_bytes == sum(files.values())
        for rel in files:
            assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        # shared out between the two workers while the copies' waits are not known (NOTE [batch share])
        assert calls[0] == SHARE_FILES and sum(calls) == 300, calls
        assert len(calls) <= 300 // 32, calls
        assert single == [1]
        assert s.tier.used == sum(p.stat().st_blocks * 512 for p in s.tier.data.rglob("*") if p.is_file())
    finally:
        s.close()


def test_a_batch_publishes_its_copies_but_those_written_meanwhile(tmp_path, monkeypatch):
    """One batch of small copies, published together (Daemon._publish):
    a file whose entry the shim marked invalid, and one a write event
    invalidated while it was queued, are not published and their copies
    are gone; the others are published byte-equal, and the tier's counts
    and bytes are those of the copies left on disk."""
    from tiering.placement import tiers
    calls: list[int] = []
    real = tiers._transfer_many
    monkeypatch.setattr(tiers, "_transfer_many", lambda b, files, n: calls.append(n) or real(b, files, n))
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 0)     # one C call, one settling, per batch
    files = {f"d{k % 3}/f{k}.bin": 300 + 7 * k for k in range(40)}
    s = Setup(tmp_path, files, pfs_threads=1, threads=1)
    try:
        s.d.close_pools()
        for rel in files:
            assert s.d.place(s.i[rel], 0)
        marked, written = "d1/f4.bin", "d2/f8.bin"
        assert s.index.cas_state(s.d.slots[s.i[marked]], 0, lib.TIERING_STATE_INVALID)
        s.d._invalidate(s.i[written])
        s.d.start_pools()
        s.wait()
        assert calls == [40]
        kept = [rel for rel in files if rel not in (marked, written)]
        assert s.d.stats.copies == len(kept) and s.tier.files == len(kept)
        assert s.tier.placed_bytes == sum(files[rel] for rel in kept)
        for rel in kept:
            assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert s.state(marked) == lib.TIERING_STATE_INVALID and s.state(written) == lib.TIERING_STATE_NONE
        assert not (s.tier.data / "0" / marked).exists() and not (s.tier.data / "0" / written).exists()
        assert [s.d.where(s.i[r]) for r in (marked, written)] == [-1, -1]
        assert s.tier.used == sum(p.stat().st_blocks * 512 for p in s.tier.data.rglob("*") if p.is_file())
        assert s.d._allocated[[s.i[r] for r in kept]].min() > 0 and s.d._allocated[s.i[marked]] == -1
    finally:
        s.close()


def test_copies_placed_in_one_turn_of_the_event_thread_wake_the_workers_once(tmp_path, monkeypatch):
    """The policy places its copies one by one; inside the event thread's
    turn (Daemon._waking_later) no worker is woken until the turn ends, so
    the queue is shared out in whole batches, not one copy to the first
    worker woken."""
    from tiering.placement import tiers
    calls: list[int] = []
    real = tiers._transfer_many
    monkeypatch.setattr(tiers, "_transfer_many", lambda b, files, n: calls.append(n) or real(b, files, n))
    monkeypatch.setattr(tiers, "BATCH_BUDGET_NS", 0)
    files = {f"d{k % 3}/f{k}.bin": 200 + k for k in range(256)}
    s = Setup(tmp_path, files, pfs_threads=4, threads=4)
    try:
        wait_for(lambda: s.d._idle[0] == 4, "the four workers idle")
        with s.d._waking_later():
            for rel in files:
                assert s.d.place(s.i[rel], 0)
            assert s.d._running == 0 and len(s.d._queued[0]) == len(files)   # nobody woken yet
        s.wait()
        for rel in files:
            assert s.state(rel) == 1 and (s.tier.data / "0" / rel).read_bytes() == s.contents[rel]
        assert sum(calls) == len(files) and len(calls) <= 8, calls
    finally:
        s.close()


# -- the profile key -----------------------------------------------------------------

def test_chunked_copy_mb_is_read_from_the_profile_with_a_default(tmp_path):
    from tiering.profile import ProfileError, load_profile, model
    path = tmp_path / "p.yaml"
    path.write_text(f"name: t\ntiers:\n  - {{name: a, kind: filesystem, path: {tmp_path}, capacity: 1MiB, "
                    "chunked_copy_mb: 16}\n"
                    f"  - {{name: b, kind: filesystem, path: {tmp_path}, capacity: 1MiB}}\n")
    p = load_profile(str(path))
    assert [t.chunked_copy_mb for t in p.tiers] == [16, model.DEFAULT_CHUNKED_COPY_MB] == [16, 64]
    for bad in ("0", "1.5", "big"):
        path.write_text(f"name: t\ntiers:\n  - {{name: a, kind: filesystem, path: {tmp_path}, capacity: 1MiB, "
                        f"chunked_copy_mb: {bad}}}\n")
        with pytest.raises(ProfileError, match=r"tiers\[0\]\.chunked_copy_mb: must be a whole number"):
            load_profile(str(path))


# -- the policy thread hands copies to the daemon in batches ------------------------------

def test_landed_copies_are_followed_by_new_ones_in_batches_not_one_by_one() -> None:
    import numpy as np
    from test_event_batches import FakePlacement

    from tiering.clairvoyant.feeds import ListFeed
    from tiering.clairvoyant.policy import Clairvoyant
    n = 5000
    order = np.random.default_rng(3).permutation(n)
    fake = FakePlacement(n, 10 * 4096 * n)
    policy = Clairvoyant(fake, ListFeed(iter([order])))  # type: ignore[arg-type]
    policy.start()
    assert len(fake.pending) == policy.in_flight
    issued = policy.fetches
    for _ in range(policy.refill - 1):        # each landing alone issues nothing
        f = fake.pending.pop(0)
        fake.placed.append(f)
        policy.on_placed(f, 0)
        assert policy.fetches == issued
    f = fake.pending.pop(0)
    fake.placed.append(f)
    policy.on_placed(f, 0)                     # the batch: the queue is full again
    assert policy.fetches == issued + policy.refill and len(fake.pending) == policy.in_flight
    policy.poll()                              # every turn of the event thread issues what has room
    assert len(fake.pending) == policy.in_flight
