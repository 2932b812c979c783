"""The catalog cache writer, the child tier-run forks once a cold scan is
done (NOTE [cache written aside]): forked in the set-up where no other
Python thread of tier-run runs, or names first by the fill's thread once
the sizes are read (NOTE [names first]), with the signals as COMMAND gets
them, and off COMMAND's terminal; what it says comes on tier-run's stderr
at the end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import age, make_data, patched_tier_run, profile, running

pytestmark = pytest.mark.usefixtures("no_leftovers")

# records the Python threads at tier-run's fork and, in the writer, its
# signal state and standard descriptors; the writer then says something
PATCH = """
import json, os, threading
import tiering.catalog.cache as cache
RECORD = os.environ["WRITER_RECORD"]
real_fork, real_save = os.fork, cache.save_now
def fork():
    threads = [t.name for t in threading.enumerate()]
    pid = real_fork()
    if pid:
        with open(RECORD + ".fork", "w") as f:
            json.dump(threads, f)
    return pid
def save_now(saves):
    st = dict(ln.split(":\\t", 1) for ln in open("/proc/self/status").read().splitlines() if ":\\t" in ln)
    with open(RECORD, "w") as f:
        json.dump({"blocked": int(st["SigBlk"], 16), "caught": int(st["SigCgt"], 16),
                   "ignored": int(st["SigIgn"], 16),
                   "fds": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)]}, f)
    cache.log.warning("a message of the cache writer")
    real_save(saves)
os.fork, cache.save_now = fork, save_now
"""


def bits(*signals: int) -> int:
    return sum(1 << (s - 1) for s in signals)


def data_args(data: Path, roots: int) -> list[str]:
    """--data options: the tree as one root (a cold scan of it goes names
    first: NOTE [names first]) or its three class directories as roots
    (every size read before COMMAND, the writer forked in the set-up)."""
    dirs = [data] if roots == 1 else [data / f"c{i}" for i in range(roots)]
    return [a for d in dirs for a in ("--data", str(d))]


# the Python threads at the writer's fork: in the set-up, the main thread
# alone (the signal watcher paused); names first, the fill's thread forks
# once the sizes are read while the main thread waits for COMMAND
FORKED_BESIDE = {1: ["MainThread", "tiering-fill"], 3: ["MainThread"]}


@pytest.mark.parametrize("roots", [1, 3], ids=["names-first", "set-up"])
def test_the_writer_is_forked_alone_takes_default_signals_and_stays_off_the_terminal(tmp_path: Path, roots: int):
    data = tmp_path / "pfs"
    # more files than a names-first listing stats at once (scan.STAT_AT_ONCE): the sizes come later
    make_data(data, {f"c{i % 3}/f{i}.bin": 100 for i in range(90)})
    age(data)
    record, cache = tmp_path / "writer.json", tmp_path / "cache"
    r = subprocess.run([sys.executable, "-c", patched_tier_run(PATCH), "--profile", str(profile(tmp_path)),
                        *data_args(data, roots), "--policy", "first-touch", "--", "sh", "-c", "echo COMMAND"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, WRITER_RECORD=str(record), XDG_CACHE_HOME=str(cache)))
    assert r.returncode == 0, r.stderr
    assert json.loads(Path(f"{record}.fork").read_text()) == FORKED_BESIDE[roots]   # never the signal watcher
    w = json.loads(record.read_text())
    assert w["blocked"] == 0
    handled = bits(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGCHLD, signal.SIGURG)
    assert w["caught"] & handled == 0 and w["ignored"] & (handled | bits(signal.SIGPIPE, signal.SIGXFSZ)) == 0
    assert w["fds"][0] == os.devnull and w["fds"][1] == w["fds"][2] and w["fds"][1].endswith("/cache-writer.out")
    # COMMAND's stdout is its own; the writer's message comes last on tier-run's stderr
    assert r.stdout == "COMMAND\n"
    assert r.stderr.splitlines()[-1] == "tiering: a message of the cache writer", r.stderr
    assert len(list((cache / "tiering" / "catalogs").glob("*.npz"))) == roots


# the signal comes while the set-up's watcher is paused for the writer's fork;
# the writer records that it wrote the cache
PAUSED_SIGNAL = """
import os
import tiering.catalog as catalog
import tiering.catalog.cache as cache
real_child, real_save = catalog.save_in_child, cache.save_now
def save_in_child(*a, **kw):
    os.kill(os.getpid(), int(os.environ["SIGNAL"]))
    return real_child(*a, **kw)
