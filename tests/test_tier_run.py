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

from helpers import (
    N_FILES,
    PYTHON,
    USER,
    age,
    dataset,
    dead_job_dirs,
    digest,
    job_dirs,
    leftovers,
    make_data,
    patched_tier_run,
    profile,
    read_line,
    rewrite_owner,
    run_reader,
    running,
    tier_run,
    wait_for,
    wait_job_dirs_removed,
)
from tiering.rundirs import index_parent, make_private_dir

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
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
    # the sizes of the files opened from the tier (what was read of them is not counted)
    assert stats["opens"]["bytes_of_files_served"] == sum(len(contents[f]) for e in ep for f in e["local_files"])
    assert "bytes_avoided" not in stats["pfs"]
    assert stats["exit_code"] == 0 and stats["policy"] == "first-touch"
    assert stats["policy_requested"] == "first-touch" and stats["policy_reason"] is None
    assert stats["events_dropped"] == 0
    assert "from tiers" in r.stderr and "tier ram" in r.stderr


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_stage_copies_everything_at_start(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path), policy="stage", reader_args=("--workers", "0"))
    assert stats["tiers"][0]["files"] == N_FILES
    assert stats["pfs"]["opens_by_daemon"] == N_FILES
    assert rd["epochs"][1]["local"] == rd["epochs"][2]["local"] == N_FILES
    assert rd["digest"] == digest(contents)


@pytest.mark.slow
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


@pytest.mark.slow
def test_off_places_nothing_but_counts(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data, n=50)
    stats, rd, _ = run_reader(tmp_path, data, profile(tmp_path), policy="off", reader_args=("--workers", "0"))
    assert stats["tiers"][0]["files"] == 0
    assert stats["opens"] == {"total": 150, "pfs": 150, "by_tier": {"ram": 0}, "fallbacks": 0, "bytes_of_files_served": 0,
                              "bytes_read_from_tiers": 0, "closed_at_position_0": 0,
                              "bytes_of_files_closed_at_position_0": 0}
    assert stats["pfs"]["bytes_read_by_job"] == stats["pfs"]["bytes"] == 3 * sum(map(len, contents.values()))
    assert sum(e["local"] for e in rd["epochs"]) == 0
    assert rd["digest"] == digest(contents)


def test_write_open_during_the_job_invalidates_the_copy(tmp_path, reliability):
    data = tmp_path / "pfs"
    contents = dataset(data, n=5)
    target = data / "c0" / "f0000.bin"
    script = f"""
import os, time, sys
p = {str(target)!r}
open(p, 'rb').read()
deadline = time.monotonic() + 120
while True:                                # wait for the first-touch copy
    with open(p, 'rb') as f:
        if not os.readlink(f'/proc/self/fd/{{f.fileno()}}').startswith({str(data)!r}):
            break
    if time.monotonic() > deadline:
        sys.exit('never placed')
    time.sleep(0.02)
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
    # a Python command without a DataLoader: clairvoyant was chosen, first touch placed the files
    why = "no order received: no DataLoader of COMMAND announced an epoch"
    assert f"policy first-touch ({why})" in r.stderr
    assert "did not start" not in r.stderr                       # the hook did start
    stats = json.loads(stats_file.read_text())
    assert (stats["policy"], stats["policy_requested"], stats["policy_reason"]) == ("first-touch", "clairvoyant", why)
    assert stats["placement"]["write_opens"] == 1
    assert stats["placement"]["invalidated"] == 1
    # the others were staged while no order came (NOTE [staging while waiting]); the written one is gone
    assert stats["tiers"][0]["files"] == len(contents) - 1
    reliability.survived("a data-set file written during the job (its copy is never served again)")
    reliability.checked(reads=1, nbytes=len(contents["c0/f0000.bin"]))


def test_a_data_file_the_shell_opened_for_writing_is_read_as_it_is(tmp_path, reliability):
    """`tier-run --data D -- job >> D/x`: the shell opened x before tier-run
    started, COMMAND inherits it on stdout (NOTE [inherited writes]).  The
    stage policy copies every file at start; COMMAND waits until all the
    others are served from the tier, appends to x and reads it back."""
    data = tmp_path / "pfs"
    contents = dataset(data, n=8)
    target = data / "c0" / "f0000.bin"
    others = [str(data / rel) for rel in contents if data / rel != target]
    script = f"""
import ctypes, os, sys, time
where = ctypes.CDLL(None).tiering_where
deadline = time.monotonic() + 120
while any(where(p.encode()) < 0 for p in {others!r}):
    if time.monotonic() > deadline:
        sys.exit('never placed')
    time.sleep(0.02)
os.write(1, b'NEW')
with open({str(target)!r}, 'rb') as f:
    where = os.readlink(f'/proc/self/fd/{{f.fileno()}}')
    assert f.read() == {contents["c0/f0000.bin"] + b"NEW"!r}, 'stale copy served'
