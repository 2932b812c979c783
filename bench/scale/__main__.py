"""The scale benchmark's driver.

    python -m bench.scale [--files N] [--epochs E] [--out DIR] [--only CASE ...]

Builds (or reuses) an ImageNet-shaped tree of N small files in 1,000 class
directories under --work, then runs each case and writes DIR/scale.json
(every number, the machine, the command) and DIR/scale.md (the table of
targets: ours, reference, ratio, verdict).  Cases:

    startup                  tier-run start-up to COMMAND, cold and cached catalog, vs find | wc -l
    plan                     tiering plan for all epochs (random, distributed): time, peak RSS
    clairvoyant-random       tier-run --sampler random: peak RSS, daemon CPU at a paced reader,
    clairvoyant-distributed  events at full speed (8 threads), following the order, teardown
    copies-small             tier-run --policy stage vs cp -r and tar | tar, files/s
    copies-small-ram         the same into /dev/shm (a memory tier), files/s
    copies-small-ext4        the same onto ext4 on a loop device in /dev/shm (as root), files/s
    copies-large             the same on large files of real data, MB/s

Page cache and dentries are warm for ours and the references alike. Runs
longer than --limit seconds are killed and recorded as such.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from bench.scale import cases, report
from bench.scale.tool import Tree, build_tool, make_tree

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} rounds: give 1 or more")
    return n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_281_167, help="files in the tree (ImageNet-1k train: 1,281,167)")
    ap.add_argument("--epochs", type=int, default=90, help="epochs given to tier-run and tiering plan")
    ap.add_argument("--size", type=int, default=1024, help="bytes per file")
    ap.add_argument("--rate", type=float, default=3000, help="opens/s of the paced reader")
    ap.add_argument("--paced-seconds", type=float, default=20, help="length of each paced reading phase")
    ap.add_argument("--threads", type=int, default=8, help="threads of the full-speed reader")
    ap.add_argument("--large", default="8x256", help="large files: COUNTxMIB (real data)")
    ap.add_argument("--copy-rounds", type=_at_least_one, default=cases.Settings.copy_rounds,
                    help="stagings onto the disk, each between two cp -r (case copies-small)")
    ap.add_argument("--limit", type=float, default=1200, help="wall-clock limit of one run, seconds")
    ap.add_argument("--plan-limit", type=float, default=600, help="wall-clock limit of one `tiering plan`, seconds")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR") or "/tmp") / "tiering-scale",
                    help="where the trees, copies and run directories live (a local disk)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                    help="directory for scale.json and scale.md")
    ap.add_argument("--only", nargs="+", choices=list(cases.CASES), help="run only these cases")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other cases of an existing DIR/scale.json of the same size and epochs")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the targets and DIR/scale.md from DIR/scale.json")
    return ap.parse_args(argv)


def machine() -> dict[str, Any]:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO).stdout.strip()
        except OSError:
            return ""
    import torch
    return {"cpus": os.cpu_count(), "memory": psutil.virtual_memory().total, "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__,
            "commit": out(["git", "rev-parse", "HEAD"]), "dirty": bool(out(["git", "status", "--porcelain"])),
            "load_at_start": os.getloadavg()}


def compile_package() -> bool:
    """tiering's modules compiled to bytecode, as `pip install .` does for a
    wheel: an editable install under PYTHONDONTWRITEBYTECODE=1 would compile
    every module at each start, which users' tier-run does not (about 0.3 s
    of the start-up on these machines).  Whether it could."""
    import tiering
    where = Path(tiering.__file__).parent
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", str(where)], capture_output=True)
    return done.returncode == 0


def previous(a: argparse.Namespace) -> dict[str, Any] | None:
    """DIR/scale.json when it measured the same tree and epochs."""
    try:
        doc = json.loads((a.out / "scale.json").read_text())
    except (OSError, ValueError):
        return None
    same = doc.get("tree", {}).get("files") == a.files and doc.get("settings", {}).get("epochs") == a.epochs
    return doc if same else None


def render(out: Path) -> str:
    """Targets and table again from DIR/scale.json (after report.py changed)."""
    doc = json.loads((out / "scale.json").read_text())
    table = report.rows(doc["cases"], doc["settings"]["epochs"])
    doc["targets"] = report.as_json(table)
    (out / "scale.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    text = report.markdown(table, (out / "scale.md").read_text().split("\n")[0])
    (out / "scale.md").write_text(text)
    return text


def _measured_by(case: dict[str, Any]) -> str:
    """The command and the commit a case was measured by, for the headline."""
    return f"{case['measured_by']} (at {str(case.get('commit') or '?')[:7]})"


def write_results(a: argparse.Namespace, argv: list[str] | None, settings: cases.Settings, tree: Tree,
                  gen_seconds: float, results: dict[str, Any], total: float, compiled: bool) -> str:
    """scale.json and scale.md in --out (after every case, so that a run cut
    short keeps what it measured); returns the table."""
    command = ["python", "-m", "bench.scale", *(argv if argv is not None else sys.argv[1:])]
    earlier = previous(a) if a.merge else None
    if earlier:
        kept = {name: {"measured_by": " ".join(earlier["command"]), "commit": earlier["machine"].get("commit"), **res}
                for name, res in earlier["cases"].items() if name not in results}
        results = {name: ({**kept, **results})[name] for name in cases.CASES if name in kept or name in results}
    table = report.rows(results, a.epochs)
    doc = {"command": command,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "machine": {**machine(), "bytecode_compiled": compiled},
           "settings": {**asdict(settings), "work": str(settings.work)},
           "tree": {"files": tree.files, "classes": tree.classes, "size": tree.size, "bytes": tree.bytes,
                    "root": str(tree.root), "generate_seconds": gen_seconds},
           "cases": results, "targets": report.as_json(table), "seconds": total}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    commands = sorted({_measured_by(r) for r in results.values() if "measured_by" in r}) or [" ".join(command)]
    headline = (f"Measured with `{'` and `'.join(commands)}`: {tree.files:,} files of {tree.size} B in "
                f"{tree.classes} class directories, {a.epochs} epochs, {os.cpu_count()} cores; page cache warm "
                f"for ours and the references.")
    text = report.markdown(table, headline)
    (a.out / "scale.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.render:
        print(render(a.out))
        return 0
    count, mib = (int(x) for x in a.large.lower().split("x"))
    a.work.mkdir(parents=True, exist_ok=True)
    settings = cases.Settings(a.files, a.epochs, a.size, a.rate, a.paced_seconds, a.threads, count, mib * MiB,
                              a.limit, a.plan_limit, a.work.resolve(), a.copy_rounds)
    t0 = time.monotonic()
    compiled = compile_package()
    tool = build_tool(settings.work)
    tree, gen_seconds = make_tree(tool, settings.work, a.files, a.size, seed=0)
    print(f"bench.scale: tree of {tree.files} files at {tree.root}"
          + (f" (generated in {gen_seconds:.1f} s)" if gen_seconds else " (cached)"), flush=True)
    if gen_seconds:
        # tier-run does not cache the catalog of directories changed seconds before its scan
        print("bench.scale: letting the new tree settle for 11 s", flush=True)
        time.sleep(11)
    runs = settings.work / "runs"
    shm = Path("/dev/shm") / f"tiering-scale-{os.getpid()}"
    ctx = cases.Context(settings, tool, tree, runs, shm)
    shutil.rmtree(runs, ignore_errors=True)
    results: dict[str, Any] = {}
    try:
        for name in a.only or list(cases.CASES):
            print(f"bench.scale: {name} ...", flush=True)
            results[name] = {"measured_by": " ".join(["python", "-m", "bench.scale", *(argv or sys.argv[1:])]),
                             "commit": machine().get("commit"), **cases.run_case(ctx, name)}
            print(f"bench.scale: {name} done in {results[name]['case_seconds']:.0f} s"
                  + (f" ({results[name]['error']})" if "error" in results[name] else ""), flush=True)
            write_results(a, argv, settings, tree, gen_seconds, results, time.monotonic() - t0, compiled)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    print(write_results(a, argv, settings, tree, gen_seconds, results, time.monotonic() - t0, compiled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