def save_now(saves):
    real_save(saves)
    open(os.environ["WRITER_DONE"], "w").close()
catalog.save_in_child, cache.save_now = save_in_child, save_now
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_while_the_watcher_is_paused_for_the_fork_stops_tier_run_before_command(tmp_path: Path, sig):
    """The signal stays pending while the watcher is stopped around the
    writer's fork, and is taken when it runs again: tier-run ends with
    128+N before COMMAND starts, and its teardown waits for the writer."""
    data = tmp_path / "pfs"
    make_data(data, {f"c{i % 3}/f{i}.bin": 100 for i in range(30)})
    age(data)
    done, cache, marker = tmp_path / "written", tmp_path / "cache", tmp_path / "ran"
    with running([sys.executable, "-c", patched_tier_run(PAUSED_SIGNAL), "--profile",
                  str(profile(tmp_path)), *data_args(data, 3), "--", "touch", str(marker)], text=True,
                 env=dict(os.environ, SIGNAL=str(int(sig)), WRITER_DONE=str(done), XDG_CACHE_HOME=str(cache))) as p:
        out, err = p.communicate(timeout=300)
    assert p.returncode == 128 + sig, err
    assert f"tier-run: interrupted by {signal.Signals(sig).name} before COMMAND started" in err
    assert "Traceback" not in err
    assert not marker.exists()
    assert done.exists()                      # the writer, forked before the signal was taken, wrote
    assert len(list((cache / "tiering" / "catalogs").glob("*.npz"))) == 3


# the writer waits for WRITER_GO (made by COMMAND once it got SIGTERM) before it writes
SLOW_WRITER = """
import os, time
import tiering.catalog.cache as cache
real_save = cache.save_now
def save_now(saves):
    while not os.path.exists(os.environ["WRITER_GO"]):
        time.sleep(0.01)
    real_save(saves)
cache.save_now = save_now
"""


def test_sigterm_to_tier_run_while_the_writer_runs_reaches_command_alone(tmp_path: Path):
    """A SIGTERM to tier-run while COMMAND runs and the writer still writes
    goes to COMMAND; tier-run's exit status is COMMAND's, and the writer
    (not signalled) still writes the cache."""
    data = tmp_path / "pfs"
    make_data(data, {f"c{i % 3}/f{i}.bin": 100 for i in range(30)})
    age(data)
    go, cache = tmp_path / "go", tmp_path / "cache"
    script = ("import os, signal, sys, time\n"
              "def term(*_):\n"
              f"    open({str(go)!r}, 'w').close()\n"
              "    os.write(1, b'got TERM\\n')\n"
              "    os._exit(7)\n"
              "signal.signal(signal.SIGTERM, term)\n"
              "os.write(1, b'ready\\n')\n"
              "time.sleep(600)\n")
    with running([sys.executable, "-c", patched_tier_run(SLOW_WRITER), "--profile", str(profile(tmp_path)),
                  "--data", str(data), "--", sys.executable, "-c", script],
                 env=dict(os.environ, WRITER_GO=str(go), XDG_CACHE_HOME=str(cache))) as p:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        assert not go.exists()                # the writer is still waiting
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=300)
    assert p.returncode == 7, err
    assert out == b"got TERM\n"
    assert len(list((cache / "tiering" / "catalogs").glob("*.npz"))) == 1