assert where == {str(target)!r}, where
"""
    stats_file = tmp_path / "s.json"
    with open(target, "ab") as out:
        r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                            "--policy", "stage", "--stats-json", str(stats_file), "--", PYTHON, "-c", script],
                           stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes().startswith(contents["c0/f0000.bin"] + b"NEW")
    stats = json.loads(stats_file.read_text())
    assert stats["placement"]["write_opens"] == 1
    assert stats["tiers"][0]["files"] == len(others)
    reliability.survived("a data-set file COMMAND inherited open for writing (its copy is never served)")
    reliability.checked(reads=1, nbytes=len(contents["c0/f0000.bin"]) + 3)


@pytest.mark.slow
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
deadline = time.monotonic() + 120
while time.monotonic() < deadline:         # wait for the staged copy
    with open({str(target)!r}, 'rb') as f:
        where = os.readlink(f'/proc/self/fd/{{f.fileno()}}')
        if where.startswith(tier):
            break
    time.sleep(0.02)
print(json.dumps({{"modes": modes, "served_from_tier": where.startswith(tier)}}))
"""
    # the umask set by a shell, not a preexec_fn: that forks pytest itself, and after the peer tests
    # grpc's fork handlers restart its poller in the child, which aborts when the child closes its fds
    r = subprocess.run(["sh", "-c", f'umask {umask:03o} && exec "$@"', "sh", PYTHON, "-m", "tiering", "run",
                        "--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "stage",
                        "--", PYTHON, "-c", script], capture_output=True, text=True, timeout=300)
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["TERM", "INT", "HUP"])
def test_signals_reach_the_command_and_everything_is_cleaned_up(tmp_path, sig, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=20)
    script = ("import signal, sys, time, os\n"
              f"signal.signal({int(sig)}, lambda *a: sys.exit(42))\n"
              f"for f in sorted(os.listdir({str(data / 'c0')!r})): open(os.path.join({str(data / 'c0')!r}, f), 'rb').read()\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")   # until the signal comes
    with running([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                  "--", PYTHON, "-c", script]) as p:
        assert read_line(p.stdout) == b"ready\n"
        mine = [d for d in leftovers() if f"-{p.pid}-" in d]
        assert len(mine) == 2  # the index directory and the ram tier
        p.send_signal(sig)
        out, err = p.communicate(timeout=300)
    assert p.returncode == 42, err
    wait_job_dirs_removed(p.pid)
    reliability.survived(f"{signal.Signals(sig).name} sent to tier-run (forwarded, all cleaned up)")


@pytest.mark.slow
def test_a_stopped_and_continued_tier_run_goes_on(tmp_path, reliability):
    """SIGSTOP of tier-run for longer than its wait for COMMAND (1 s), then
    SIGCONT: the interrupted wait is no signal to forward (it once forwarded
    CPython's garbage siginfo, died of EINVAL and took COMMAND with it)."""
    import psutil
    data, flags = tmp_path / "pfs", tmp_path / "flags"
    dataset(data, n=4)
    flags.mkdir()
    script = ("import os, sys, time\n"
              "f = sys.argv[1]\n"
              "def wait(name):\n"
              "    t = time.monotonic() + 300\n"
              "    while not os.path.exists(os.path.join(f, name)) and time.monotonic() < t: time.sleep(0.02)\n"
              "open(os.path.join(f, 'ready'), 'w').close()\n"
              "wait('stopped')\n"
              "time.sleep(2.5)\n"      # tier-run stays stopped past its 1 s wait
              "open(os.path.join(f, 'slept'), 'w').close()\n"
              "wait('continued')\n"
              "sys.exit(5)\n")
    p = subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                          "--", PYTHON, "-c", script, str(flags)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (flags / "ready").exists(), "COMMAND to start")
        p.send_signal(signal.SIGSTOP)
        wait_for(lambda: psutil.Process(p.pid).status() == psutil.STATUS_STOPPED, "tier-run to stop")
        (flags / "stopped").touch()
        wait_for(lambda: (flags / "slept").exists(), "COMMAND's 2.5 s while tier-run is stopped")
        p.send_signal(signal.SIGCONT)
        (flags / "continued").touch()
        _, err = p.communicate(timeout=300)
    finally:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
    assert p.returncode == 5, err
    assert b"Traceback" not in err, err
    wait_job_dirs_removed(p.pid)
    reliability.survived("tier-run stopped (SIGSTOP) past its wait and continued (COMMAND went on)")


