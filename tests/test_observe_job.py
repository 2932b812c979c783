"""What tier-run shows while a real job runs and what it keeps: progress in a
log and on a terminal (a pty), --quiet, per-epoch numbers against what the
reader itself counted, `tiering status` attached to a running job (and
refused to another user), `tiering report`'s picture, and `make demo`'s
driver."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    N_FILES,
    PYTHON,
    READER,
    REPO,
    as_other_user,
    dataset,
    make_data,
    patched_tier_run,
    profile,
    tier_run,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("no_leftovers")

# reads every file of the data set once, says how many, then waits for a file to appear
READ_AND_WAIT = """
import os, sys, time
root, go = sys.argv[1], sys.argv[2]
n = 0
for d, _, files in sorted(os.walk(root)):
    for f in sorted(files):
        with open(os.path.join(d, f), "rb") as fh:
            fh.read()
        n += 1
print("read", n, flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
"""


def reader_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [PYTHON, str(READER), "--data", str(data), "--epochs", "3", "--out", str(out), *extra]


# -- progress ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_log_gets_plain_lines_and_commands_stdout_stays_its_own(tmp_path):
    data = tmp_path / "pfs"
    dataset(data)
    out = tmp_path / "reader.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "first-touch",
                  "--progress-every", "1", "--", *reader_args(data, out, "--epoch-pause", "1.5")])
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    lines = r.stderr.splitlines()
    # a cold scan lists names first and reads the sizes while COMMAND starts (NOTE [names first])
    assert lines[0] == f"tiering: scanned: {N_FILES} files (sizes read while COMMAND starts) in 6 directories, " + \
        lines[0].split(", ")[-2] + ", " + lines[0].split(", ")[-1]
    assert lines[1] == f"tiering: starting COMMAND; placement starts once the sizes of {N_FILES} files are read"
    sized = [ln for ln in lines if ln.startswith("tiering: sizes read in ")]
    assert len(sized) == 1 and sized[0].endswith(f": {N_FILES} files ({_size(data)}); tiers ram 1 GiB: "
                                                 "the data set fits"), r.stderr
    status = [ln for ln in lines if re.match(r"tiering \d+:\d\d ", ln)]
    assert len(status) >= 2, r.stderr                   # the job runs > 3 s: a line a second
    assert all("copying what COMMAND opens (first touch)" in ln and "opens/s" in ln for ln in status)
    assert any(ln.startswith("tiering: tiers warm after ") for ln in lines)
    # stdout: COMMAND's lines only
    assert [ln.split(":")[0] for ln in r.stdout.splitlines()] == ["reader"] * 4


def _size(data: Path) -> str:
    from tiering.units import human_bytes
    return human_bytes(sum(p.stat().st_size for p in data.rglob("*") if p.is_file()))


def run_in_pty(cmd: list[str], timeout: float = 300) -> tuple[int, str]:
    """cmd with its stdin, stdout and stderr a terminal; what it wrote there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:      # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


# COMMAND's lines, each in one write: print writes its pieces one by one when
# PYTHONUNBUFFERED is set, and tier-run, which does not see what COMMAND writes
# on the terminal they share, may then put a line of its own between them
STEPS = "import os, time\nfor k in range(3):\n    os.write(1, b'step %d\\n' % k)\n    time.sleep(1)"


@pytest.mark.slow
def test_a_terminal_gets_a_bar_while_scanning_and_whole_lines_once_command_runs(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=2000)
    code, out = run_in_pty([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                            "--policy", "first-touch", "--progress-every", "1", "--", PYTHON, "-c", STEPS])
    assert code == 0, out
    start = out.index("tiering: starting COMMAND")
    before, after = out[:start], out[start:]
    assert "\rtiering: scanning: " in before            # the bar, redrawn in place
    assert "tiering: scanned: 2,000 files" in before
    assert re.search(r"\r(?!\n)", after) is None, after   # after COMMAND starts: whole lines only
    assert [ln for ln in after.splitlines() if ln.startswith("step")] == ["step 0", "step 1", "step 2"]
    assert re.search(r"^tiering \d:\d\d copying what COMMAND opens", after, re.M)
    assert "tiering: policy first-touch, 2,000 files" in after


@pytest.mark.slow
def test_the_starting_line_comes_before_commands_first_line_however_slow_the_daemon_starts(tmp_path):
    """tier-run says COMMAND starts before it forks it: a daemon slow to start
    (a loaded machine, here a patched one) cannot let COMMAND's first line
    come first on the terminal they share."""
    data = tmp_path / "pfs"
    dataset(data, n=20)
    driver = patched_tier_run("import time\n"
                              "import tiering.job as job\n"
                              "start = job.start_service\n"
                              "job.start_service = lambda j: (time.sleep(2), start(j))[1]\n")
    code, out = run_in_pty([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--data", str(data),
                            "--policy", "first-touch", "--", PYTHON, "-c", "print('step 0', flush=True)"])
    assert code == 0, out
    assert out.count("tiering: starting COMMAND") == 1
    assert out.index("tiering: starting COMMAND") < out.index("step 0"), out


@pytest.mark.slow
def test_a_terminal_gets_a_bar_while_warming_up_and_the_tiers_are_full_when_command_starts(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=500)
    code, out = run_in_pty([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                            "--policy", "first-touch", "--warm", "--", "true"])
    assert code == 0, out
    start = out.index("tiering: starting COMMAND")
    before, after = out[:start], out[start:]
    assert "\rtiering: warm-up: 500 files" in before, before     # the bar, redrawn in place
    assert re.search(r"tiering: warm-up: 500 files \([\d.]+ [KM]iB\) in the tiers, catalog order, ", before), before
    assert "tiering: policy first-touch, 500 files" in after


@pytest.mark.slow
def test_verbose_shows_the_placement_log_and_its_copies_add_up_to_the_summarys(tmp_path):
    """-v: what placement did, a line at the status line's rate while
    copies land and a last one at the end; the copies they say add up to the
    job's.  Without -v, no such line."""
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    args = ["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "first-touch", "--stats-json",
            str(stats), "--progress-every", "1", "--", *reader_args(data, tmp_path / "r.json", "--epoch-pause", "1")]
    r = tier_run(["-v", *args])
    assert r.returncode == 0, r.stderr
    landed = [int(m[1].replace(",", "")) for m in
              re.finditer(r"^tiering: placement \d+:\d\d-\d+:\d\d: ([\d,]+) copies landed \(", r.stderr, re.M)]
    copies = json.loads(stats.read_text())["placement"]["copies"]
    assert landed and sum(landed) == copies == N_FILES, r.stderr
    assert re.search(r"^tiering: placement .*; 0 evicted, 0 failed; \d+ in flight; ram [\d,]+ files \(", r.stderr,
                     re.M), r.stderr
    r = tier_run(args)
    assert r.returncode == 0 and "tiering: placement" not in r.stderr, r.stderr


@pytest.mark.slow
def test_with_warm_the_tiers_are_warm_at_the_warm_ups_end(tmp_path):
    """--warm copies before COMMAND starts: the tiers are warm when it
    ends, not at tier-run's first look once COMMAND runs."""
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "first-touch", "--warm",
                  "--stats-json", str(stats), "--progress-every", "1", "--",
                  *reader_args(data, tmp_path / "r.json", "--epoch-pause", "1")])
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    assert s["warm"]["files"] == N_FILES and s["seconds"]["warm"] <= 0, s["seconds"]
    assert "tiers warm before COMMAND started (at the warm-up's end)" in r.stderr, r.stderr
    assert "tiers warm after" not in r.stderr, r.stderr


