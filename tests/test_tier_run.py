"""tier-run end to end: a shuffled DataLoader over several epochs, the
policies, exit status, signals, clean-up and bad input."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import N_FILES, PYTHON, USER, dataset, digest, leftovers, make_data, profile, run_reader, tier_run

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.mark.parametrize("ctx", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_epochs_after_the_first_are_served_from_the_tier(tmp_path, ctx):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, rd, r = run_reader(tmp_path, data, profile(tmp_path),
                              reader_args=("--workers", "2", "--mp-context", ctx))
    assert rd["digest"] == digest(contents)             # the same bytes as the source
    ep = rd["epochs"]
    assert [e["opens"] for e in ep] == [N_FILES] * 3
    assert ep[0]["local"] == 0                          # first touch: nothing placed before it
    assert ep[1]["local"] + ep[2]["local"] >= 0.99 * 2 * N_FILES
    # the JSON agrees with what the reader saw
    local = sum(e["local"] for e in ep)
    assert stats["opens"]["total"] == 3 * N_FILES
    assert stats["opens"]["by_tier"] == {"ram": local}
    assert stats["opens"]["pfs"] == 3 * N_FILES - local
    assert stats["files"] == N_FILES and stats["bytes"] == sum(map(len, contents.values()))
    assert stats["tiers"][0]["files"] == N_FILES
    assert stats["tiers"][0]["bytes"] == stats["bytes"]
    assert stats["pfs"]["opens_by_daemon"] == N_FILES
    assert stats["pfs"]["bytes_read_by_daemon"] == stats["bytes"]
    assert stats["pfs"]["opens"] == stats["opens"]["pfs"] + N_FILES
    assert stats["pfs"]["bytes_avoided"] == sum(len(contents[f]) for e in ep for f in e["local_files"])
    assert stats["exit_code"] == 0 and stats["policy"] == "first-touch"
    assert stats["events_dropped"] == 0
    assert "from tiers" in r.stderr and "tier ram" in r.stderr


def test_partial_fit_serves_exactly_the_placed_files(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    total = sum(map(len, contents.values()))
    cap = total // 3
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path, capacity=str(cap)), "--keep",
                              reader_args=("--workers", "2"))
    tier_root = Path(stats["tiers"][0]["path"])
    try:
        placed = sorted(str(p.relative_to(tier_root / "data" / "0")) for p in (tier_root / "data" / "0").rglob("*") if p.is_file())
        for rel in placed:  # every copy is byte-identical to its source
            assert (tier_root / "data" / "0" / rel).read_bytes() == contents[rel]
    finally:
        # --keep left this job's directories (its pid is in their names); other
        # jobs of this user on the machine are not ours to remove
        job_pid = tier_root.name.split("-")[-2]
        shutil.rmtree(tier_root)
        for p in leftovers():
            if p.startswith(f"tiering-{USER}-{job_pid}-"):
                shutil.rmtree(Path("/dev/shm", p))
    assert 0 < len(placed) < N_FILES
    assert stats["tiers"][0]["files"] == len(placed)
    assert stats["tiers"][0]["used"] <= cap
    assert rd["epochs"][2]["local_files"] == placed      # exactly the placed files, nothing else
    assert set(rd["epochs"][1]["local_files"]) <= set(placed)
    assert rd["digest"] == digest(contents)


def test_two_tiers_fill_fastest_first(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    total = sum(map(len, contents.values()))
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path, capacity=str(total // 2), second="1GiB"),
                              reader_args=("--workers", "0"))
    ram, ssd = stats["tiers"]
    assert ram["files"] + ssd["files"] == N_FILES
    assert ram["used"] <= total // 2 and ram["files"] > 0 and ssd["files"] > 0
    assert stats["opens"]["by_tier"]["ram"] + stats["opens"]["by_tier"]["ssd"] >= 0.99 * 2 * N_FILES
    assert rd["digest"] == digest(contents)


def test_stage_copies_everything_at_start(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path), policy="stage", reader_args=("--workers", "0"))
    assert stats["tiers"][0]["files"] == N_FILES
    assert stats["pfs"]["opens_by_daemon"] == N_FILES
    assert rd["epochs"][1]["local"] == rd["epochs"][2]["local"] == N_FILES
    assert rd["digest"] == digest(contents)


def test_lru_evicts_to_stay_within_capacity(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    cap = sum(map(len, contents.values())) // 3
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path, capacity=str(cap)), policy="lru",
                              reader_args=("--workers", "0"))
    assert stats["placement"]["evictions"] > 0
    assert 0 < stats["tiers"][0]["used"] <= cap
    assert stats["placement"]["copies"] - stats["placement"]["evictions"] == stats["tiers"][0]["files"]
    assert rd["digest"] == digest(contents)


def test_off_places_nothing_but_counts(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data, n=50)
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path), policy="off", reader_args=("--workers", "0"))
    assert stats["tiers"][0]["files"] == 0
    assert stats["opens"] == {"total": 150, "pfs": 150, "by_tier": {"ram": 0}, "fallbacks": 0}
    assert sum(e["local"] for e in rd["epochs"]) == 0
    assert rd["digest"] == digest(contents)


def test_write_open_during_the_job_invalidates_the_copy(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=5)
    target = data / "c0" / "f0000.bin"
    script = f"""
