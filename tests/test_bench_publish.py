"""bench.publish runs each way of publishing a copy and every one leaves
exactly the files it was asked for, under their final names, complete, and
nothing else (times are reported, never asserted)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import ext4mem
from bench.publish import MODES
from helpers import BENCH_TIMEOUT, PYTHON, REPO


def leftovers() -> set[str]:
    """What the benchmark could leave in /dev/shm: its directories, its source, an ext4 image."""
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(("tiering-publish-", "tiering-bench-"))}


@pytest.mark.slow
def test_every_mode_publishes_every_file_complete_and_leaves_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "results"
    before = leftovers()
    r = subprocess.run([PYTHON, "-m", "bench.publish", "--files", "1500", "--size", "3000", "--rounds", "2",
                        "--dir", str(tmp_path), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=BENCH_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "publish.json").read_text())
    names = [fs["name"] for fs in res["file_systems"]]
    assert names[0].endswith(f" ({tmp_path})") and names[1] == "tmpfs (/dev/shm)"
    assert ("ext4 on a loop device in /dev/shm" in names) == (ext4mem.unavailable() is None)
    for fs in res["file_systems"]:
        assert len(fs["rounds"]) == 2
        for rnd in fs["rounds"]:
            assert sorted(rnd) == sorted(MODES)
            for rec in rnd.values():   # two directories: 1,000 files and 500
                assert rec["files"] == 1500 and rec["published"] == 1500 and rec["left_over"] == 0
                assert rec["seconds"] > 0
        assert fs["modes"]["create"]["ratio_to_create"] == 1.0
    assert (out / "publish.md").read_text().count("\n|") == 2 + 4 * len(names)
    assert [p.name for p in tmp_path.iterdir()] == ["results"]   # every round's directory removed
    assert leftovers() == before                                  # nor anything in /dev/shm
    assert "tiering-publish-" not in Path("/proc/mounts").read_text()   # its ext4 unmounted
