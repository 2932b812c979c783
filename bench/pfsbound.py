"""The PFS-bound benchmark: a reader that the PFS, not compute, holds back.

    python -m bench.pfsbound [--quick] [--scenario pfs-fits|pfs-half ...]
                             [--files N] [--epochs E] [--threads T] [--out DIR]

A C reader (bench/workloads/preader.c) with T threads (default 8) reads
every file once per epoch with open + pread + close, in a seeded random
permutation per epoch; it has no compute, so an epoch takes as long as its
I/O.  The data set (bench.datagen, sizes around 20 KiB) is served by slowfs
with the defaults of SlowFsOptions.  Side by side in one run:

    pfs           the reader on the slowfs mount, no tier-run
    pfs-parallel  every file read once, directly, by as many threads as the PFS
                  serves at once (max_inflight): the time of reading D once at
                  the PFS's parallel rate (one epoch)
    stage, clairvoyant, first-touch
                  tier-run with that policy; clairvoyant is given the reader's
                  order (--order-file, the same file preader reads, --layout sorted)
    lower-bound   the reader on a copy in /dev/shm, no shim

in two scenarios:

    pfs-fits   the data fits in the RAM tier (capacity 1.3 D)
    pfs-half   the tiers hold half of it (RAM 0.5 D, no SSD)

Per configuration and epoch: seconds, PFS bytes / D and PFS opens (slowfs's
counters between epochs), opens by tier; per scenario the bounds (LB: the
lower bound's mean epoch; PFS-parallel; for pfs-half the spill bound
(D - C) / D x PFS-parallel) and the ratios against them.  Results:
bench/results/pfsbound.{json,md} (--quick: 2,000 files, into
bench/results/quick/).  Times are only compared within one run.
"""
from __future__ import annotations

import argparse
import getpass
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.datagen import KiB, generate
from bench.run import REPO, RESULTS, Scenario, run_c_reader, sample_files, tier_run_summary, write_profile
from bench.slowfs import SlowFs, SlowFsOptions, ensure_built, sweep_stale_mounts

SCENARIOS = {
    "pfs-fits": Scenario("pfs-fits", 1.3, 0.0, "the data fits in the RAM tier"),
    "pfs-half": Scenario("pfs-half", 0.5, 0.0, "the tiers hold half of the data (RAM 0.5 D, no SSD)"),
}
CONFIGS = ["pfs", "pfs-parallel", "stage", "clairvoyant", "first-touch", "lower-bound"]
POLICIES = ("stage", "clairvoyant", "first-touch")
CONFIG_TEXT = {
    "pfs": "the reader on the PFS directly, no tier-run",
    "pfs-parallel": "every file once, max-in-flight threads, directly (1 epoch)",
    "stage": "tier-run: copy everything at start",
    "clairvoyant": "tier-run: prefetch in the given order",
    "first-touch": "tier-run: copy a file when first opened",
    "lower-bound": "the reader on a copy in /dev/shm, no shim",
}
MEAN_SIZE = 20 * KiB
CLASSES = 100
SEED = 0


@dataclass(frozen=True)
class Settings:
    files: int
    epochs: int
    threads: int
    pfs: SlowFsOptions
    work: Path
    out: Path
    configs: tuple[str, ...] = tuple(CONFIGS)


def write_orders(rels: list[str], epochs: int, path: Path, seed: int = SEED) -> list[list[int]]:
    """A seeded random permutation of the sorted files per epoch, written as a
    tier-run order file of relative paths (epochs separated by a blank line)."""
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(len(rels)).tolist() for _ in range(epochs)]
    path.write_text("\n\n".join("\n".join(rels[i] for i in order) for order in orders) + "\n")
    return orders