@pytest.mark.slow
def test_quiet_prints_nothing_but_the_json_has_everything(tmp_path):
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "first-touch", "-q",
                  "--stats-json", str(stats), "--", *reader_args(data, tmp_path / "r.json")])
    assert r.returncode == 0 and r.stderr == ""
    s = json.loads(stats.read_text())
    assert s["opens"]["total"] == 3 * N_FILES and len(s["series"]["t"]) >= 1



@pytest.mark.slow
def test_progress_off_drops_the_progress_and_keeps_the_summary(tmp_path):
    data = tmp_path / "pfs"
    dataset(data)
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--policy", "first-touch",
                  "--progress", "off", "--", *reader_args(data, tmp_path / "r.json")])
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert [ln for ln in lines if ln.startswith("tiering: policy first-touch, ")] == lines[:1], r.stderr
    assert not [ln for ln in lines if "scanned:" in ln or "starting COMMAND" in ln or "tiering 0:" in ln], r.stderr
    assert any(ln.startswith("  hits ") for ln in lines), r.stderr


# an IterableDataset over the data set (with or without a length): no indices, so no order can come;
# after one pass it waits until the daemon has taken the hook's messages and the status file was
# written twice since, then writes the status file's phase to argv[2]
ITERABLE = """
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, IterableDataset
root, out, with_len = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
class Files(IterableDataset):
    def __iter__(self):
        for d, _, fs in sorted(os.walk(root)):
            for f in sorted(fs):
                with open(os.path.join(d, f), "rb") as fh:
                    fh.read()
                yield torch.zeros(1)
if with_len:
    Files.__len__ = lambda self: 200
for x in DataLoader(Files(), batch_size=4):
    pass
orders = os.environ["TIERING_ORDER_DIR"]
status = os.path.join(os.path.dirname(orders), "status.json")
def updated():
    try:
        with open(status) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
deadline = time.monotonic() + 120
while any(n.endswith(".json") for n in os.listdir(orders)) and time.monotonic() < deadline:
    time.sleep(0.05)
seen = []
while len(seen) < 3 and time.monotonic() < deadline:
    st = updated()
    if st is not None and (not seen or st["updated"] != seen[-1]["updated"]):
        seen.append(st)
    time.sleep(0.05)
with open(out, "w") as f:
    json.dump({"phase": seen[-1]["phase"], "kind": seen[-1]["phase_kind"]}, f)
"""