def test_leftovers_of_dead_jobs_are_swept(tmp_path, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    shm = Path("/dev/shm")
    stale, other_host, other_pidns = dead_job_dirs(shm, USER, 3)
    alive = make_private_dir(str(shm), USER)              # this test process: alive
    # a dead pid here, but of a job on another node (a tier on a shared file system)
    # or in another PID namespace: its pid means nothing here, so it is left alone
    foreign = [rewrite_owner(other_host, host="another-node"), rewrite_owner(other_pidns, pidns=-1)]
    pid = json.loads((stale / "owner.json").read_text())["pid"]
    older = shm / f"tiering-{USER}-{pid}-wwww1234"        # a record of an older version, without the marker
    older.mkdir(mode=0o700)
    (older / "owner.json").write_text(json.dumps({"pid": pid, "create_time": 1.0}))
    try:
        r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", "true"])
        assert r.returncode == 0, r.stderr
        assert not stale.exists()
        assert alive.exists() and older.exists()
        assert all(d.exists() for d in foreign)
        reliability.survived("the directory of a dead job swept, of a live one, of an older version and of "
                             "2 other hosts or PID namespaces kept")
    finally:
        for d in (stale, older, alive, *foreign):
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("given", [True, False], ids=["given-as-data", "not-given"])
def test_a_data_set_staged_by_hand_where_tier_run_sweeps_survives(tmp_path, given, reliability):
    """A data set staged at <tier path>/tiering-$USER-mydata (as at
    /tmp/tiering-$USER-mydata, /tmp being the auto profile's disk tier) an
    hour ago, and a directory named like a dead job's: no owner record of
    tier-run's, so no sweep removes them, whatever their name and age."""
    prof = profile(tmp_path, second="1GiB")
    staged = tmp_path / "ssd" / f"tiering-{USER}-mydata"
    contents = dataset(staged, n=20)
    dead = subprocess.run([PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    forged = tmp_path / "ssd" / f"tiering-{USER}-{int(dead.stdout)}-abcd1234"
    (forged / "data").mkdir(parents=True)
    (forged / "data" / "mine.bin").write_bytes(b"m" * 50)
    age(staged, forged)
    data = staged if given else tmp_path / "pfs"
    if not given:
        dataset(data, n=2)
    r = tier_run(["--profile", str(prof), "--data", str(data), "--", PYTHON, "-c", READ_ALL, str(data)])
    assert r.returncode == 0, r.stderr
    assert {str(p.relative_to(staged)): p.read_bytes() for p in staged.rglob("*") if p.is_file()} == contents
    assert (forged / "data" / "mine.bin").read_bytes() == b"m" * 50
    if given:
        assert r.stdout.strip() == digest(contents)
    reliability.survived("a data set staged by hand under a sweep's name, an hour old"
                         + (", given as --data" if given else "") + " (kept), and a forged dead job's name (kept)")
    reliability.checked(reads=len(contents), nbytes=sum(map(len, contents.values())))


@pytest.mark.parametrize("where", ["inside", "equal", "by-a-link"])
def test_a_tier_inside_a_data_root_is_refused_before_command(tmp_path, where, reliability):
    """tier-run's directory in a tier inside a data root would be part of
    the data set: COMMAND would list it and the copies."""
    data = tmp_path / "pfs"
    dataset(data, n=2)
    tier = data if where == "equal" else data / "cache"
    tier.mkdir(exist_ok=True)
    given = data
    if where == "by-a-link":
        given = tmp_path / "link"
        given.symlink_to(data)
    before = sorted(p.name for p in data.iterdir())
    prof = tmp_path / "p.yaml"
    prof.write_text(f"name: t\ntiers:\n  - {{name: ram, kind: memory, path: /dev/shm, capacity: 1MiB}}\n"
                    f"  - {{name: ssd, kind: filesystem, path: {tier}, capacity: 1MiB}}\n")
    ran = tmp_path / "ran"
    r = tier_run(["--profile", str(prof), "--data", str(given), "--", "touch", str(ran)])
    assert r.returncode == 2, r.stderr
    assert not ran.exists()
    relation = "is the data root" if where == "equal" else "is inside the data root"
    shown = f"{given} ({data})" if where == "by-a-link" else f"{given}"
    assert f"tier-run: {prof}: tier 'ssd': path {tier} {relation} {shown}: tier-run's directory" in r.stderr, r.stderr
    assert "put the tier's path outside every --data directory" in r.stderr
    assert sorted(p.name for p in data.iterdir()) == before and list(tier.glob("tiering-*")) == []
    reliability.survived(f"a tier {where.replace('-', ' ')} a data root (refused before COMMAND)")


def test_a_data_root_that_holds_the_index_parent_is_refused_before_command(tmp_path):
    parent = index_parent()
    (tmp_path / "ssd").mkdir()
    prof = tmp_path / "p.yaml"
    prof.write_text(f"name: t\ntiers:\n  - {{name: ssd, kind: filesystem, path: {tmp_path / 'ssd'}, capacity: 1MiB}}\n")
    ran = tmp_path / "ran"
    r = tier_run(["--profile", str(prof), "--data", parent, "--", "touch", str(ran)])
    assert r.returncode == 2 and not ran.exists(), r.stderr
    assert (f"tier-run: the index's directory goes to {parent}, which is the data root {parent}: it would be part "
            f"of the data set (COMMAND would list it); stage the data set in a directory of its own") in r.stderr


@pytest.mark.slow
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
    (["--data", "{data}", "--epochs", "3", "--", "true"], 2, "--epochs counts the epochs of --sampler's order"),
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


def console_script(name: str) -> str | None:
    """A console script of the environment running the tests (its bin/, also
    when it is not on PATH: make's .venv), else the one on PATH."""
    here = Path(PYTHON).parent / name
    return str(here) if here.exists() else shutil.which(name)


def test_console_scripts_are_installed():
    exe = console_script("tier-run")
    assert exe, "tier-run is not installed beside this Python nor on PATH: install the package (make install)"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--data" in r.stdout
    r = subprocess.run([console_script("tiering") or "tiering", "profile", "list"], capture_output=True, text=True)
    assert "auto" in r.stdout.split() and "frontera" in r.stdout.split()


@pytest.mark.slow
def test_two_data_roots_with_the_same_relative_paths_keep_their_own_bytes(tmp_path, reliability):
    a, b = tmp_path / "a", tmp_path / "b"
    ca = make_data(a, {"x/same.bin": 3000, "only-a.bin": 10}, seed=1)
    cb = make_data(b, {"x/same.bin": 3000, "only-b.bin": 10}, seed=2)
    assert ca["x/same.bin"] != cb["x/same.bin"]
    script = f"""
import os, sys, time
paths = [{str(a / 'x/same.bin')!r}, {str(b / 'x/same.bin')!r}]
for p in paths:
    open(p, 'rb').read()
deadline = time.monotonic() + 120
while time.monotonic() < deadline:   # until both first-touch copies are in place
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
    reliability.survived("two data roots holding the same relative path")
    reliability.checked(reads=2, nbytes=len(ca["x/same.bin"]) + len(cb["x/same.bin"]))


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
    blocked = int(next(ln for ln in r.stdout.splitlines() if ln.startswith("SigBlk:")).split()[1], 16)
    assert blocked == 0                                     # tier-run's own blocked signals are not


@pytest.mark.slow
def test_disable_variable_turns_the_shim_off_under_tier_run(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data, n=20)
    stats = tmp_path / "s.json"
    # stage copies everything at start: wait until its copies are all in the tier
    script = ("import os, sys, time\n"
              f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from helpers import shm_copies, wait_for\n"
              f"fs = sorted(os.path.join(d, f) for d, _, n in os.walk({str(data)!r}) for f in n)\n"
              "wait_for(lambda: shm_copies(os.getppid()) == len(fs), 'the staged copies')\n"
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


@pytest.mark.slow
def test_a_hung_pfs_read_does_not_hold_tier_run_after_the_command(tmp_path, reliability):
    """Copies blocked in a PFS read (simulated: the C copy, of one file or of
    a batch, never returns) are abandoned after the stop timeout; tier-run
    cleans up, reports them and exits with COMMAND's status instead of
    waiting for their threads."""
    data = tmp_path / "pfs"
    dataset(data, n=6)
    stats = tmp_path / "stats.json"
    hung = tmp_path / "hung"
    driver = patched_tier_run("import threading\n"
                              "import tiering.placement.daemon as d, tiering.placement.tiers as t\n"
                              "d.STOP_TIMEOUT = 0.5\n"
                              f"t._transfer = t._transfer_many = lambda *a: open({str(hung)!r}, 'w').close() "
                              "or threading.Event().wait() or 0\n")
    # COMMAND exits once a copy hangs
    command = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import os; "
               f"from helpers import wait_for; wait_for(lambda: os.path.exists({str(hung)!r}), 'a hung copy'); "
               "raise SystemExit(3)")
    p = subprocess.Popen([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--policy", "stage",
                          "--data", str(data), "--stats-json", str(stats), "--", PYTHON, "-c", command],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 3, err
    assert "still blocked reading the PFS" in err
    s = json.loads(stats.read_text())
    assert s["exit_code"] == 3 and s["placement"]["abandoned"] >= 1
    assert s["placement"]["copies"] == 0
    wait_job_dirs_removed(p.pid)
    reliability.survived(f"{s['placement']['abandoned']} copies hung in a PFS read at exit")


# -- the order hook that cannot start -------------------------------------------------

# reads every file under argv[1] once and prints helpers.digest() of what it read
READ_ALL = ("import hashlib, os, sys\n"
            "root, sums = sys.argv[1], {}\n"
            "for d, _, names in sorted(os.walk(root)):\n"
            "    for n in sorted(names):\n"
            "        p = os.path.join(d, n)\n"
            "        sums[os.path.relpath(p, root)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
            "h = hashlib.sha256()\n"
            "for rel in sorted(sums):\n"
            "    h.update(f'{rel}\\0{sums[rel]}\\n'.encode())\n"
            "print(h.hexdigest())\n")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["-I", "-E", "PYTHONPATH replaced", "order directory unusable"])
def test_a_hook_that_cannot_start_is_reported_once(tmp_path, how, reliability):
    data = tmp_path / "pfs"
    contents = dataset(data, n=10)
    script = tmp_path / "read_all.py"
    script.write_text(READ_ALL)
    stats = tmp_path / "s.json"
    if how in ("-I", "-E"):
        command = [PYTHON, how, str(script), str(data)]
    else:   # a wrapper script spoils the hook before Python starts
        spoil = ("PYTHONPATH=/nowhere; export PYTHONPATH" if how == "PYTHONPATH replaced" else
                 'rm -r "$TIERING_ORDER_DIR" && : > "$TIERING_ORDER_DIR"')
        command = ["sh", "-c", f'{spoil}; exec "$0" "$@"', PYTHON, str(script), str(data)]
    hook = ["--hook"] if command[0] == "sh" else []    # sh is not Python: the hook is asked for
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats), *hook,
                  "--", *command])
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("tiering: the order hook did not start")]
    assert len(warnings) == 1, r.stderr                                # said once
    assert "placement follows first touch" in warnings[0]              # what happens instead
    assert "--sampler random --seed N" in warnings[0] and "--order-file" in warnings[0]   # how to fix it
    if how in ("-I", "-E"):
        assert f"Python runs with {how}" in warnings[0]
    why = "no order received: the order hook did not start in COMMAND"
    assert f"tiering: policy first-touch ({why})" in r.stderr
    s = json.loads(stats.read_text())
    assert (s["policy"], s["policy_requested"], s["policy_reason"]) == ("first-touch", "clairvoyant", why)
    assert s["opens"]["total"] == 10
    assert r.stdout.strip() == digest(contents)
    reliability.survived(f"order hook unable to start ({how})")
    reliability.checked(reads=len(contents), nbytes=sum(map(len, contents.values())))


@pytest.mark.slow
def test_a_hook_missing_from_the_installation_is_reported_once(tmp_path, reliability):
    data = tmp_path / "pfs"
    contents = dataset(data, n=4)
    script = tmp_path / "read_all.py"
    script.write_text(READ_ALL)
    empty = tmp_path / "no-hook"
    empty.mkdir()
    driver = patched_tier_run("import tiering.job as job\n"
                              f"job.HOOK_DIR = __import__('pathlib').Path({str(empty)!r})\n")
    stats = tmp_path / "s.json"
    r = subprocess.run([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--data", str(data),
                        "--stats-json", str(stats), "--", PYTHON, str(script), str(data)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("the order hook is missing from this installation") == 2   # the warning, the policy line
    warning = next(ln for ln in r.stderr.splitlines() if ln.startswith("tiering: the order hook is missing"))
    assert "reinstall tiering" in warning and "--order-file" in warning and "first touch" in warning
    s = json.loads(stats.read_text())
    assert (s["policy"], s["policy_requested"]) == ("first-touch", "clairvoyant")
    assert s["policy_reason"] == "no order received: the order hook is missing from this installation"
    assert r.stdout.strip() == digest(contents)
    reliability.survived("order hook missing from the installation")
    reliability.checked(reads=len(contents), nbytes=sum(map(len, contents.values())))


# -- COMMAND's exit status, whatever happens to the report ---------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("where, message", [
    ("missing/dir/s.json", "the directory {tmp}/missing/dir does not exist; create it first (mkdir -p {tmp}/missing/dir)"),
    ("/sys/tiering-stats.json", "cannot create a file in /sys"),
    (".", "is a directory"),
], ids=["missing directory", "unwritable directory", "a directory"])
def test_a_stats_json_that_cannot_be_written_stops_before_command(tmp_path, where, message, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    marker = tmp_path / "ran"
    path = where if where.startswith("/") else str(tmp_path / where)
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", path,
                  "--", "touch", str(marker)])
    assert r.returncode == 2, r.stderr
    assert message.format(tmp=tmp_path) in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()          # COMMAND never ran
    reliability.survived(f"--stats-json {where!r} unusable: refused before COMMAND")


@pytest.mark.slow
def test_a_broken_pipe_on_stderr_keeps_the_commands_status(tmp_path, reliability):
    """tier-run ... 2>&1 | head -1: the summary meets a closed pipe."""
    data = tmp_path / "pfs"
    dataset(data, n=2)
    go = tmp_path / "go"
    command = (f"import os, sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
               "from helpers import wait_for; print('first', flush=True); "
               f"wait_for(lambda: os.path.exists({str(go)!r}), 'the reader to go'); raise SystemExit(5)")
    p = subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                          "-v", "--", PYTHON, "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while read_line(p.stdout) != b"first\n":   # -v: tier-run's log lines come first
            pass
        p.stdout.close()                  # head is done
        go.touch()
        assert p.wait(timeout=300) == 5
    finally:
        p.kill()
        p.wait()
    reliability.survived("tier-run's stderr a broken pipe")


@pytest.mark.slow
def test_a_closed_stderr_keeps_the_commands_status_and_stdout(tmp_path, reliability):
    """tier-run ... 2>&-: nothing of tier-run's ends up on stdout."""
    data = tmp_path / "pfs"
    dataset(data, n=2)
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                        "-v", "--", "sh", "-c", "echo out; echo err >&2; exit 6"],
                       stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), timeout=300)
    assert r.returncode == 6
    assert r.stdout == b"out\n"           # COMMAND's stderr is closed too: its "err" went nowhere
    reliability.survived("tier-run started with stderr closed")