import os, time, sys
p = {str(target)!r}
open(p, 'rb').read()
for _ in range(200):                       # wait for the first-touch copy
    with open(p, 'rb') as f:
        if not os.readlink(f'/proc/self/fd/{{f.fileno()}}').startswith({str(data)!r}):
            break
    time.sleep(0.02)
else:
    sys.exit('never placed')
with open(p, 'r+b') as f:
    f.write(b'CHANGED')
with open(p, 'rb') as f:
    where = os.readlink(f'/proc/self/fd/{{f.fileno()}}')
    assert f.read(7) == b'CHANGED', 'stale copy served'
assert where == p, where
"""
    stats_file = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats_file),
                  "--", PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    assert "none received: placed by first touch" in r.stderr   # a Python command without a DataLoader
    stats = json.loads(stats_file.read_text())
    assert stats["placement"]["write_opens"] == 1
    assert stats["placement"]["invalidated"] == 1
    assert stats["tiers"][0]["files"] == 0


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_tier_directories_are_private_whatever_the_umask(tmp_path, umask):
    """NOTE [tier roots]: the shim redirects only into 0700 tier roots."""
    data = tmp_path / "pfs"
    contents = dataset(data, n=5)
    target = data / "c0" / "f0000.bin"
    script = f"""
import json, os, sys, time
from tiering.placement.index import SharedIndex, ffi
ix = SharedIndex.open(os.environ['TIERING_INDEX'])
tier = ffi.string(ix.header.tiers[0].path).decode()
modes = [oct(os.stat(p).st_mode & 0o7777) for p in (tier, os.path.join(os.path.dirname(tier), 'staging'))]
for _ in range(500):                       # wait for the staged copy
    with open({str(target)!r}, 'rb') as f:
        where = os.readlink(f'/proc/self/fd/{{f.fileno()}}')
        if where.startswith(tier):
            break
    time.sleep(0.02)