@pytest.mark.slow
@pytest.mark.parametrize("with_len", [False, True], ids=["no length", "a length"])
def test_once_the_hook_gave_up_the_status_says_first_touch_and_why_not_waiting(tmp_path, with_len):
    """A DataLoader over an IterableDataset has no indices: the hook says so
    (with or without a __len__), and from then on the status line and the
    status file say first touch and why, not "waiting for the order"."""
    data = tmp_path / "pfs"
    dataset(data)
    out = tmp_path / "phase.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--progress-every", "1", "--",
                  PYTHON, "-c", ITERABLE, str(data), str(out), "1" if with_len else "0"])
    assert r.returncode == 0, r.stderr
    why = "Files is an IterableDataset: it yields its samples in an order of its own, with no indices to announce"
    assert json.loads(out.read_text()) == {"kind": "fallback",
                                           "phase": f"first touch: the order hook gave up (cannot map the data set "
                                                    f"to files ({why}))"}
    lines = r.stderr.splitlines()
    said = [k for k, ln in enumerate(lines) if ln.startswith("tiering: order hook: cannot map the data set")]
    assert len(said) == 1 and why in lines[said[0]], r.stderr
    status = [ln for ln in lines[said[0]:] if re.match(r"tiering \d+:\d\d ", ln)]
    assert status and not any("waiting for the order" in ln for ln in status), r.stderr
    assert all("first touch: the order hook gave up" in ln for ln in status), r.stderr


# -- bytes read: what COMMAND read, not the sizes of the files it opened ---------------------

MIB = 1 << 20


def head_dataset(root: Path, n: int = 24) -> dict[str, bytes]:
    return make_data(root, {f"c{i % 3}/f{i:03d}.bin": MIB for i in range(n)})


@pytest.mark.slow
def test_a_reader_of_the_first_4_kib_of_1_mib_files_from_the_pfs_reports_4_kib_an_open(tmp_path):
    data = tmp_path / "pfs"
    head_dataset(data)
    stats = tmp_path / "s.json"
    # tiers of 512 KiB: no file fits, every open reads the PFS
    r = tier_run(["--profile", str(profile(tmp_path, capacity="512KiB")), "--data", str(data),
                  "--policy", "first-touch", "--stats-json", str(stats), "--",
                  *reader_args(data, tmp_path / "r.json", "--head", "4096")])
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    p, o = s["pfs"], s["opens"]
    assert o["total"] == o["pfs"] == 3 * 24
    assert p["bytes_read_by_job"] == p["bytes"] == p["bytes_without_tiering"] == 72 * 4096
    assert p["bytes_of_files_opened_by_job"] == p["bytes_without_tiering_upper_bound"] == 72 * MIB
    assert o["closed_at_position_0"] == 0
    from tiering.report import pfs_line
    assert "  PFS traffic: 288 KiB instead of 288 KiB (" in r.stderr and "  " + pfs_line(s) in r.stderr
    assert "bytes read, by file position at close: COMMAND read 288 KiB there (of files of 72 MiB it opened: " \
           "an upper bound)" in r.stderr