@pytest.mark.slow
def test_a_full_device_for_the_json_keeps_the_commands_status(tmp_path, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", "/dev/full",
                  "--", "sh", "-c", "exit 4"])
    assert r.returncode == 4, r.stderr
    assert "cannot write --stats-json /dev/full: No space left on device" in r.stderr
    assert "COMMAND exited 4" in r.stderr and "Traceback" not in r.stderr
    reliability.survived("--stats-json on a full device")


# -- tier-run killed, signals, how COMMAND starts -------------------------------------------

@pytest.mark.slow
def test_a_killed_tier_run_takes_command_down_and_the_next_run_sweeps(tmp_path, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=5)
    termed = tmp_path / "termed"
    script = ("import signal, sys, time\n"
              f"signal.signal(signal.SIGTERM, lambda *a: (open({str(termed)!r}, 'w').close(), sys.exit(9)))\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    with running([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                  "--", PYTHON, "-c", script]) as p:
        assert read_line(p.stdout) == b"ready\n"
        p.kill()                          # SIGKILL, as the OOM killer does
        p.wait(timeout=300)
    wait_for(termed.exists, "COMMAND to get SIGTERM from its dead parent")
    left = [d for d in leftovers() if f"-{p.pid}-" in d]
    assert len(left) == 2                 # the index and the ram tier of the dead job
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", "true"])
    assert r.returncode == 0, r.stderr
    assert not [d for d in leftovers() if f"-{p.pid}-" in d]
    reliability.survived("tier-run SIGKILLed (COMMAND got SIGTERM, the next run swept)")


@pytest.mark.slow
@pytest.mark.parametrize("order", [[], ["--sampler", "random", "--seed", "1", "--layout", "sorted"]],
                         ids=["hook", "sampler"])
def test_no_thread_of_tier_run_can_take_a_forwarded_signal(tmp_path, order):
    """Every thread but the one in sigtimedwait blocks the forwarded signals,
    those of libraries too (numpy's, torch's): none can die of SIGTERM or
    raise KeyboardInterrupt instead of forwarding it."""
    data = tmp_path / "pfs"
    dataset(data, n=5)
    forwarded = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGHUP - 1))
    script = ("import glob, os\n"
              "for t in glob.glob(f'/proc/{os.getppid()}/task/*'):\n"
              "    if os.path.basename(t) != str(os.getppid()):\n"
              "        print(next(ln.split()[1] for ln in open(t + '/status') if ln.startswith('SigBlk')))\n")
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), *order, "--", PYTHON, "-c", script])
    assert r.returncode == 0, r.stderr
    masks = [int(x, 16) for x in r.stdout.split()]
    assert masks, "tier-run has its daemon thread"
    assert all(m & forwarded == forwarded for m in masks), r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_during_set_up_stops_tier_run_before_command(tmp_path, sig, reliability):
    """The scan is made to hang: the signal must still end tier-run, cleanly."""
    data = tmp_path / "pfs"
    dataset(data, n=2)
    driver = patched_tier_run("import threading\n"
                              "import tiering.job as job\n"
                              "real = job.catalog_mod.scan\n"
                              "def slow_scan(*a, **kw):\n"
                              "    print('scanning', flush=True)\n"
                              "    threading.Event().wait(600)\n"
                              "job.catalog_mod.scan = slow_scan\n")
    marker = tmp_path / "ran"
    with running([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--data", str(data),
                  "--", "touch", str(marker)]) as p:
        assert read_line(p.stdout) == b"scanning\n"
        p.send_signal(sig)
        out, err = p.communicate(timeout=300)
    assert p.returncode == 128 + sig, err
    name = signal.Signals(sig).name
    assert f"tier-run: interrupted by {name} before COMMAND started".encode() in err and b"Traceback" not in err
    assert not marker.exists()
    reliability.survived(f"{signal.Signals(sig).name} while tier-run sets up")


