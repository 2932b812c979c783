"""What making a copy visible costs a file system, for small files: the same
copy (a source in the page cache, sendfile) published four ways, side by side
on each file system (bench/publish.c):

    create   the final name made directly, as cp -r and tar do
    staging  a name in a staging directory renamed into place once complete
             (tiering's copies, NOTE [batch copy] in docs/design.md)
    samedir  a temporary name in the destination directory, renamed
    tmpfile  an unnamed O_TMPFILE in the destination directory, linked once complete

    python -m bench.publish [--files N] [--size BYTES] [--rounds R] [--dir DIR ...] [--out DIR]

File systems: every --dir (default: the system's temporary directory; each
named by its type), /dev/shm (tmpfs) and, as root with mkfs.ext4 and loop
devices, an ext4 file system on a loop device backed by /dev/shm: ext4's own
costs without a device's noise.  Each round runs every mode once, in an order rotated every
round, on a fresh directory (removed untimed after a syncfs, also untimed).
Reported: the median files/s over rounds of each mode and its ratio to
`create`, paired within each round.  Writes OUT/publish.json and OUT/publish.md
(default bench/results).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.ext4mem import ext4_in_memory, unavailable

BENCH_DIR = Path(__file__).resolve().parent
SOURCE = BENCH_DIR / "publish.c"
MODES = ("create", "staging", "samedir", "tmpfile")
WHAT = {"create": "the final name made directly (cp -r, tar)",
        "staging": "staging directory, renamed into place (tiering)",
        "samedir": "temporary name beside the final one, renamed",
        "tmpfile": "O_TMPFILE, linked under its name"}
PER_DIR = 1000
Place = contextlib.AbstractContextManager[Path]


def build(work: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("bench.publish: a C compiler (cc or gcc) is needed")
    out = work / "publish"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-o", str(out), str(SOURCE)], check=True)
    return out


def published(root: Path, size: int) -> tuple[int, int]:
    """(files under their final names with the source's size, any other
    entries left in the destination directories or the staging directory)."""
    good = other = 0
    for d in os.scandir(root):
        for e in os.scandir(d.path):
            if d.name != "staging" and e.name.startswith("f") and e.stat().st_size == size:
                good += 1
            else:
                other += 1
    return good, other


def run_round(binary: Path, place: Path, source: Path, files: int, order: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode in order:
        root = place / f"round-{mode}"
        shutil.rmtree(root, ignore_errors=True)
        os.sync()
        r = subprocess.run([str(binary), mode, str(root), str(files), str(PER_DIR), str(source)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"bench.publish: {mode} in {place} failed: {r.stderr.strip()}")
        rec = json.loads(r.stdout)
        rec["files_per_s"] = rec["files"] / rec["seconds"]
        rec["published"], rec["left_over"] = published(root, source.stat().st_size)
        out[mode] = rec
        shutil.rmtree(root, ignore_errors=True)
    return out


def measure(binary: Path, name: str, place: Path, source: Path, files: int, rounds: int) -> dict[str, Any]:
    runs = []
    for k in range(rounds):
        order = list(MODES[k % len(MODES):] + MODES[:k % len(MODES)])
        runs.append(run_round(binary, place, source, files, order))
        print(f"  {name} round {k + 1}: " + ", ".join(f"{m} {runs[-1][m]['files_per_s']:,.0f}/s" for m in MODES),
              file=sys.stderr)
    summary = {}
    for m in MODES:
        rates = [r[m]["files_per_s"] for r in runs]
        ratios = [r[m]["files_per_s"] / r["create"]["files_per_s"] for r in runs]
        summary[m] = {"files_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                      "ratio_to_create": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratio_max": max(ratios)}
    return {"name": name, "path": str(place), "rounds": runs, "modes": summary}


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['files']:,} files of {result['size']:,} bytes, {result['rounds']} rounds, the modes "
             "interleaved; files/s: median over rounds (min-max); ratio: to `create` in the same round, "
             "median (min-max).", "",
             "| file system | mode | what | files/s | ratio to create |", "|---|---|---|---:|---:|"]
    for fs in result["file_systems"]:
        if "error" in fs:
            lines.append(f"| {fs['name']} | - | not measured: {fs['error']} | - | - |")
            continue
        for m in MODES:
            s = fs["modes"][m]
            rate = f"{s['files_per_s']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"
            ratio = f"{s['ratio_to_create']:.2f} ({s['ratio_min']:.2f}-{s['ratio_max']:.2f})"
            lines.append(f"| {fs['name']} | {m} | {WHAT[m]} | {rate} | {ratio} |")
    return "\n".join(lines) + "\n"


def fs_type(path: Path) -> str:
    """The type of the file system path is on, as mounted (stat -f names ext4 "ext2/ext3")."""
    r = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)], capture_output=True, text=True)
    return r.stdout.strip() or "file system"


@contextlib.contextmanager
def private_dir(parent: Path) -> Iterator[Path]:
    """A fresh directory under parent, removed with everything in it at the end."""
    place = Path(tempfile.mkdtemp(prefix="tiering-publish-", dir=parent))
    try:
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


def places(dirs: list[Path], work: Path, files: int, size: int) -> Iterator[tuple[str, Place]]:
    """(name, a context giving a fresh directory) of every file system measured."""
    for d in dirs:
        yield f"{fs_type(d)} ({d})", private_dir(d)
    yield "tmpfs (/dev/shm)", private_dir(Path("/dev/shm"))
    why = unavailable()
    if why:
        print(f"bench.publish: no ext4 in memory: {why}", file=sys.stderr)
        return
    yield "ext4 on a loop device in /dev/shm", ext4_in_memory(work / "ext4", files, size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000, help="files per mode and round")
    ap.add_argument("--size", type=int, default=1024, help="bytes per file")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, action="append", default=None,
                    help="a directory on a file system to measure (repeatable; default: the temporary directory)")
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    a = ap.parse_args(argv)
    if a.files < 1 or a.size < 1 or a.rounds < 1:
        ap.error("--files, --size and --rounds must be positive")
    dirs = [d.resolve() for d in (a.dir or [Path(tempfile.gettempdir())])]
    for d in dirs:
        if not d.is_dir():
            ap.error(f"--dir {d}: not a directory")
    file_systems: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tiering-publish-") as tmp:
        work = Path(tmp)
        binary = build(work)
        fd, name = tempfile.mkstemp(prefix="tiering-publish-source-", dir="/dev/shm")
        source = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(a.size))
            for fs, place in places(dirs, work, a.files, a.size):
                try:
                    with place as p:
                        file_systems.append(measure(binary, fs, p, source, a.files, a.rounds))
                except RuntimeError as e:    # an ext4 that could not be made
                    print(f"bench.publish: {fs}: {e}", file=sys.stderr)
                    file_systems.append({"name": fs, "error": str(e)})
        finally:
            source.unlink(missing_ok=True)
    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "files": a.files, "size": a.size, "rounds": a.rounds, "file_systems": file_systems}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "publish.json").write_text(json.dumps(result, indent=2) + "\n")
    md = table(result)
    (a.out / "publish.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