@pytest.mark.slow
def test_per_epoch_bytes_are_what_the_reader_read_from_the_pfs_and_from_the_tiers(tmp_path):
    data = tmp_path / "pfs"
    head_dataset(data)
    stats, out = tmp_path / "s.json", tmp_path / "r.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats), "--",
                  *reader_args(data, out, "--head", "4096", "--epoch-pause", "1.2")])
    assert r.returncode == 0, r.stderr
    s, rd = json.loads(stats.read_text()), json.loads(out.read_text())
    ep = s["epochs"]
    assert s["policy"] == "clairvoyant" and [e["opens"] for e in ep] == [e["opens"] for e in rd["epochs"]] == [24] * 3
    assert [e["bytes"] for e in rd["epochs"]] == [24 * 4096] * 3
    assert [e["pfs_bytes_read_by_job"] for e in ep] == [4096 * (24 - e["local"]) for e in rd["epochs"]]
    assert [e["tier_bytes_read_by_job"] for e in ep] == [4096 * e["local"] for e in rd["epochs"]]
    assert [e["pfs_bytes_of_files_opened_by_job"] for e in ep] == [MIB * (24 - e["local"]) for e in rd["epochs"]]
    assert s["pfs"]["bytes_read_by_job"] == sum(e["pfs_bytes_read_by_job"] for e in ep)
    assert s["opens"]["bytes_read_from_tiers"] == sum(e["tier_bytes_read_by_job"] for e in ep)
    assert s["pfs"]["bytes_without_tiering"] == 3 * 24 * 4096


# -- per-epoch numbers against the reader's own ---------------------------------------------

@pytest.fixture(scope="module")
def hooked_run(tmp_path_factory) -> tuple[dict, dict, dict[str, bytes], Path]:
    tmp = tmp_path_factory.mktemp("hooked")
    data = tmp / "pfs"
    contents = dataset(data)
    stats, out = tmp / "stats.json", tmp / "reader.json"
    r = tier_run(["--profile", str(profile(tmp)), "--data", str(data), "--stats-json", str(stats), "--",
                  *reader_args(data, out, "--epoch-pause", "1.2")])
    assert r.returncode == 0, r.stderr
    return json.loads(stats.read_text()), json.loads(out.read_text()), contents, stats


def check_epochs(stats: dict, rd: dict, contents: dict[str, bytes]) -> None:
    ep = stats["epochs"]
    assert [e["epoch"] for e in ep] == [1, 2, 3]
    assert [e["opens"] for e in ep] == [e["opens"] for e in rd["epochs"]] == [N_FILES] * 3
    assert [e["from_tiers"] for e in ep] == [e["local"] for e in rd["epochs"]]
    # COMMAND's PFS bytes of an epoch: the sizes of the files it did not read from a tier
    total = sum(map(len, contents.values()))
    assert [e["pfs_bytes_of_files_opened_by_job"] for e in ep] == \
        [total - sum(len(contents[f]) for f in e["local_files"]) for e in rd["epochs"]]
    assert [e["pfs_opens_by_job"] for e in ep] == [N_FILES - e["local"] for e in rd["epochs"]]
    # and what it read: whole files, from the PFS and from the tiers (NOTE [read counters])
    assert [e["pfs_bytes_read_by_job"] for e in ep] == [e["pfs_bytes_of_files_opened_by_job"] for e in ep]
    assert [e["tier_bytes_read_by_job"] for e in ep] == \
        [sum(len(contents[f]) for f in e["local_files"]) for e in rd["epochs"]]
    assert [e["pfs_bytes"] - e["pfs_bytes_read_by_daemon"] for e in ep] == [e["pfs_bytes_read_by_job"] for e in ep]
    assert sum(e["pfs_bytes_read_by_daemon"] for e in ep) == stats["pfs"]["bytes_read_by_daemon"]
    assert sum(e["pfs_opens"] for e in ep) == stats["pfs"]["opens"]
    assert stats["hit_ratio"] == round(sum(e["local"] for e in rd["epochs"]) / (3 * N_FILES), 4)
    assert [e["start"] for e in ep] == sorted(e["start"] for e in ep)


@pytest.mark.slow
def test_per_epoch_numbers_agree_with_what_the_reader_counted_through_the_hook(hooked_run):
    stats, rd, contents, _ = hooked_run
    assert stats["policy"] == "clairvoyant" and "per_epoch" not in stats["order"]
    check_epochs(stats, rd, contents)


