"""`make demo`: one training script, run twice on a slow parallel file system.

The data set (real JPEG files) is served through slowfs (bench/slowfs: FUSE,
every metadata operation, read request and byte charged like a busy Lustre
seen from one client).  The unchanged training script (examples/
train_tiny_cnn.py) reads it once directly and once under tier-run; the
epoch times are printed side by side, then tier-run's summary, and
`tiering report` draws the picture (with the direct run's epoch times).

Where FUSE cannot be mounted (no /dev/fuse, no fuse3, a container without
the capability) the demo says so and runs both on the local copy: both then
read from the page cache, and any difference is noise.

    python examples/demo.py [--dir DIR] [--epochs 3] [--per-class 100]

DIR (default $TMPDIR/tiering-demo-$USER, /tmp without TMPDIR) is the user's
own: made 0700 when missing, refused when it is another user's or not a
directory.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from tiering.observe.view import pct

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "train_tiny_cnn.py"
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)\s+([\d.]+) s")


def default_dir() -> Path:
    """$TMPDIR/tiering-demo-$USER: each user's own, also in a /tmp they share."""
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"tiering-demo-{getpass.getuser()}"


def own_dir(path: Path) -> Path:
    """path as a directory of this user's, made 0700 when missing; SystemExit
    with the reason when it is another user's, or not a directory."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise SystemExit(f"demo: {path} is not a directory (a symlink?): choose another with --dir "
                         "(make demo DEMO_DIR=...)")
    if st.st_uid != os.geteuid():
        raise SystemExit(f"demo: {path} belongs to another user (uid {st.st_uid}): choose another with --dir "
                         "(make demo DEMO_DIR=...)")
    return path


def tier_run_command() -> str:
    """The tier-run of the environment running the demo, else the one on PATH."""
    here = Path(sys.executable).parent / "tier-run"
    return str(here) if here.exists() else shutil.which("tier-run") or "tier-run"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=default_dir())
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--meta-latency-ms", type=float, default=2.0, help="slowfs: per metadata operation")
    p.add_argument("--read-latency-ms", type=float, default=1.0, help="slowfs: per read request")
    p.add_argument("--bandwidth-mbps", type=float, default=200.0, help="slowfs: MB/s in all")
    p.add_argument("--local", action="store_true", help="no slowfs: both runs read the local copy")
    return p.parse_args(argv)


def generate(data: Path, classes: int, per_class: int) -> None:
    subprocess.run([sys.executable, "-m", "bench.datagen", str(data), "--classes", str(classes),
                    "--per-class", str(per_class), "--jpeg", "--seed", "0"], cwd=REPO, check=True)


def mount(stack: ExitStack, source: Path, where: Path, a: argparse.Namespace) -> tuple[Path, str | None]:
    """The slow PFS's mount point, or the source itself and why not."""
    sys.path.insert(0, str(REPO))   # bench/ lives in the checkout
    try:
        from bench.slowfs import SlowFs, SlowFsOptions, sweep_stale_mounts
        sweep_stale_mounts(where.parent)
        opts = SlowFsOptions(meta_latency_ms=a.meta_latency_ms, read_latency_ms=a.read_latency_ms,
                             bandwidth_mbps=a.bandwidth_mbps)
        fs = stack.enter_context(SlowFs(source, where, opts))
        return fs.path, None
    except (ImportError, RuntimeError, TimeoutError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return source, first


def run_training(cmd: list[str], label: str) -> tuple[list[float], int]:
    """Runs cmd, echoing the training's lines with a label; its epoch times
    and exit status.  stderr (tier-run's progress and summary) goes straight
    to the terminal."""
    print(f"\n== {label}: {' '.join(cmd)}", flush=True)
    times: list[float] = []
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"   {line}", end="", flush=True)
        m = EPOCH_LINE.match(line)
        if m:
            times.append(float(m.group(3)))
    return times, proc.wait()


def side_by_side(direct: list[float], tiered: list[float], where: str) -> str:
    rows = [f"epoch times, same script and data ({where}):",
            f"  {'epoch':>5}  {'directly':>10}  {'tier-run':>10}  {'speed-up':>9}"]
    for k, (d, t) in enumerate(zip(direct, tiered), 1):
        rows.append(f"  {k:>5}  {d:>8.2f} s  {t:>8.2f} s  {d / t if t else 0:>8.2f}x")
    rows.append(f"  {'all':>5}  {sum(direct):>8.2f} s  {sum(tiered):>8.2f} s  "
                f"{sum(direct) / sum(tiered) if sum(tiered) else 0:>8.2f}x")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.monotonic()
    own_dir(a.dir)
    data = a.dir / "data"
    generate(data, a.classes, a.per_class)
    stats = a.dir / "stats.json"
    with ExitStack() as stack:
        pfs, why_not = (data, "--local") if a.local else mount(stack, data, a.dir / "pfs", a)
        if why_not:
            where = "local disk: FUSE is not available, so no slow PFS"
            print(f"\ndemo: no slow PFS: FUSE cannot be mounted here ({why_not}); both runs read the local "
                  f"copy {data}, from the page cache, so they show no benefit: run `make bench-deps` (root installs "
                  "fuse3) on a machine with /dev/fuse to see one", flush=True)
        else:
            where = (f"slowfs: {a.meta_latency_ms:g} ms per metadata operation, {a.read_latency_ms:g} ms per read, "
                     f"{a.bandwidth_mbps:g} MB/s")
            print(f"\ndemo: the data set {data} is served at {pfs} by slowfs, an emulated PFS ({where})",
                  flush=True)
        train = [sys.executable, str(TRAIN), "--data", str(pfs), "--epochs", str(a.epochs)]
        direct, rc1 = run_training(train, "the training reading the PFS directly")
        tier_run = tier_run_command()
        cache = tempfile.mkdtemp(prefix="tiering-demo-cache-")   # a first run: the catalog is scanned
        env_cmd = ["env", f"XDG_CACHE_HOME={cache}", tier_run, "--progress-every", "5", "--data", str(pfs),
                   "--stats-json", str(stats), "--"]
        tiered, rc2 = run_training(env_cmd + train, "the same under tier-run")
        shutil.rmtree(cache, ignore_errors=True)
    if rc1 or rc2 or len(direct) != a.epochs or len(tiered) != a.epochs:
        print(f"demo: a training run failed (exit {rc1}, {rc2})", file=sys.stderr)
        return 1
    print("\n" + side_by_side(direct, tiered, where))
    picture = a.dir / "report.png"
    r = subprocess.run([sys.executable, "-m", "tiering", "report", str(stats), "-o", str(picture),
                        "--direct", ",".join(f"{t:.3f}" for t in direct)], capture_output=True, text=True)
    s = json.loads(stats.read_text())
    print(f"\ntier-run's statistics: {stats} (policy {s['policy']}, hit ratio {pct(s['hit_ratio'])}); " +
          (f"picture: {picture}" if r.returncode == 0 else f"no picture: {r.stderr.strip()}"))
    print(f"demo: {time.monotonic() - t_start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