def run_one(name: str, s: Settings, fs: SlowFs, profile: Path, shm_copy: Path, orders: Path,
            scratch: Path) -> dict[str, Any]:
    """One configuration: preader (under tier-run for the policies), slowfs's
    counters taken between its epochs."""
    out = scratch / f"{name}.json"
    stats_json = scratch / f"{name}-stats.json"
    data = shm_copy if name == "lower-bound" else fs.path
    threads, epochs = (s.pfs.max_inflight, 1) if name == "pfs-parallel" else (s.threads, s.epochs)
    reader = [str(s.work / "preader"), "-", str(epochs), "--sync", "--threads", str(threads),
              "--order", str(orders), "--root", str(data)]
    if name == "lower-bound":
        reader += ["--tier", f"shm={shm_copy}/"]
    cmd = reader
    if name in POLICIES:
        reader += ["--tier", f"ram=/dev/shm/tiering-{getpass.getuser()}-"]
        extra = ["--order-file", str(orders), "--layout", "sorted"] if name == "clairvoyant" else []
        cmd = [sys.executable, "-m", "tiering", "run", "--profile", str(profile), "--data", str(fs.path),
               "--policy", name, "--stats-json", str(stats_json), *extra, "--", *reader]
    pfs_stats = None if name == "lower-bound" else fs.stats_file
    before = fs.stats() if pfs_stats else {}
    t0 = time.monotonic()
    log = scratch / f"{name}.log"
    with open(log, "w") as err:
        try:
            run_c_reader(cmd, pfs_stats, out, stderr=err)
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {log.read_text()[-2000:]}") from None
    res = json.loads(out.read_text())
    after = fs.stats() if pfs_stats else {}
    entry: dict[str, Any] = {"name": name, "threads": threads, "checksum": res["checksum"],
                             "wall_seconds": round(time.monotonic() - t0, 2), "epochs": res["epochs"]}
    # what the PFS served before the first epoch and after the last (tier-run's start-up, copies
    # still running when the reader ends): in no epoch's counters
    for k in ("bytes", "opens"):
        entry[f"pfs_{k}_outside_epochs"] = (after.get(k, 0) - before.get(k, 0)
                                            - sum(e[f"pfs_{k}"] for e in res["epochs"]))
    if stats_json.exists():
        entry["tier_run"] = tier_run_summary(stats_json)
    return entry


def run_scenario(sc: Scenario, s: Settings) -> dict[str, Any]:
    work = s.work / sc.name
    src = s.work / f"source-{s.files}"
    info = generate(src, classes=min(CLASSES, s.files), files=s.files, mean_size=MEAN_SIZE, seed=SEED)
    mnt, scratch = work / "pfs", work / "out"
    for d in (mnt, scratch):
        d.mkdir(parents=True, exist_ok=True)
    profile = work / "profile.yaml"
    tiers = write_profile(profile, sc, info.bytes, work / "ssd", s.pfs)
    rels = sample_files(src)
    orders = scratch / "order.txt"
    write_orders(rels, s.epochs, orders)
    shm_copy = Path(tempfile.mkdtemp(prefix="tiering-pfsbound-", dir="/dev/shm"))
    configs: list[dict[str, Any]] = []
    try:
        shutil.copytree(src, shm_copy / "data", ignore=shutil.ignore_patterns(".*"))
        with SlowFs(src, mnt, s.pfs, stats_file=work / "slowfs-stats.json") as fs:
            for name in s.configs:
                print(f"  {sc.name:<9} {name:<13}", end="", flush=True)
                try:
                    entry = run_one(name, s, fs, profile, shm_copy / "data", orders, scratch)
                except RuntimeError as e:     # recorded, the other configurations still run
                    print(f"  failed: {e}", flush=True)
                    configs.append({"name": name, "error": str(e)})
                    continue
                print("  ".join(f"{e['seconds']:7.2f}s {e['pfs_bytes'] / info.bytes:5.2f}D"
                                for e in entry["epochs"]), flush=True)
                configs.append(entry)
    finally:
        shutil.rmtree(shm_copy, ignore_errors=True)
    res: dict[str, Any] = {
        "scenario": sc.name,
        "description": sc.description,
        "dataset": {"files": info.files, "bytes": info.bytes, "mean_size": MEAN_SIZE},
        "tiers": tiers,
        "pfs": vars(s.pfs),
        "workload": {"reader": "preader", "threads": s.threads, "epochs": s.epochs, "order": f"random, seed {SEED}"},
        "configurations": configs,
    }
    res["bounds"] = bounds(res)
    return res