print(json.dumps({{"modes": modes, "served_from_tier": where.startswith(tier)}}))
"""
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "stage",
                  "--", PYTHON, "-c", script], preexec_fn=lambda: os.umask(umask))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"modes": ["0o700", "0o700"], "served_from_tier": True}
    assert len(contents) == 5


def test_exit_status_is_the_commands(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=3)
    prof = str(profile(tmp_path))
    assert tier_run(["--profile", prof, "--data", str(data), "--", PYTHON, "-c", "raise SystemExit(7)"]).returncode == 7
    r = tier_run(["--profile", prof, "--data", str(data), "--", PYTHON, "-c",
                  "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert r.returncode == 128 + signal.SIGKILL


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_reach_the_command_and_everything_is_cleaned_up(tmp_path, sig):
    data = tmp_path / "pfs"
    dataset(data, n=20)
    script = ("import signal, sys, time, os\n"
              f"signal.signal({int(sig)}, lambda *a: sys.exit(42))\n"
              f"for f in sorted(os.listdir({str(data / 'c0')!r})): open(os.path.join({str(data / 'c0')!r}, f), 'rb').read()\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    p = subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                          "--", PYTHON, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    mine = [d for d in leftovers() if f"-{p.pid}-" in d]
    assert len(mine) == 2  # the index directory and the ram tier
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 42, err
    assert not [d for d in leftovers() if f"-{p.pid}-" in d]


def test_leftovers_of_dead_jobs_are_swept(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    dead = subprocess.run([PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    import socket
    here = {"host": socket.gethostname(), "pidns": os.stat("/proc/self/ns/pid").st_ino}
    stale = Path("/dev/shm") / f"tiering-{USER}-{pid}-zzzz1234"
    stale.mkdir(mode=0o700)
    (stale / "owner.json").write_text(json.dumps({"pid": pid, "create_time": 1.0, **here}))
    (stale / "junk").write_bytes(b"x" * 100)
    old = Path("/dev/shm") / f"tiering-{USER}-{pid}-wwww1234"   # an owner file without host: same rule
    old.mkdir(mode=0o700)
    (old / "owner.json").write_text(json.dumps({"pid": pid, "create_time": 1.0}))
    alive = Path("/dev/shm") / f"tiering-{USER}-{os.getpid()}-yyyy1234"   # this test process: alive
    alive.mkdir(mode=0o700)
    import psutil
    (alive / "owner.json").write_text(json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time()}))
    # a dead pid here, but of a job on another node (a tier on a shared file system)
    # or in another PID namespace: its pid means nothing here, so it is left alone
    foreign = []
    for k, other in (("host", "another-node"), ("pidns", here["pidns"] + 1)):
        d = Path("/dev/shm") / f"tiering-{USER}-{pid}-{k}1234"
        d.mkdir(mode=0o700)
        (d / "owner.json").write_text(json.dumps({"pid": pid, "create_time": 1.0, **here, k: other}))
        foreign.append(d)
    try:
        r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", "true"])
        assert r.returncode == 0, r.stderr
        assert not stale.exists() and not old.exists()
        assert alive.exists()
        assert all(d.exists() for d in foreign)
    finally:
        for d in (stale, old, alive, *foreign):
            shutil.rmtree(d, ignore_errors=True)


def test_existing_ld_preload_is_kept_and_nesting_loads_the_shim_once(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data, n=3)
    libc = subprocess.run([PYTHON, "-c", "import ctypes.util; print(ctypes.util.find_library('c'))"],
                          capture_output=True, text=True).stdout.strip()
    show = ("import os; p=os.environ['LD_PRELOAD'].split(); "
            "print(sum('libtiershim.so' in x for x in p), p[0], os.environ['TIERING_INDEX'])")
    prof = str(profile(tmp_path))
    env = dict(os.environ, LD_PRELOAD=libc)
    r = tier_run(["--profile", prof, "--data", str(data), "--", PYTHON, "-c", show], env=env)
    count, first, outer_index = r.stdout.split()
    assert (count, first) == ("1", libc), r.stderr
    inner = [PYTHON, "-m", "tiering", "run", "--profile", prof, "--data", str(data), "--", PYTHON, "-c", show]
    r = tier_run(["--profile", prof, "--data", str(data), "--", *inner], env=env)
    count, first, inner_index = r.stdout.split()
    assert (count, first) == ("1", libc), r.stderr
    assert inner_index != outer_index
    # and reads under the nested pair are still right
    rel = sorted(contents)[0]
    cat = [PYTHON, "-c", f"import sys; sys.stdout.buffer.write(open({str(data / rel)!r}, 'rb').read())"]
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", prof, "--data", str(data), "--",
                        PYTHON, "-m", "tiering", "run", "--profile", prof, "--data", str(data), "--", *cat],
                       capture_output=True, timeout=120)
    assert r.stdout == contents[rel]


@pytest.mark.parametrize("args, code, message", [
    (["--data", "/nonexistent/dir", "--", "true"], 2, "does not exist"),
    (["--data", "{data}", "--", "no-such-command-xyz"], 127, "not found"),
    (["--data", "{data}", "--", "{data}/c0/f0000.bin"], 126, "not executable"),
    (["--data", "{data}", "--profile", "nosuchprofile", "--", "true"], 2, "unknown profile"),
    (["--data", "{data}", "--policy", "bogus", "--", "true"], 2, "Invalid value for '--policy'"),
    (["--data", "{data}"], 2, "Missing argument"),
    (["--", "true"], 2, "Missing option '--data'"),
    (["--data", "{data}/c0/f0000.bin", "--", "true"], 2, "is a file"),
])
def test_bad_input_gives_clear_errors(tmp_path, args, code, message):
    data = tmp_path / "pfs"
    dataset(data, n=3)
    r = tier_run([a.format(data=data) for a in args])
    assert r.returncode == code, r.stderr
    assert message in r.stderr


def test_bad_profile_file_names_file_and_key(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=3)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntiers:\n  - name: ram\n    kind: memory\n    path: /dev/shm\n    capacity: 12 parsecs\n")
    r = tier_run(["--profile", str(bad), "--data", str(data), "--", "true"])
    assert r.returncode == 2
    assert "bad.yaml" in r.stderr and "capacity" in r.stderr


def test_console_scripts_are_installed():
    exe = shutil.which("tier-run")
    assert exe, "tier-run is not on PATH: install the package (make install)"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--data" in r.stdout
    r = subprocess.run([shutil.which("tiering") or "tiering", "profile", "list"], capture_output=True, text=True)
    assert "auto" in r.stdout.split() and "frontera" in r.stdout.split()


def test_two_data_roots_with_the_same_relative_paths_keep_their_own_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ca = make_data(a, {"x/same.bin": 3000, "only-a.bin": 10}, seed=1)
    cb = make_data(b, {"x/same.bin": 3000, "only-b.bin": 10}, seed=2)
    assert ca["x/same.bin"] != cb["x/same.bin"]
    script = f"""