@pytest.mark.slow
def test_per_epoch_numbers_agree_with_what_the_reader_counted_with_the_sampler_given(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, out = tmp_path / "stats.json", tmp_path / "reader.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats),
                  "--sampler", "random", "--seed", "0", "--epochs", "3", "--layout", "sorted", "--",
                  *reader_args(data, out, "--epoch-pause", "0.5")])
    assert r.returncode == 0, r.stderr
    check_epochs(json.loads(stats.read_text()), json.loads(out.read_text()), contents)


@pytest.mark.slow
def test_a_lead_in_seconds_is_never_more_than_the_job_has_run(tmp_path):
    """A reader that pauses between epochs while the plan holds the next
    ones: the lead in seconds, on the status lines and per epoch, is what
    was measured (how long the reader took for as many positions), never the
    lead in samples over a rate that the pause made small."""
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats),
                  "--sampler", "random", "--seed", "0", "--epochs", "3", "--layout", "sorted", "--progress-every", "1",
                  "--", *reader_args(data, tmp_path / "r.json", "--epoch-pause", "4", "--sample-delay", "0.005")])
    assert r.returncode == 0, r.stderr
    shown = [(int(m[1]) * 60 + int(m[2]), float(m[4])) for m in
             re.finditer(r"^tiering (\d+):(\d\d) prefetching [\d,]+ samples, (over )?([\d.]+) s ahead", r.stderr, re.M)]
    assert shown, r.stderr
    assert all(ahead <= elapsed + 1 for elapsed, ahead in shown), r.stderr   # the line's clock is rounded
    for e in json.loads(stats.read_text())["epochs"]:
        assert e["prefetch_lead_seconds"] is None or e["prefetch_lead_seconds"] <= e["start"] + e["seconds"], e


@pytest.mark.slow
def test_the_summary_shows_the_epochs_and_the_net_pfs_traffic(tmp_path):
    data = tmp_path / "pfs"
    dataset(data)
    stats = tmp_path / "s.json"
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--stats-json", str(stats), "--",
                  *reader_args(data, tmp_path / "r.json", "--epoch-pause", "0.5")])
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    p = s["pfs"]
    # a whole-file reader: what it read is the sizes of the files it opened
    assert p["bytes_read_by_job"] == p["bytes_of_files_opened_by_job"]
    assert s["opens"]["bytes_read_from_tiers"] == s["opens"]["bytes_of_files_served"]
    assert p["bytes"] == p["bytes_read_by_daemon"] + p["bytes_read_by_job"]
    assert p["bytes_without_tiering"] == p["bytes_read_by_job"] + s["opens"]["bytes_read_from_tiers"] == \
        p["bytes_without_tiering_upper_bound"] == 3 * sum(f.stat().st_size for f in data.rglob("*.bin"))
    assert p["opens_without_tiering"] == 3 * N_FILES
    assert s["series"]["pfs_bytes"][-1] == p["bytes"]     # the series ends on the totals
    from tiering.report import pfs_line
    assert "  " + pfs_line(s) in r.stderr and f"{s['pfs']['opens']:,} opens instead of 600" in r.stderr
    table = r.stderr[r.stderr.index("  epoch   seconds"):].splitlines()[1:4]
    assert [row.split()[0] for row in table] == ["1", "2", "3"]
    assert [int(row.split()[2].replace(",", "")) for row in table] == [N_FILES] * 3


# -- tiering status ------------------------------------------------------------------------------

def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tiering", "status", *args], capture_output=True, text=True, timeout=120)


def status_as_other_user(*args: str) -> tuple[int, str]:
    """`tiering status ARGS` in a child process that has become another user
    (this interpreter: the other user may not run the venv's); exit status
    and output."""
    from click.testing import CliRunner

    from tiering.cli import main
    rd, wr = os.pipe()

    def run() -> None:
        os.close(rd)
        res = CliRunner().invoke(main, ["status", *args])
        os.write(wr, res.output.encode())
        if res.exit_code:
            raise SystemExit(res.exit_code)

    code = as_other_user(run)
    os.close(wr)
    with os.fdopen(rd) as f:
        return code, f.read()


