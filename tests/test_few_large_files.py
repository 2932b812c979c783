"""NOTE [few large files] (docs/design.md): a data set of a few large files
(HDF5, Arrow, LMDB, .npy: opened once and memory-mapped) is copied before
COMMAND starts where it fits, without --warm, and said so; where it does not
fit, or with --no-warm, one line says what --warm would do.  COMMAND maps
each file and reports whether its descriptor is a tier copy and what it read."""
from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import PYTHON, profile, tier_run
from tiering.clairvoyant.warm import FEW_FILES, LARGE_MEAN, few_large_files

SIZE = LARGE_MEAN + 4096      # each file just over the mean that counts as large
NAMES = ("train-00000.arrow", "train-00001.arrow", "train-00002.arrow")

MAPPER = textwrap.dedent("""
    import hashlib, json, mmap, os, sys
    data, out = sys.argv[1], sys.argv[2]
    res = {}
    for name in sorted(os.listdir(data)):
        with open(os.path.join(data, name), "rb") as f:
            where = os.readlink(f"/proc/self/fd/{f.fileno()}")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                res[name] = {"copy": not where.startswith(os.path.realpath(data) + "/"),
                             "digest": hashlib.sha256(m).hexdigest()}
    json.dump(res, open(out, "w"))
""")


def make_data(root: Path) -> dict[str, str]:
    """Sparse files of SIZE bytes with a few written blocks; their digests."""
    root.mkdir()
    digests = {}
    for k, name in enumerate(NAMES):
        p = root / name
        with open(p, "wb") as f:
            f.truncate(SIZE)
            for at in (0, SIZE // 2, SIZE - 100):
                f.seek(at)
                f.write(bytes([k + 1]) * 100)
        digests[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return digests


def run(tmp: Path, capacity: str, *extra: str, second: str | None = None) -> tuple[dict, dict, str, int]:
    data = tmp / "pfs"
    digests = make_data(data)
    out, stats = tmp / "out.json", tmp / "stats.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"))   # a cold scan: names first, then the sizes
    r = tier_run(["--profile", str(profile(tmp, capacity, second=second)), "--data", str(data), "--stats-json", str(stats),
                  *extra, "--", PYTHON, "-c", MAPPER, str(data), str(out)], env=env)
    if r.returncode:
        return {}, {}, r.stderr, r.returncode
    got = json.loads(out.read_text())
    assert {k: v["digest"] for k, v in got.items()} == digests   # the same bytes, whatever served them
    return got, json.loads(stats.read_text()), r.stderr, 0


@pytest.mark.slow
def test_a_few_large_files_that_fit_are_copied_before_command_opens_them(tmp_path):
    got, stats, err, code = run(tmp_path, "1GiB")
    assert code == 0, err
    assert "the data set is 3 large files" in err and "copied before COMMAND starts" in err
    assert all(v["copy"] for v in got.values()), got
    assert stats["warm"]["auto"] is True and stats["warm"]["files"] == 3
    assert stats["opens"]["pfs"] == 0 and sum(stats["opens"]["by_tier"].values()) == 3
    assert stats["few_large_files"] is True
    assert "without --warm: the data set is a few large files" in err
    # opened once each: no epoch rows counted from the opens, and the summary says why
    assert stats["epochs"] == [] and "epochs   not counted: the data set's 3 large files" in err


@pytest.mark.slow
def test_no_warm_starts_command_at_once_and_says_what_warm_would_do(tmp_path):
    got, stats, err, code = run(tmp_path, "1GiB", "--no-warm")
    assert code == 0, err
    # (copies made while COMMAND runs may serve some opens: the staging of a data set that fits)
    assert stats["warm"] is None and "copied before COMMAND starts" not in err
    assert "--warm copies them before COMMAND starts" in err


@pytest.mark.slow
def test_a_few_large_files_larger_than_the_tiers_are_not_warmed_and_the_line_says_why(tmp_path):
    got, stats, err, code = run(tmp_path, "48MiB")
    assert code == 0, err
    assert "more than a warm-up can copy" in err and "--warm copies what fits" in err
    assert stats["warm"] is None and stats["opens"]["pfs"] == 3


@pytest.mark.slow
def test_files_that_fit_the_tiers_only_in_sum_are_not_warmed(tmp_path):
    """Two tiers of 60 MiB hold 120 MiB, more than the 96 MiB of the three
    files, but one file each: no warm-up that would leave one out."""
    got, stats, err, code = run(tmp_path, "60MiB", second="60MiB")
    assert code == 0, err
    assert "more than a warm-up can copy" in err and "copied before COMMAND starts" not in err
    assert stats["warm"] is None


def test_warm_and_no_warm_together_are_an_error(tmp_path):
    _, _, err, code = run(tmp_path, "1GiB", "--warm", "--no-warm")
    assert code == 2 and "--warm and --no-warm" in err


def test_what_fits_whole():
    from tiering.clairvoyant.warm import fits_whole
    mib = 1 << 20
    assert fits_whole(np.array([40 * mib] * 3), [200 * mib])
    assert not fits_whole(np.array([40 * mib] * 3), [61 * mib, 62 * mib])      # 123 MiB in sum, 2 files
    assert fits_whole(np.array([40 * mib, 10 * mib, 10 * mib]), [41 * mib, 21 * mib])
    assert not fits_whole(np.array([100 * mib]), [100 * mib])                   # the margin
    assert fits_whole(np.zeros(0, np.int64), [])


def test_what_counts_as_a_few_large_files():
    big = np.full(3, LARGE_MEAN, np.int64)
    assert few_large_files(big)
    assert not few_large_files(big - 1)                                 # a mean below LARGE_MEAN
    assert not few_large_files(np.full(FEW_FILES + 1, LARGE_MEAN))      # too many files
    assert not few_large_files(np.zeros(0, np.int64))
    # one large file among small ones counts by the mean: 1 x 10 LARGE_MEAN + 9 x 0
    assert few_large_files(np.array([10 * LARGE_MEAN] + [0] * 9))


@pytest.mark.parametrize("n", [3])
def test_a_small_names_first_listing_is_stat_ed_before_command(tmp_path, n):
    """At most STAT_AT_ONCE files: the sizes are known before COMMAND (so a
    few large files can be warmed), not read while it runs."""
    from tiering.catalog import scan
    from tiering.catalog.scan import STAT_AT_ONCE
    assert n <= STAT_AT_ONCE
    make_data(tmp_path / "pfs")
    cat = scan([str(tmp_path / "pfs")], names_first=True)
    assert cat.deferred is None and sorted(cat.files.size.tolist()) == [SIZE] * n