@pytest.mark.slow
def test_a_signal_between_making_a_tier_directory_and_recording_it_leaves_nothing(tmp_path):
    """The set-up's signal interrupts the main thread at any point: here
    just after the second tier's private directory is made, before the job
    holds it.  tier-run ends as for any signal during the set-up, and no
    directory of its own is left in either tier's parent."""
    data = tmp_path / "pfs"
    dataset(data, n=2)
    driver = patched_tier_run("import signal\n"
                              "import tiering.job as job\n"
                              "from tiering.command import Interrupted\n"
                              "real, made = job.TierState, []\n"
                              "def cut(*a, **kw):\n"
                              "    made.append(a[2])\n"
                              "    if len(made) == 2:\n"
                              "        raise Interrupted(signal.SIGINT)\n"
                              "    return real(*a, **kw)\n"
                              "job.TierState = cut\n")
    marker = tmp_path / "ran"
    with running([PYTHON, "-c", driver, "--profile", str(profile(tmp_path, second="1GiB")),
                  "--data", str(data), "--", "touch", str(marker)]) as p:
        out, err = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGINT, err
    assert b"tier-run: interrupted by SIGINT before COMMAND started" in err and b"Traceback" not in err
    assert not marker.exists()
    assert list((tmp_path / "ssd").glob("tiering-*")) == []
    wait_for(lambda: not list(Path("/dev/shm").glob(f"tiering-*-{p.pid}-*")),
             "the removal of tier-run's directories in /dev/shm")