@pytest.mark.slow
def test_status_attaches_to_a_running_job_read_only_and_refuses_another_user(tmp_path):
    data = tmp_path / "pfs"
    dataset(data)
    go = tmp_path / "go"
    script = tmp_path / "read_and_wait.py"
    script.write_text(READ_AND_WAIT)
    job = subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(profile(tmp_path)), "--data", str(data),
                            "--policy", "first-touch", "--no-hook", "--", PYTHON, str(script), str(data), str(go)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def settled() -> dict | None:
            r = status(str(job.pid), "--json")
            if r.returncode != 0:
                return None
            st = json.loads(r.stdout)
            if st["state"] == "scanning":
                return None
            return st if st["opens"]["total"] == N_FILES and st["placed"]["files"] == N_FILES else None
        st = wait_for(settled, "the job's status: every file read once and placed")
        assert st["pid"] == job.pid and st["state"] == "running" and st["policy"] == "first-touch"
        assert st["dataset"]["files"] == N_FILES and st["tiers"][0]["name"] == "ram"
        assert st["tiers"][0]["files"] == N_FILES and st["copies"]["done"] == N_FILES
        assert st["opens"] == {"total": N_FILES, "from_tiers": 0, "pfs": N_FILES}
        assert st["events_dropped"] == 0 and st["warm_after"] is not None
        # by COMMAND's pid and by the job id too, and the view for people
        assert json.loads(status(str(st["command_pid"]), "--json").stdout)["job"] == st["job"]
        view = status(st["job"].rsplit("-", 1)[-1])
        assert view.returncode == 0, view.stderr
        assert view.stdout.startswith(f"job {st['job']} (tier-run pid {job.pid}, COMMAND pid {st['command_pid']})")
        assert "tier ram" in view.stdout and f"0 of {N_FILES}" in view.stdout
        # another user sees the job's directory but is refused by name
        code, text = status_as_other_user(str(job.pid))
        assert code == 1, text
        assert f"job {job.pid} belongs to user root: tiering status shows only your own jobs" in text
        # a --watch that ends with the job
        watch = subprocess.Popen([PYTHON, "-m", "tiering", "status", str(job.pid), "--watch", "--interval", "0.2"],
                                 stdout=subprocess.PIPE, text=True)
        assert watch.stdout is not None
        first = watch.stdout.readline()          # attached: its first view is out
        assert first.startswith(f"job {st['job']} "), first
        go.touch()
        assert job.wait(timeout=120) == 0
        rest = watch.stdout.read()               # (communicate() would skip what readline buffered)
        assert watch.wait(timeout=120) == 0
        w_out = first + rest
        assert w_out.rstrip().endswith(f"job {st['job']} has ended") and "tier ram" in w_out
    finally:
        go.touch()
        if job.poll() is None:
            job.kill()
        job.wait()
    gone = status(str(job.pid))
    assert gone.returncode != 0 and f"no running tier-run job of yours has PID {job.pid}" in gone.stderr


