"""Ordinary tools under tier-run see the data set as it is (NOTE [served
descriptors] in docs/design.md): tar (and tar -S of a sparse file), cp, cp -p
and rsync -a read every file from the tier copies, twice (the second run with the catalog from the
scan cache), and make what they make without tier-run: the same archive,
byte for byte, and copies of the sources' modes and modification times."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, make_data, profile, tier_run

pytestmark = pytest.mark.usefixtures("no_leftovers")

FILES = {f"c{i % 3}/f{i:03d}.bin": 2000 + 997 * i for i in range(24)}
FILES["big/large.bin"] = 3 << 20          # copied on its own, not in a batch
MODES = (0o644, 0o600, 0o444, 0o640, 0o755)

# The tools, run by COMMAND once every file has its copy (tiering_where),
# each one's exit status and stderr into out/status.json.
TOOLS = r'''
import ctypes, json, os, subprocess, sys, time
data, out = sys.argv[1], sys.argv[2]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
where = getattr(ctypes.CDLL(None), "tiering_where", None)
if where is not None:
    where.argtypes, where.restype = [ctypes.c_char_p], ctypes.c_int
    deadline = time.monotonic() + 120
    while any(where(p.encode()) < 0 for p in files):
        if time.monotonic() > deadline:
            sys.exit("the copies did not all land within 120 s")
        time.sleep(0.05)
parent, name = os.path.split(data)
runs = {
    "tar": f"tar cf {out}/data.tar --sort=name -C {parent} {name}",
    "tar-S": f"tar cSf {out}/sparse.tar --sort=name -C {parent} {name}",
    "cp": f"cp {files[0]} {out}/one.bin",
    "cp-r": f"cp -r {data} {out}/cp-r",
    "cp-p": f"cp -p -r {data} {out}/cp-p",
    "rsync": f"rsync -a {data}/ {out}/rsync/",
}
status = {}
for key, cmd in runs.items():
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    status[key] = [r.returncode, r.stderr]
json.dump({"status": status, "served": where is not None}, open(f"{out}/status.json", "w"))
'''


def dataset(root: Path) -> dict[str, bytes]:
    contents = make_data(root, FILES)
    sparse = root / "big" / "sparse.bin"      # 8 MiB with two blocks of data (tar -S looks for holes)
    with open(sparse, "wb") as f:
        f.write(b"s" * 4096)
        f.seek(4 << 20)
        f.write(b"t" * 4096)
        f.truncate(8 << 20)
    contents["big/sparse.bin"] = sparse.read_bytes()
    for k, rel in enumerate(sorted(contents)):
        os.chmod(root / rel, MODES[k % len(MODES)])
        os.utime(root / rel, ns=(1_600_000_000_000_000_000 + k, 1_500_000_000_123_456_789 + 10**9 * k))
    for d in {root, *((root / rel).parent for rel in contents)}:
        os.utime(d, ns=(1_400_000_000 * 10**9,) * 2)   # old enough for the catalog to be cached
    return contents


def run_tools(tmp: Path, data: Path, out: Path, under: list[str] | None, env: dict[str, str]) -> dict:
    out.mkdir()
    script = tmp / "tools.py"
    script.write_text(TOOLS)
    cmd = [PYTHON, str(script), str(data), str(out)]
    if under is None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    else:
        r = tier_run([*under, "--", *cmd], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((out / "status.json").read_text())
    result["stderr"] = r.stderr
    return result


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file below root: mode, mtime and bytes."""
    got = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = Path(d, f)
            st = p.stat()
            got[str(p.relative_to(root))] = (st.st_mode & 0o7777, st.st_mtime_ns, p.read_bytes())
    return got


def test_tar_cp_and_rsync_make_what_they_make_without_tier_run(tmp_path, reliability):
    for tool in ("tar", "cp", "rsync"):
        assert shutil.which(tool), f"{tool} is needed (make test installs rsync)"
    data = tmp_path / "pfs" / "data"
    contents = dataset(data)
    sources = tree(data)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    direct = run_tools(tmp_path, data, tmp_path / "direct", None, env)
    assert not direct["served"]
    prof = profile(tmp_path)
    runs = []
    for k in range(2):
        stats = tmp_path / f"stats{k}.json"
        runs.append((run_tools(tmp_path, data, tmp_path / f"run{k}", ["--profile", str(prof), "--data", str(data),
                                                                     "--policy", "stage", "--stats-json",
                                                                     str(stats)], env),
                     json.loads(stats.read_text())))
    assert "catalog from cache" not in runs[0][0]["stderr"] and "catalog from cache" in runs[1][0]["stderr"]
    direct_tar = (tmp_path / "direct" / "data.tar").read_bytes()
    for k, (got, stats) in enumerate(runs):
        out = tmp_path / f"run{k}"
        assert got["served"]
        assert {key: s[0] for key, s in got["status"].items()} == dict.fromkeys(got["status"], 0), got["status"]
        # every file was read from its copy: five tools, each file once (cp of one file: once more)
        assert stats["opens"]["by_tier"]["ram"] >= 4 * len(contents) + 1, stats["opens"]
        assert (out / "data.tar").read_bytes() == direct_tar, f"run {k + 1}: the archive differs"
        assert (out / "sparse.tar").read_bytes() == (tmp_path / "direct" / "sparse.tar").read_bytes(), \
            f"run {k + 1}: the sparse archive differs"
        first = min(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
        assert (out / "one.bin").read_bytes() == Path(first).read_bytes()
        for copy in ("cp-p", "rsync"):
            assert tree(out / copy) == sources, f"run {k + 1}: {copy}"
        assert {r: (m, b) for r, (m, _, b) in tree(out / "cp-r").items()} == \
            {r: (m, b) for r, (m, _, b) in tree(tmp_path / "direct" / "cp-r").items()}
        reliability.checked(reads=4 * len(contents) + 1, nbytes=4 * sum(len(b) for b in contents.values()))
    reliability.survived("tar, cp, cp -p and rsync -a under tier-run twice, the second from the cached catalog "
                         "(same archive, modes and mtimes)")