@pytest.mark.slow
def test_a_script_without_shebang_runs_with_sh(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=2)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "train-job"
    script.write_text('echo "sh ran $0 with $#: $*"\nexit 3\n')
    script.chmod(0o755)
    for name in (str(script), "train-job"):     # by path, and found on PATH
        r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", name, "a", "b c"],
                     env=dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}"))
        assert r.returncode == 3, r.stderr
        assert r.stdout == f"sh ran {script} with 2: a b c\n"


# -- order files and error lists ------------------------------------------------------------

@pytest.mark.slow
def test_unreadable_directories_of_the_data_set_are_a_warning_with_their_paths_and_count(tmp_path):
    """Two class directories tier-run cannot list (a mode that shuts this
    user out; the tests run as root, so the listing is made to fail): one
    warning with how many and which, and the job runs on the rest."""
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    driver = patched_tier_run("import importlib, os\n"
                              "scan = importlib.import_module('tiering.catalog.scan')\n"
                              "real = scan._listing\n"
                              "def listing(path):\n"
                              "    if path.rstrip('/').endswith(('/c2', '/c3')):\n"
                              "        raise OSError(13, os.strerror(13), path)\n"
                              "    return real(path)\n"
                              "scan._listing = listing\n")
    r = subprocess.run([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--data", str(data),
                        "--stats-json", str(stats), "--", "true"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "cannot be read" in ln]
    assert said == [f"tiering: 2 directories under {data} cannot be read (Permission denied): {data}/c2, {data}/c3; "
                    "the files in them are not catalogued (COMMAND reads them from the PFS, if it can, never from "
                    "the tiers)"], r.stderr
    assert json.loads(stats.read_text())["files"] == N_FILES * 3 // 5


@pytest.mark.slow
def test_an_order_file_of_paths_needs_no_layout(tmp_path, reliability):
    """The data set's files have no image extension: the default layout
    (ImageFolder) finds no sample, but an order of paths names the files."""
    data = tmp_path / "pfs"
    contents = dataset(data, n=40)
    rels = sorted(contents)
    order = tmp_path / "order.txt"
    order.write_text("\n".join(rels[::-1]) + "\n# epoch\n" + "\n".join(str(data / r) for r in rels) + "\n")
    stats = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--order-file", str(order),
                  "--stats-json", str(stats), "--", PYTHON, "-c", READ_ALL, str(data)])
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    assert s["policy"] == "clairvoyant" and s["order"]["epochs_known"] == 2
    assert s["order"]["stream_length"] == 80
    assert r.stdout.strip() == digest(contents)
    reliability.checked(reads=len(contents), nbytes=sum(map(len, contents.values())))
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(f"{rels[0]}\n3\n")
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--order-file", str(mixed), "--", "true"])
    assert r.returncode == 2 and "mixes data-set indices and file paths" in r.stderr
    reliability.survived("an order of files that are not ImageFolder samples")


