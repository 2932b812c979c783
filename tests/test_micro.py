"""Smoke test of the shim microbenchmark (bench/micro.py driving bench/micro.c):
every configuration runs and reports positive figures, and the redirected opens
really got the tier copy.  Correctness only: no assertion on any timing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cc

REPO = Path(__file__).resolve().parent.parent

EXPECTED = {
    "noshim_outside", "noshim_source", "noshim_direct",
    "shim1k_outside", "shim1k_miss", "shim1k_redirected", "shim1k_relative",
    "shim1M_outside", "shim1M_miss", "shim1M_redirected", "shim1M_relative",
    "read_direct", "read_redirected",
    "nosys", "own1k_outside", "own1k_miss", "own1k_redirected",
    "own1M_outside", "own1M_miss", "own1M_redirected",
    "noshim_stat", "noshim_stat_outside", "shim1k_stat", "shim1k_stat_outside", "shim1M_stat",
    "shim1M_stat_outside",
}
REDIRECTED = {"shim1k_redirected", "shim1k_relative", "shim1M_redirected", "shim1M_relative",
              "read_redirected", "own1k_redirected", "own1M_redirected"}


@pytest.mark.slow
def test_micro_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "bench.micro", "--quick", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "redirected − direct /dev/shm open" in p.stdout  # the table is printed
    result = json.loads((out / "micro.json").read_text())
    md = (out / "micro.md").read_text()
    assert "| delta |" in md

    machine = result["machine"]
    assert machine["cpu"] and machine["kernel"] and machine["glibc"]
    settings = result["settings"]
    repeats = settings["repeats"]
    assert settings["iterations"] > 0 and settings["index_sizes"] == [1000, 1_000_000]
    work = settings["work_dir"]
    assert not os.path.exists(work), "scratch directory left behind"

    configs = result["configurations"]
    assert set(configs) == EXPECTED
    assert set(result["summary"]) == EXPECTED
    for name, c in configs.items():
        runs = [m for m in result["measurements"] if m["config"] == name]
        assert sorted(m["repeat"] for m in runs) == list(range(repeats)), name
        for m in runs:
            # micro.c checked /proc/self/fd before timing; the record says what it saw
            assert m["target"] == c["expect"], (name, m["target"], c["expect"])
            if m["mode"] in ("open", "stat"):
                assert m["ns"] > 0 and m["ns_min"] > 0, name
                assert len(m["batch_ns"]) == m["batches"] and min(m["batch_ns"]) > 0, name
                assert m["iterations"] > 0
            else:
                assert m["mode"] == "read"
                assert m["mb_s"] > 0 and m["bytes"] == settings["read_bytes"], name
        assert result["summary"][name]["median"] > 0, name
        # with the shim, where the opened path is in the data root
        assert (c["entries"] is None) == name.startswith(("noshim", "read_direct", "nosys")), name
        # the shim's own cost is timed with open/close stubbed out (bench/nosys.c)
        assert c["nosys"] == name.startswith(("own", "nosys")), name

    tier = os.path.join(work, "tier") + os.sep
    data = os.path.join(work, "pfs", "data") + os.sep
    for name in REDIRECTED:
        c = configs[name]
        opened = os.path.join(c["cwd"], c["path"]) if c["cwd"] else c["path"]
        assert opened.startswith(data), (name, opened)
        assert c["expect"].startswith(tier), (name, c["expect"])
    for name in ("shim1k_miss", "shim1M_miss", "own1k_miss", "own1M_miss"):
        assert configs[name]["expect"] == configs[name]["path"]
        assert configs[name]["path"].startswith(data)
    for name in ("shim1k_outside", "noshim_outside"):
        assert not configs[name]["path"].startswith(data)
    assert configs["shim1k_redirected"]["expect"] == configs["noshim_direct"]["path"]
    assert configs["own1M_redirected"]["expect"] == configs["noshim_direct"]["path"]

    deltas = result["deltas"]
    for key in ("outside_minus_noshim", "miss_minus_noshim", "redirected_minus_direct",
                "relative_minus_direct", "relative_minus_redirected",
                "own_outside", "own_miss", "own_redirected", "stat_index_minus_kernel",
                "stat_outside_minus_noshim"):
        for tag in ("1k", "1M"):
            d = deltas[f"{key}_{tag}"]
            assert len(d["per_repeat"]) == repeats and isinstance(d["ns"], float)
    assert deltas["read_throughput_ratio"]["ratio"] > 0
    assert deltas["stat_speedup_1M"]["ratio"] > 0 and len(deltas["stat_speedup_1k"]["per_repeat"]) == repeats
    for name in ("shim1k_stat", "shim1M_stat", "noshim_stat"):
        assert configs[name]["mode"] == "stat" and configs[name]["path"].startswith(data), name
    assert "shim code alone: redirected" in md


def test_nosys_stub_skips_the_kernel(tmp_path: Path) -> None:
    """bench/nosys.c: the first open is real (micro.c checks it), later ones
    return the fake descriptor without opening anything."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc
    lib = tmp_path / "libnosys.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(REPO / "bench" / "nosys.c")],
                   check=True)
    prog = tmp_path / "p.c"
    prog.write_text('''#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int a = open(argv[1], O_RDONLY), b = open(argv[1], O_RDONLY), c = open("/no/such/file", O_RDONLY);
    char buf[4] = {0};
    printf("%d %d %d %zd %d\\n", a >= 0 && a != 900, b, c, read(a, buf, 3), close(b));
    return 0;
}
''')
    subprocess.run([cc, "-o", str(tmp_path / "p"), str(prog)], check=True)
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    r = subprocess.run([str(tmp_path / "p"), str(f)], env={**os.environ, "LD_PRELOAD": str(lib)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "900", "900", "3", "0"]


@pytest.mark.slow
def test_micro_c_refuses_wrong_target(tmp_path: Path) -> None:
    """The C program exits 3 when the descriptor does not point where --expect says."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc
    binary = tmp_path / "micro"
    subprocess.run([cc, "-O2", "-o", str(binary), str(REPO / "bench" / "micro.c")], check=True)
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    ok = subprocess.run([str(binary), "open", str(f), "--iterations", "100", "--expect",
                         os.path.realpath(f)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout)
    assert rec["target"] == os.path.realpath(f) and rec["ns"] > 0
    bad = subprocess.run([str(binary), "open", str(f), "--iterations", "100", "--expect",
                          str(tmp_path / "elsewhere")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 3, (bad.returncode, bad.stderr)
    rd = subprocess.run([str(binary), "read", str(f), "--chunk", "64", "--passes", "2"],
                        capture_output=True, text=True, timeout=60)
    assert rd.returncode == 0 and json.loads(rd.stdout)["bytes"] == 100