# -- bounds and ratios ------------------------------------------------------------

def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def bounds(res: dict[str, Any]) -> dict[str, Any]:
    """LB, PFS-parallel and the spill bound, and each configuration's ratios."""
    by = {c["name"]: c for c in res["configurations"] if "epochs" in c}
    d = res["dataset"]["bytes"]
    cap = sum(t["capacity"] for t in res["tiers"])
    lb = mean([e["seconds"] for e in by["lower-bound"]["epochs"]]) if "lower-bound" in by else float("nan")
    par = by["pfs-parallel"]["epochs"][0]["seconds"] if "pfs-parallel" in by else float("nan")
    spill = max(0, d - cap)
    out: dict[str, Any] = {"lb_s": lb, "pfs_parallel_s": par, "data_bytes": d, "capacity_bytes": cap,
                           "epoch1_bound_s": max(lb, par)}
    if spill:
        out["spill_bound_s"] = spill / d * par
        out["later_bound_s"] = max(lb, out["spill_bound_s"])
    ratios = {}
    for name, c in by.items():
        eps = c["epochs"]
        later = eps[1:]
        r: dict[str, Any] = {"epoch1_over_bound": eps[0]["seconds"] / out["epoch1_bound_s"],
                             "epoch1_pfs_bytes_over_d": eps[0]["pfs_bytes"] / d,
                             "later_over_lb": [e["seconds"] / lb for e in later]}
        if spill:
            r["later_over_spill_bound"] = [e["seconds"] / out["later_bound_s"] for e in later]
            r["later_pfs_bytes_over_spill"] = [e["pfs_bytes"] / spill for e in later]
        ratios[name] = r
    out["ratios"] = ratios
    return out


# -- reporting --------------------------------------------------------------------

MIB = 1 << 20


def table(res: dict[str, Any]) -> str:
    b = res["bounds"]
    d = res["dataset"]["bytes"]
    spill = "spill_bound_s" in b
    epochs = res["workload"]["epochs"]
    ep_cols = " | ".join(f"epoch {k + 1} s | PFS bytes / D | PFS opens | opens by tier" for k in range(epochs))
    lines = [f"### {res['scenario']}: {res['description']}", "",
             f"{res['dataset']['files']} files, D = {d / MIB:.1f} MiB; tiers: "
             + ", ".join(f"{t['name']} {t['capacity'] / MIB:.1f} MiB" for t in res["tiers"]) + ".", "",
             f"| configuration | what it is | {ep_cols} | PFS bytes / D outside the epochs "
             "| epoch 1 / max(LB, PFS-parallel) | later epochs / LB "
             + ("| later / max(LB, spill bound) | later PFS bytes / (D − C) " if spill else "") + "| checksum |",
             "|---|---|" + "---:|---:|---:|---|" * epochs + "---:|---:|---:|" + ("---:|---:|" if spill else "")
             + "---|"]
    sums = {c["checksum"] for c in res["configurations"] if "checksum" in c}
    for c in res["configurations"]:
        if "error" in c:
            lines.append(f"| {c['name']} | {CONFIG_TEXT[c['name']]} | failed: {c['error'][:200]!r} |")
            continue
        cells = []
        for k in range(epochs):
            if k < len(c["epochs"]):
                e = c["epochs"][k]
                tiers = ", ".join(f"{t} {n}" for t, n in e["opens_by_tier"].items())
                cells.append(f"{e['seconds']:.2f} | {e['pfs_bytes'] / d:.3f} | {e['pfs_opens']} | {tiers}")
            else:
                cells.append(" | | | ")
        r = b["ratios"][c["name"]]
        row = (f"| {c['name']} | {CONFIG_TEXT[c['name']]} | {' | '.join(cells)} | "
               f"{c['pfs_bytes_outside_epochs'] / d:.3f} | {r['epoch1_over_bound']:.2f}x | "
               + (" ".join(f"{x:.2f}x" for x in r["later_over_lb"]) or "-") + " | ")
        if spill:
            row += (" ".join(f"{x:.2f}x" for x in r["later_over_spill_bound"]) or "-") + " | "
            row += (" ".join(f"{x:.2f}" for x in r["later_pfs_bytes_over_spill"]) or "-") + " | "
        row += ("same" if len(sums) == 1 else c["checksum"]) + " |"
        lines.append(row)
    lines += ["", f"Bounds: LB (the lower bound's mean epoch) {b['lb_s']:.2f} s; PFS-parallel (D read once by "
                  f"{res['pfs']['max_inflight']} threads) {b['pfs_parallel_s']:.2f} s; epoch 1 bound "
                  f"max(LB, PFS-parallel) {b['epoch1_bound_s']:.2f} s"
              + (f"; spill bound (D − C) / D × PFS-parallel {b['spill_bound_s']:.2f} s, later epochs' bound "
                 f"max(LB, spill) {b['later_bound_s']:.2f} s" if spill else "")
              + f". Scenario took {res.get('seconds', 0):.0f} s."]
    return "\n".join(lines)