@pytest.mark.slow
def test_errors_that_name_classes_name_a_few_and_count_the_rest(tmp_path):
    data = tmp_path / "imagenet-like"
    make_data(data, {f"n{k:08d}/x.bin": 3 for k in range(1000)})
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--sampler", "sequential", "--", "true"])
    assert r.returncode == 2
    assert "classes n00000000, n00000001, n00000002, n00000003, n00000004 and 995 more in" in r.stderr
    assert "n00000999" not in r.stderr and len(r.stderr) < 2000


@pytest.mark.slow
def test_tiers_are_removed_in_the_background_and_nothing_is_left(tmp_path):
    """tier-run hands its tiers (with their copies) to a detached remover and
    exits; once that is done, no file of the job remains on any tier."""
    data = tmp_path / "pfs"
    dataset(data, n=60)
    stats = tmp_path / "stats.json"
    reader = ("import os, sys\n"
              "for d, _, names in os.walk(sys.argv[1]):\n"
              "    for n in names: open(os.path.join(d, n), 'rb').read()\n")
    p = subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path, second="1GiB")),
                          "--data", str(data), "--policy", "stage", "--warm", "--stats-json", str(stats), "--",
                          PYTHON, "-c", reader, str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    s = json.loads(stats.read_text())
    assert s["placement"]["copies"] == 60      # --warm: every file copied before COMMAND started
    ssd = tmp_path / "ssd"
    wait_for(lambda: not list(ssd.iterdir()), "the ssd tier's directory to be removed")
    wait_job_dirs_removed(p.pid)
    assert list(ssd.iterdir()) == [] and job_dirs(p.pid) == []


# -- the catalog cache, written beside COMMAND (NOTE [cache written aside]) -------------------

def _cached_catalogs(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "tiering" / "catalogs").glob("*.npz") if not p.name.startswith("."))