# -- tiering report -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_report_draws_four_panels_that_are_not_empty(hooked_run, tmp_path):
    import numpy as np
    from PIL import Image
    _, _, _, stats = hooked_run
    png = tmp_path / "report.png"
    r = subprocess.run([PYTHON, "-m", "tiering", "report", str(stats), "-o", str(png), "--direct", "3.1,2.9,3.0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    img = Image.open(png).convert("RGB")
    assert img.size == (900, 1300)
    w, h = img.size
    for k in range(4):   # the panels stand one above the other: each has colored marks (not only axes and text)
        band = np.asarray(img.crop((0, k * h // 4, w, (k + 1) * h // 4))).astype(int)
        colored = int(((band.max(axis=2) - band.min(axis=2)) > 60).sum())
        assert colored > 800, f"panel {k + 1} looks empty ({colored} colored pixels)"
    page = tmp_path / "report.html"
    assert subprocess.run([PYTHON, "-m", "tiering", "report", str(stats), "-o", str(page)],
                          timeout=120).returncode == 0
    text = page.read_text()
    assert "data:image/png;base64," in text and "PFS traffic:" in text


def times_panel(s: dict, direct: list[float] | None = None):  # type: ignore[no-untyped-def]
    """The report's epoch-time panel: its title, the bar heights of each
    series by its label, and the x labels."""
    import matplotlib.pyplot as plt

    from tiering.observe.plot import figure
    fig = figure(s, direct)
    try:
        ax = fig.get_axes()[3]
        bars = {c.get_label(): [round(b.get_height(), 6) for b in c] for c in ax.containers}
        return ax.get_title(), bars, [t.get_text() for t in ax.get_xticklabels()]
    finally:
        plt.close(fig)


@pytest.mark.slow
def test_the_reports_picture_shows_the_epoch_times_and_the_direct_runs_beside_them():
    s = small_stats()
    assert times_panel(s) == ("Epoch times under tier-run", {"under tier-run": [0.9, 0.8]}, ["1", "2"])
    assert times_panel(s, [2.0, 1.9, 2.1]) == ("Epoch times, directly and under tier-run",
                                               {"directly (PFS)": [2.0, 1.9, 2.1], "under tier-run": [0.9, 0.8]},
                                               ["1", "2", "3"])
    s["epochs"] = []     # no epochs known: COMMAND's time, against the direct run's in all
    assert times_panel(s, [2.0, 1.9]) == (
        "COMMAND's time (no epochs known: the order was not followed), directly and under tier-run",
        {"directly (PFS)": [3.9], "under tier-run": [2.0]}, ["COMMAND"])


@pytest.mark.slow
def test_report_refuses_direct_seconds_that_are_not_seconds(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(small_stats()))
    for bad in ("9.5,x", "", "1,-2", "nan"):
        r = subprocess.run([PYTHON, "-m", "tiering", "report", str(good), "-o", str(tmp_path / "g.png"),
                            "--direct", bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "--direct" in r.stderr and "seconds per epoch" in r.stderr, (bad, r.stderr)


@pytest.mark.slow
def test_report_says_what_is_wrong_with_its_input(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    r = subprocess.run([PYTHON, "-m", "tiering", "report", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a tier-run --stats-json file" in r.stderr and "Traceback" not in r.stderr


# -- make demo ----------------------------------------------------------------------------------------

def test_the_demo_falls_back_to_the_local_copy_where_slowfs_cannot_mount(tmp_path, monkeypatch):
    """Where FUSE is missing, SlowFs raises on mounting: the demo gets the
    local copy and the first line of why (then printed, as --local's is)."""
    import importlib.util
    from contextlib import ExitStack

    import bench.slowfs
    spec = importlib.util.spec_from_file_location("demo_under_test", REPO / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)

    def no_fuse(*args, **kwargs):
        raise RuntimeError("fusermount3: /dev/fuse: No such file or directory\nsecond line")

    monkeypatch.setattr(bench.slowfs, "SlowFs", no_fuse)
    src = tmp_path / "data"
    src.mkdir()
    with ExitStack() as stack:
        got = demo.mount(stack, src, tmp_path / "pfs", demo.parse_args(["--dir", str(tmp_path)]))
    assert got == (src, "fusermount3: /dev/fuse: No such file or directory")


@pytest.mark.slow
@pytest.mark.parametrize("local", [pytest.param(False, marks=pytest.mark.fuse), True], ids=["slowfs", "local"])
def test_the_demo_prints_both_runs_side_by_side(tmp_path, local):
    r = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--dir", str(tmp_path / "demo"),
                        "--classes", "4", "--per-class", "25", "--epochs", "2", *(["--local"] if local else [])],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    table = out[out.index("epoch times, same script and data"):].splitlines()
    assert table[1].split() == ["epoch", "directly", "tier-run", "speed-up"]
    assert [row.split()[0] for row in table[2:5]] == ["1", "2", "all"]
    assert "tiering: policy clairvoyant" in r.stderr and "PFS traffic:" in r.stderr
    assert (tmp_path / "demo" / "report.png").stat().st_size > 10_000
    if local:
        assert "no slow PFS: FUSE cannot be mounted here (--local)" in out
    else:
        assert "served at" in out and "by slowfs" in out


@pytest.mark.slow
def test_a_path_too_long_for_the_tier_is_a_failure_with_its_reason_in_the_summary_and_json(tmp_path, reliability):
    from test_daemon import long_rel
    data = tmp_path / "pfs"
    rel = long_rel(data)
    contents = make_data(data, {rel: 5000, "short.bin": 700})
    tier = tmp_path / ("t" * 150)
    tier.mkdir(mode=0o700)
    prof = tmp_path / "deep.yaml"
    prof.write_text(f"name: deep\ntiers:\n  - name: ssd\n    kind: filesystem\n    path: {tier}\n"
                    "    capacity: 1GiB\n    threads: 2\n")
    stats = tmp_path / "s.json"
    read = ("import sys, time\nfor _ in range(2):\n    for p in sys.argv[1:]:\n        open(p, 'rb').read()\n"
            "    time.sleep(1.0)\n")
    r = tier_run(["--profile", str(prof), "--data", str(data), "--policy", "stage", "--warm", "--stats-json",
                  str(stats), "--", PYTHON, "-c", read, str(data / rel), str(data / "short.bin")])
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    pl = s["placement"]
    assert pl["copy_failures"] == 1 and pl["copy_failures_by_reason"] == {"path too long for the tier": 1}
    assert pl["copies"] == 1 and s["tiers"][0]["copy_failures"] == 1
    assert "1 failed (1 path too long for the tier)" in r.stderr, r.stderr
    assert "before its copy landed" not in r.stderr
    assert s["opens"]["by_tier"]["ssd"] == 2 and s["opens"]["pfs"] == 2     # short.bin from the tier, twice
    assert len(contents) == 2
    reliability.survived("a data path too long for the tier (counted with its reason, read from the PFS)")


def small_stats() -> dict:
    """The least of a --stats-json that `tiering report` draws."""
    return {"policy": "first-touch", "policy_reason": None, "exit_code": 0, "command": ["python", "t.py"],
            "files": 10, "bytes": 10_000, "data": ["/d"],
            "tiers": [{"name": "ram", "kind": "memory", "path": "/dev/shm/x", "capacity": 1 << 20, "files": 10,
                       "bytes": 10_000, "used": 40_960, "copy_failures": 0}],
            "opens": {"total": 20, "pfs": 10, "by_tier": {"ram": 10}}, "hit_ratio": 0.5,
            "pfs": {"bytes": 10_000, "bytes_without_tiering": 20_000, "bytes_measure": "bytes read"},
            "epochs": [{"epoch": 1, "start": 0.1, "seconds": 0.9, "hit_ratio": 0.0},
                       {"epoch": 2, "start": 1.0, "seconds": 0.8, "hit_ratio": None}],
            "series": {"interval": 1, "t": [1.0, 2.0], "tier_bytes": {"ram": [5000, 10_000]},
                       "hit_ratio": [None, 0.5], "pfs_mib_per_s": [0.01, 0.0]},
            "seconds": {"command": 2.0, "warm": None}}


MALFORMED_STATS = {
    "not json": b"{",
    "a list": b"[1, 2]",
    "nested deeply": b"[" * 100_000,
    "tiers of numbers": {"tiers": [1, 2]},
    "a tier without its capacity": {"tiers": [{"name": "ram"}]},
    "bytes a string": {"bytes": "many"},
    "bytes infinite": {"bytes": float("inf")},
    "bytes beyond any job": {"bytes": 1e308},
    "series.t of strings": {"series": {"t": ["a"], "tier_bytes": {}, "hit_ratio": [None], "pfs_mib_per_s": [0]}},
    "series of unequal lengths": {"series": {"t": [1.0, 2.0], "tier_bytes": {"ram": [1]}, "hit_ratio": [None, None],
                                             "pfs_mib_per_s": [0, 0]}},
    "epochs without their start": {"epochs": [{"epoch": 1}]},
    "epochs without their seconds": {"epochs": [{"epoch": 1, "start": 0.1, "hit_ratio": None}]},
    "epochs an object": {"epochs": {"epoch": 1}},
    "seconds a list": {"seconds": [1]},
    "command seconds null": {"seconds": {"command": None}},
    "pfs a number": {"pfs": 3},
    "command a string": {"command": 7},
}


@pytest.mark.slow
@pytest.mark.parametrize("what", sorted(MALFORMED_STATS))
def test_report_of_a_malformed_stats_file_is_a_clear_error_with_exit_2(tmp_path, what, reliability):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(small_stats()))
    if what == sorted(MALFORMED_STATS)[0]:       # once: the least file draws
        r = subprocess.run([PYTHON, "-m", "tiering", "report", str(good), "-o", str(tmp_path / "g.html")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    change = MALFORMED_STATS[what]
    bad = tmp_path / "bad.json"
    bad.write_bytes(change if isinstance(change, bytes) else json.dumps({**small_stats(), **change}).encode())
    r = subprocess.run([PYTHON, "-m", "tiering", "report", str(bad), "-o", str(tmp_path / "b.png")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad}: not a tier-run --stats-json file" in r.stderr, r.stderr
    reliability.survived(f"tiering report of a malformed stats file ({what}): exit 2")