def header(res0: dict[str, Any], command: str) -> str:
    w, pfs = res0["workload"], res0["pfs"]
    return (f"Measured with `{command}`: preader, {w['threads']} threads, {w['epochs']} epochs, order {w['order']} "
            f"(a new permutation each epoch), no compute; data sets of mean file size "
            f"{res0['dataset']['mean_size'] // KiB} KiB; slowfs: {pfs['meta_latency_ms']:g} ms per metadata "
            f"operation, {pfs['read_latency_ms']:g} ms per read, {pfs['bandwidth_mbps']:g} MB/s, "
            f"{pfs['max_inflight']} in flight. PFS bytes and opens: slowfs's counters between epochs (tier-run's "
            "copies included). Ratios are within this run; 1.00x is at the bound, more is slower.")


def write_report(results: list[dict[str, Any]], out: Path, stem: str, command: str) -> str:
    md = "\n".join([header(results[0], command), ""] + [table(r) + "\n" for r in results])
    (out / f"{stem}.json").write_text(json.dumps({"command": command, "scenarios": results}, indent=1) + "\n")
    (out / f"{stem}.md").write_text(md)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2,000 files, results into bench/results/quick")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--files", type=int)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--config", action="append", choices=CONFIGS,
                   help="run only these configurations (repeatable; default all)")
    p.add_argument("--out", type=Path)
    p.add_argument("--name", default="pfsbound", help="the results' file names: NAME.json, NAME.md")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tiering-pfsbound")
    a = p.parse_args(argv)
    files = a.files or (2000 if a.quick else 100_000)
    s = Settings(files=files, epochs=a.epochs, threads=a.threads, pfs=SlowFsOptions(), work=a.work,
                 out=a.out or (RESULTS / "quick" if a.quick else RESULTS),
                 configs=tuple(c for c in CONFIGS if c in (a.config or CONFIGS)))
    names = a.scenario or list(SCENARIOS)
    command = "python -m bench.pfsbound " + " ".join(argv if argv is not None else sys.argv[1:])
    ensure_built()
    s.work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-pthread", "-o", str(s.work / "preader"),
                    str(REPO / "bench" / "workloads" / "preader.c")], check=True)
    sweep_stale_mounts(s.work)
    s.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        t0 = time.monotonic()
        res = run_scenario(SCENARIOS[name], s)
        res["seconds"] = round(time.monotonic() - t0, 1)
        results.append(res)
        write_report(results, s.out, a.name, command.strip())
    print(write_report(results, s.out, a.name, command.strip()))
    bad = [r["scenario"] for r in results
           if len({c["checksum"] for c in r["configurations"] if "checksum" in c}) != 1]
    if bad:
        print(f"bench.pfsbound: configurations read different bytes in {', '.join(bad)}", file=sys.stderr)
        return 1
    failed = [f"{r['scenario']}/{c['name']}" for r in results for c in r["configurations"] if "error" in c]
    if failed:
        print(f"bench.pfsbound: configurations failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