# numpy.savez of tier-run's cache writer waits for the file `go` (at most 60 s), then writes
SAVEZ_WAITS = ("import numpy, os, time\n"
               "real_savez = numpy.savez\n"
               "def savez(*a, **k):\n"
               "    deadline = time.monotonic() + 60\n"
               "    while not os.path.exists(os.environ['TEST_GO']) and time.monotonic() < deadline:\n"
               "        time.sleep(0.01)\n"
               "    real_savez(*a, **k)\n"
               "numpy.savez = savez\n")


@pytest.mark.slow
def test_command_starts_before_the_catalog_cache_is_written(tmp_path):
    """The catalog of a cold scan goes to the cache from a child of tier-run
    while COMMAND runs (COMMAND does not wait for it); tier-run waits for the
    writer when COMMAND is done, and the next run takes the catalog from the cache."""
    data, cache, go, seen = tmp_path / "pfs", tmp_path / "cache", tmp_path / "go", tmp_path / "seen"
    contents = dataset(data, n=6)
    age(data)
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), TEST_GO=str(go))
    command = ("import glob, pathlib, sys\n"
               f"n = len(glob.glob({str(cache)!r} + '/tiering/catalogs/*.npz'))\n"
               f"pathlib.Path({str(seen)!r}).write_text(str(n))\n"
               f"pathlib.Path({str(go)!r}).touch()\n")
    r = subprocess.run([PYTHON, "-c", patched_tier_run(SAVEZ_WAITS), "--profile", str(profile(tmp_path)),
                        "--data", str(data), "--", PYTHON, "-c", command],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert seen.read_text() == "0"                 # COMMAND ran before the cache was written
    assert len(_cached_catalogs(cache)) == 1       # ... and it was written by tier-run's end
    assert not list((cache / "tiering" / "catalogs").glob(".tmp-*"))
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", PYTHON, "-c",
                  READ_ALL, str(data)], env=env)
    assert r.returncode == 0, r.stderr
    assert "catalog from cache" in r.stderr
    assert r.stdout.strip() == digest(contents)


@pytest.mark.slow
def test_a_tier_run_killed_while_the_cache_is_written_leaves_no_cache(tmp_path, reliability):
    """tier-run SIGKILLed, with its cache writer, half-way through writing
    the cache: no cache under its name (a temporary the next writer's
    sweep removes), the next run scans and caches, the one after uses it."""
    data, cache, go = tmp_path / "pfs", tmp_path / "cache", tmp_path / "go"
    contents = dataset(data, n=6)
    age(data)
    half = ("import numpy, os, time\n"
            "def savez(f, **arrays):\n"
            "    f.write(b'PK\\x03\\x04' + b'\\0' * 4096)   # the start of a zip, no more\n"
            "    f.flush()\n"
            "    deadline = time.monotonic() + 120\n"
            "    while time.monotonic() < deadline:\n"
            "        time.sleep(0.05)\n"
            "numpy.savez = savez\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), TEST_GO=str(go))
    with running([PYTHON, "-c", patched_tier_run(half), "--profile", str(profile(tmp_path)),
                  "--data", str(data), "--", PYTHON, "-c", "print('ready', flush=True); "
                  "import time; time.sleep(600)"], env=env, start_new_session=True) as p:
        assert read_line(p.stdout) == b"ready\n"
        catalogs = cache / "tiering" / "catalogs"
        wait_for(lambda: any(t.stat().st_size > 0 for t in catalogs.glob(".tmp-*")), "the writer to begin")
        os.killpg(p.pid, signal.SIGKILL)   # tier-run and its writer, as a job scheduler's kill does
        p.wait(timeout=300)
    assert _cached_catalogs(cache) == []
    for expect in ("scanned", "catalog from cache"):
        r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--", PYTHON, "-c",
                      READ_ALL, str(data)], env=env)
        assert r.returncode == 0, r.stderr
        assert expect in r.stderr and r.stdout.strip() == digest(contents)
        assert len(_cached_catalogs(cache)) == 1
    reliability.survived("tier-run SIGKILLed while writing the catalog cache (no half cache)")
    reliability.checked(reads=2 * len(contents), nbytes=2 * sum(map(len, contents.values())))


def test_the_teardown_stops_the_tiers_before_it_waits_for_the_cache_writer(monkeypatch):
    """Processes COMMAND left behind stop using the tiers at once, not after
    up to CACHE_WRITER_WAIT seconds of the writer; the writer is then waited for."""
    from types import SimpleNamespace

    import tiering.job as job_mod
    done: list[tuple[str, object]] = []

    class Index:
        def set_disabled(self, value: bool) -> None:
            done.append(("disabled", value))

    monkeypatch.setattr(job_mod.catalog_mod, "wait_writer", lambda pid, timeout: done.append(("waited", pid)) or True)
    job = SimpleNamespace(index=Index(), cache_writer=4242, daemon=None, catalog=None, run_dir=None,
                          opts=SimpleNamespace(keep=True, scan_cache=None))
    job_mod.cleanup(job)
    assert done == [("disabled", True), ("waited", 4242)] and job.cache_writer is None