import os, sys, time
paths = [{str(a / 'x/same.bin')!r}, {str(b / 'x/same.bin')!r}]
for p in paths:
    open(p, 'rb').read()
for _ in range(200):              # until both first-touch copies are in place
    local = []
    for p in paths:
        with open(p, 'rb') as f:
            local.append(not os.readlink(f'/proc/self/fd/{{f.fileno()}}').startswith({str(tmp_path)!r}))
    if all(local):
        break
    time.sleep(0.02)
for p in paths:
    with open(p, 'rb') as f:
        sys.stdout.write(f.read().hex() + '\\n')
print(all(local))
"""
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(a), "--data", str(b), "--policy", "first-touch",
                  "--", PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert bytes.fromhex(lines[0]) == ca["x/same.bin"] and bytes.fromhex(lines[1]) == cb["x/same.bin"]
    assert lines[2] == "True"


def test_ignored_signals_stay_ignored_and_python_ignores_do_not_leak(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                        "--", "cat", "/proc/self/status"], capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert r.returncode == 0, r.stderr
    ignored = int(next(ln for ln in r.stdout.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGHUP - 1))            # nohup still holds for COMMAND
    assert not ignored & (1 << (signal.SIGPIPE - 1))       # Python's own SIG_IGN is not inherited
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_disable_variable_turns_the_shim_off_under_tier_run(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data, n=20)
    stats = tmp_path / "s.json"
    script = ("import os, time\n"
              f"fs = sorted(os.path.join(d, f) for d, _, n in os.walk({str(data)!r}) for f in n)\n"
              "time.sleep(1.0)\n"
              "local = 0\n"
              "for p in fs:\n"
              "    with open(p, 'rb') as f:\n"
              f"        local += not os.readlink(f'/proc/self/fd/{{f.fileno()}}').startswith({str(data)!r})\n"
              "print(local)\n")
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "stage",
                  "--stats-json", str(stats), "--", PYTHON, "-c", script],
                 env=dict(os.environ, TIERING_DISABLE="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"
    s = json.loads(stats.read_text())
    assert s["tiers"][0]["files"] == len(contents) and s["opens"]["total"] == 0


def test_a_hung_pfs_read_does_not_hold_tier_run_after_the_command(tmp_path):
    """Copies blocked in a PFS read (simulated: _transfer never returns) are
    abandoned after the stop timeout; tier-run cleans up, reports them and
    exits with COMMAND's status instead of waiting for their threads."""
    data = tmp_path / "pfs"
    dataset(data, n=6)
    stats = tmp_path / "stats.json"
    driver = (
        "import sys, threading\n"
        "import tiering.placement.daemon as d, tiering.placement.tiers as t\n"
        "d.STOP_TIMEOUT = 0.5\n"
        "t._transfer = lambda *a: threading.Event().wait() or 0\n"
        "from tiering.cli import tier_run\n"
        "sys.argv = ['tier-run'] + sys.argv[1:]\n"
        "tier_run()\n")
    p = subprocess.Popen([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--policy", "stage",
                          "--data", str(data), "--stats-json", str(stats), "--", PYTHON, "-c",
                          "import time; time.sleep(0.5); raise SystemExit(3)"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert "still blocked reading the PFS" in err
    s = json.loads(stats.read_text())
    assert s["exit_code"] == 3 and s["placement"]["abandoned"] >= 1
    assert s["placement"]["copies"] == 0
    assert not [d for d in leftovers() if f"-{p.pid}-" in d]
