"""What users install works: the wheel built from the checkout's sources,
installed into a fresh virtual environment (no editable install, no system
site-packages), runs an unchanged training script from outside the checkout
under its own tier-run, with the order learnt by the hook; and `make test`
shows its progress while it runs.

Nothing is reused between runs: the sources are copied afresh (no build/
directory of an earlier build can leak into the wheel), pip caches nothing,
and the environment is removed at the end."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import PYTHON, REPO, make_data, profile, read_until

TRAIN = REPO / "tests" / "workloads" / "train_hooked.py"
EPOCHS = 3
N = 60


def source_files() -> list[str]:
    """The checkout's files as git sees them: tracked, and new ones not ignored."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                       capture_output=True, check=True)
    return sorted(f for f in r.stdout.decode().split("\0") if f and (REPO / f).is_file())


def pip(python: Path | str, *args: str, cwd: Path) -> None:
    r = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args, "--no-cache-dir"],
                       cwd=cwd, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def clean_env(venv: Path) -> dict[str, str]:
    """A user's shell with the venv's bin first on PATH and nothing of this test session."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_PRELOAD", "PYTHONSAFEPATH")
           and not k.startswith("TIERING_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_runs_an_unchanged_training_in_its_order(tmp_path):
    # 1. the wheel, from a fresh copy of the sources
    src = tmp_path / "src"
    files = source_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    wheels = tmp_path / "wheels"
    pip(PYTHON, "wheel", "--no-deps", "-w", str(wheels), str(src), cwd=tmp_path)
    (wheel,) = wheels.glob("tiering-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {f for f in files if f.startswith("tiering/") and f.endswith(".py")}
    expected |= {"tiering/tiering.h", "tiering/libtiershim.so", "tiering/profiles/__init__.py"}
    expected |= {f"tiering/profiles/{Path(f).name}" for f in files if f.startswith("profiles/") and f.endswith(".yaml")}
    assert expected - shipped == set()
    assert {"tiering/hook/sitecustomize.py", "tiering/profiles/auto.yaml"} <= shipped

    # 2. a fresh venv with the wheel, its dependencies and torch
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
        py = venv / "bin" / "python"
        pip(py, "install", str(wheel), "torch==2.13.0", cwd=tmp_path)
        _train_under_the_installed_tier_run(tmp_path, venv)
    finally:
        shutil.rmtree(venv, ignore_errors=True)   # about 1 GB


def _train_under_the_installed_tier_run(tmp: Path, venv: Path) -> None:
    work = tmp / "work"                       # outside the checkout: nothing of it is importable
    work.mkdir()
    shutil.copy(TRAIN, work / "train.py")     # an unchanged script that knows nothing of tiering
    data = tmp / "data"
    make_data(data, {f"c{i % 4}/s{i:03d}.bin": 2000 + 37 * i for i in range(N)}, seed=5)
    env = clean_env(venv)
    args = ["train.py", "--data", str(data), "--sampler", "random", "--workers", "2", "--epochs", str(EPOCHS)]

    where = subprocess.run(["python", "-c", "import tiering, sys; print(tiering.__file__); print(sys.prefix)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == str(venv)

    plain = subprocess.run(["python", *args, "--out", "plain.json"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    tier_run = venv / "bin" / "tier-run"
    stats = tmp / "stats.json"
    r = subprocess.run([str(tier_run), "--profile", str(profile(tmp)), "--data", str(data), "--stats-json",
                        str(stats), "--", "python", *args, "--out", "tiered.json"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "did not start" not in r.stderr and "missing" not in r.stderr, r.stderr

    # the same training: batches, weights and RNG state
    assert json.loads((work / "tiered.json").read_text()) == json.loads((work / "plain.json").read_text())
    s = json.loads(stats.read_text())
    assert (s["policy"], s["policy_requested"], s["policy_reason"]) == ("clairvoyant", "clairvoyant", None)
    o = s["order"]
    assert o["epochs_known"] >= EPOCHS, o                  # every epoch announced by the hook
    assert o["following"] and not o["diverged"], o
    assert o["matched_opens"] >= 0.95 * EPOCHS * N, o       # DataLoader workers may reorder a few
    assert s["opens"]["total"] == EPOCHS * N
    assert s["opens"]["by_tier"]["ram"] >= N, s["opens"]    # at least an epoch's worth from the tier
    assert s["files"] == N and s["exit_code"] == 0


def test_make_test_shows_progress_through_a_pipe(tmp_path):
    """The test command of the Makefile, its output a pipe as in CI: each
    test's result shows as it completes, and the name of the test that runs
    shows while it runs (the second test here waits until its name has come
    through)."""
    cmd = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "print-PYTEST", f"PY={PYTHON}"],
                         capture_output=True, text=True, check=True).stdout.split()
    go = tmp_path / "go"
    (tmp_path / "test_probe.py").write_text(
        "import os, time\n"
        "def test_first():\n"
        "    pass\n"
        "def test_second():\n"
        "    deadline = time.monotonic() + 120\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        assert time.monotonic() < deadline, 'the first result never came through'\n"
        "        time.sleep(0.02)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen([*cmd, "-p", "no:cacheprovider", "test_probe.py"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(p.stdout, b"test_probe.py::test_second", timeout=60)
        assert b"test_probe.py::test_first PASSED" in seen
        go.touch()
        assert p.wait(timeout=300) == 0
    finally:
        p.kill()
        p.wait()
