"""The benchmark driver: tiering against the PFS directly, against the other
policies and against the best possible, side by side in one run.

    python -m bench.run [--quick] [--scenario fits-ram|ram+ssd|twice ...]
                        [--files N] [--epochs E] [--compute-ms MS] [--out DIR]

Each scenario generates an ImageNet-like data set (random bytes, sizes around
110 KiB), serves it through slowfs (the emulated PFS) and sizes the tiers of
a generated profile relative to it:

    fits-ram   the data fits in the RAM tier
    ram+ssd    it fits only in RAM and SSD together
    twice      it is about twice the total tier capacity

Every configuration reads the same data with the same workload (a DataLoader,
2 workers, shuffled, batch 32, a fixed compute time per batch):

    pfs          the PFS directly, no tier-run
    off, first-touch, stage, lru, clairvoyant   tier-run with that policy
    lower-bound  a copy of the data in /dev/shm, no shim

Results: bench/results/<scenario>.json, bench/results/summary.md (tables
with ratios against the lower bound and the PFS) and
bench/results/epochs.png.  Times are only compared within one run.
"""
from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.datagen import generate
from bench.predict import PROBE_FILES, TOLERANCE, Probe, predict, probe, tier_rates, within
from bench.slowfs import SlowFs, SlowFsOptions, ensure_built, sweep_stale_mounts

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
POLICIES = ["off", "first-touch", "stage", "lru", "clairvoyant"]
CONFIGS = ["pfs"] + POLICIES + ["lower-bound"]


@dataclass(frozen=True)
class Scenario:
    name: str
    ram: float            # tier capacities as fractions of the data set
    ssd: float
    description: str


SCENARIOS = {
    "fits-ram": Scenario("fits-ram", 1.3, 0.0, "the data fits in the RAM tier"),
    "ram+ssd": Scenario("ram+ssd", 0.5, 0.7, "the data fits only in RAM and SSD together"),
    "twice": Scenario("twice", 0.25, 0.25, "the data is about twice the total tier capacity"),
}


@dataclass(frozen=True)
class Settings:
    files: int
    epochs: int
    compute_ms: float
    workers: int
    batch_size: int
    reader: str           # dataloader | plain | c
    pfs: SlowFsOptions
    work: Path
    out: Path


def write_profile(path: Path, scenario: Scenario, data_bytes: int, ssd_dir: Path,
                  pfs: SlowFsOptions) -> list[dict[str, Any]]:
    tiers = [{"name": "ram", "kind": "memory", "path": "/dev/shm",
              "capacity": int(scenario.ram * data_bytes), "threads": 4}]
    if scenario.ssd:
        tiers.append({"name": "ssd", "kind": "filesystem", "path": str(ssd_dir),
                      "capacity": int(scenario.ssd * data_bytes), "threads": 4})
    lines = [f"name: bench-{scenario.name}", f"description: \"benchmark: {scenario.description}\"", "tiers:"]
    for t in tiers:
        lines += [f"  - name: {t['name']}", f"    kind: {t['kind']}", f"    path: {t['path']}",
                  f"    capacity: {t['capacity']}", f"    threads: {t['threads']}"]
    lines += ["pfs:", f"  read_threads: {pfs.max_inflight}",
              f"  bandwidth: {{{pfs.max_inflight}: {pfs.bandwidth_mbps}}}",
              f"  latency_ms: {pfs.meta_latency_ms}"]
    path.write_text("\n".join(lines) + "\n")
    return [{"name": t["name"], "capacity": t["capacity"]} for t in tiers]


def loader_cmd(s: Settings, data: Path, out: Path, stats: Path | None, tiers: dict[str, str]) -> list[str]:
    cmd = [sys.executable, "-m", "bench.workloads.loader", "--data", str(data), "--epochs", str(s.epochs),
           "--out", str(out), "--workers", str(s.workers), "--batch-size", str(s.batch_size),
           "--compute-ms", str(s.compute_ms), "--seed", "0", "--mode", s.reader]
    if stats is not None:
        cmd += ["--pfs-stats", str(stats)]
    for name, prefix in tiers.items():
        cmd += ["--tier", f"{name}={prefix}"]
    return cmd


def sample_files(root: Path) -> list[str]:
    """The files the workloads read, relative, sorted (dot files skipped)."""
    out: list[str] = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        out.extend(os.path.relpath(os.path.join(d, f), root) for f in files if not f.startswith("."))
    return sorted(out)


def reader_orders(s: Settings, n: int) -> list[list[int]]:
    """The order each epoch of the reader reads the sorted files in."""
    from tiering.clairvoyant.samplers import SamplerSpec, epoch_orders
    if s.reader != "c":   # DataLoader(shuffle=True, generator=seed 0), or the same sampler in a loop
        return list(epoch_orders(SamplerSpec(kind="random", seed=0, dataloader=s.reader == "dataloader"), n,
                                 s.epochs))
    return [[(k + e * 7919 % n) % n for k in range(n)] for e in range(s.epochs)]   # rotated by e * 7919


def order_file(s: Settings, rels: list[str], path: Path) -> Path:
    """The order the plain and C readers read in, for the clairvoyant policy
    (the DataLoader reader needs none: the hook takes it from the DataLoader)."""
    epochs = reader_orders(s, len(rels))
    path.write_text("\n\n".join("\n".join(rels[i] for i in order) for order in epochs) + "\n")
    return path


def run_c_reader(cmd: list[str], stats_file: Path | None, out: Path, stderr: IO[str] | None = None) -> None:
    """Runs preader with --sync, taking the PFS's counters between epochs
    (stderr: where its and tier-run's messages go; default: ours)."""
    from bench.slowfs import read_stats
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO)
    assert proc.stdin is not None and proc.stdout is not None
    snaps: list[dict[str, int]] = []
    epochs: list[dict[str, Any]] = []
    checksum = None
    for line in proc.stdout:
        msg = json.loads(line)
        if "sync" in msg:
            snaps.append(read_stats(stats_file, fresh=True) if stats_file else {})
            proc.stdin.write("\n")
            proc.stdin.flush()
        elif "epoch" in msg:
            epochs.append(msg)
        else:
            checksum = msg["checksum"]
    if proc.wait() != 0 or checksum is None:
        raise RuntimeError(f"the C reader failed ({proc.returncode})")
    res = []
    for k, e in enumerate(epochs):
        before, after = snaps[k], snaps[k + 1]
        res.append({"seconds": round(e["seconds"], 4), "samples_per_s": round(e["files"] / e["seconds"], 1),
                    "bytes": e["bytes"], "pfs_opens": after.get("opens", 0) - before.get("opens", 0),
                    "pfs_bytes": after.get("bytes", 0) - before.get("bytes", 0),
                    "pfs_meta_ops": after.get("meta_ops", 0) - before.get("meta_ops", 0),
                    "opens_by_tier": {k2: v for k2, v in e["tiers"].items() if v}})
    out.write_text(json.dumps({"files": epochs[0]["files"], "checksum": checksum, "epochs": res}))


def tier_run_summary(stats_json: Path) -> dict[str, Any]:
    """The parts of tier-run's --stats-json a result keeps."""
    st = json.loads(stats_json.read_text())
    return {k: st[k] for k in ("policy", "tiers", "opens", "pfs", "placement", "order", "seconds") if k in st}


def run_config(name: str, s: Settings, fs: SlowFs, profile: Path, shm_copy: Path, ssd_dir: Path,
               scratch: Path) -> dict[str, Any]:
    out = scratch / f"{name}.json"
    stats_json = scratch / f"{name}-stats.json"
    user = getpass.getuser()
    tiers = {"ram": f"/dev/shm/tiering-{user}-", "ssd": f"{ssd_dir}/tiering-{user}-"}
    data = shm_copy if name == "lower-bound" else fs.path
    pfs_stats = None if name == "lower-bound" else fs.stats_file
    if s.reader == "c":
        lst = scratch / f"{name}.list"
        lst.write_text("\n".join(str(data / r) for r in sample_files(data)) + "\n")
        reader = [str(s.work / "preader"), str(lst), str(s.epochs), "--sync"]
        for tname, prefix in ({} if name in ("pfs", "lower-bound") else tiers).items():
            reader += ["--tier", f"{tname}={prefix}"]
    else:
        reader = loader_cmd(s, data, out, pfs_stats, {} if name in ("pfs", "lower-bound") else tiers)
    if name in ("pfs", "lower-bound"):
        cmd = reader
    else:
        extra = []
        if name == "clairvoyant" and s.reader != "dataloader":
            extra = ["--order-file", str(order_file(s, sample_files(data), scratch / "order.txt")),
                     "--layout", "sorted"]
        cmd = [sys.executable, "-m", "tiering", "run", "--profile", str(profile), "--data", str(fs.path),
               "--policy", name, "--stats-json", str(stats_json), *extra, "--"] + reader
    t0 = time.monotonic()
    if s.reader == "c":
        run_c_reader(cmd, pfs_stats, out)
    else:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        if r.returncode != 0:
            raise RuntimeError(f"configuration {name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    wall = time.monotonic() - t0
    res = json.loads(out.read_text())
    entry: dict[str, Any] = {"name": name, "checksum": res["checksum"], "wall_seconds": round(wall, 2),
                             "epochs": res["epochs"]}
    if name == "lower-bound":
        for e in entry["epochs"]:
            e["opens_by_tier"] = {"shm": sum(e["opens_by_tier"].values())}
    if stats_json.exists():
        entry["tier_run"] = tier_run_summary(stats_json)
    return entry


def run_scenario(sc: Scenario, s: Settings) -> dict[str, Any]:
    work = s.work / sc.name
    src = s.work / f"source-{s.files}"
    info = generate(src, classes=10, files=s.files, seed=0)
    data_bytes = info.bytes
    ssd_dir = work / "ssd"
    mnt = work / "pfs"
    scratch = work / "out"
    for d in (ssd_dir, mnt, scratch):
        d.mkdir(parents=True, exist_ok=True)
    profile = work / "profile.yaml"
    tiers = write_profile(profile, sc, data_bytes, ssd_dir, s.pfs)
    shm_copy = Path(tempfile.mkdtemp(prefix="tiering-bench-", dir="/dev/shm"))
    configs = []
    rels = sample_files(src)
    try:
        shutil.copytree(src, shm_copy / "data")
        with SlowFs(src, mnt, s.pfs, stats_file=work / "slowfs-stats.json") as fs:
            pr = probe(fs.path, rels, fs.stats, readers=s.workers if s.reader == "dataloader" else 1)
            rates = tier_rates({t["name"]: Path("/dev/shm") if t["name"] == "ram" else ssd_dir for t in tiers},
                               [src / r for r in rels[::max(1, len(rels) // PROBE_FILES)][:PROBE_FILES]])
            for name in CONFIGS:
                print(f"  {sc.name:<9} {name:<12}", end="", flush=True)
                entry = run_config(name, s, fs, profile, shm_copy / "data", ssd_dir, scratch)
                print("  ".join(f"{e['seconds']:7.2f}s" for e in entry["epochs"]), flush=True)
                configs.append(entry)
    finally:
        shutil.rmtree(shm_copy, ignore_errors=True)
    res = {
        "scenario": sc.name,
        "description": sc.description,
        "dataset": {"files": info.files, "bytes": data_bytes},
        "tiers": tiers,
        "pfs": vars(s.pfs),
        "workload": {"reader": s.reader, "workers": s.workers, "batch_size": s.batch_size,
                     "compute_ms_per_batch": s.compute_ms if s.reader != "c" else 0, "epochs": s.epochs},
        "configurations": configs,
    }
    sizes = [(src / r).stat().st_size for r in rels]
    res["prediction"] = predict(res, sizes, reader_orders(s, len(rels)), pr, rates)
    return res


def repredict(res: dict[str, Any], s: Settings) -> None:
    """The predictions of a stored result made again from its probe and its data set."""
    src = s.work / f"source-{res['dataset']['files']}"
    rels = sample_files(src)
    old = res["prediction"]
    pr = Probe(**{k: old["probe"].get(k, old["probe"]["read_ms"] if k == "read_mean_ms" else 1)
                  for k in Probe.__dataclass_fields__})
    s = dataclasses.replace(s, epochs=res["workload"]["epochs"], reader=res["workload"]["reader"])
    res["prediction"] = predict(res, [(src / r).stat().st_size for r in rels], reader_orders(s, len(rels)), pr,
                                old["config"]["tier_mb_s"])


# -- reporting ------------------------------------------------------------------

def later_mean(entry: dict[str, Any]) -> float:
    eps = entry["epochs"][1:] or entry["epochs"]
    return sum(e["seconds"] for e in eps) / len(eps)


MIB = 1 << 20
CONFIG_TEXT = {
    "pfs": "the PFS directly, no tier-run",
    "off": "tier-run, shim loaded, nothing placed",
    "first-touch": "copy a file when first opened",
    "stage": "copy everything at start",
    "lru": "first touch, evict least recently used",
    "clairvoyant": "prefetch in the sampler's order",
    "lower-bound": "a copy in /dev/shm, no shim",
}


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def tiers_text(result: dict[str, Any]) -> str:
    ds = result["dataset"]
    return (f"{ds['files']} files, {mib(ds['bytes'])}; tiers: "
            + ", ".join(f"{t['name']} {mib(t['capacity'])}" for t in result["tiers"]))


def table(result: dict[str, Any]) -> str:
    by = {c["name"]: c for c in result["configurations"]}
    lb, pfs = by["lower-bound"], by["pfs"]
    lines = [f"### {result['scenario']}: {result['description']}",
             "",
             tiers_text(result) + ".",
             "",
             "| configuration | what it is | epoch 1 s | epochs 2+ s | epoch 1: x slower than the lower bound "
             "| epochs 2+: x slower than the lower bound | speed-up over the PFS (2+) | PFS opens / epoch (2+) "
             "| PFS MiB / epoch (2+) | checksum | predicted epoch 1 s | predicted epochs 2+ s "
             "| measured / predicted, per epoch |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for c in result["configurations"]:
        e1 = c["epochs"][0]["seconds"]
        rest = later_mean(c)
        later = c["epochs"][1:] or c["epochs"]
        opens = sum(e["pfs_opens"] for e in later) / len(later)
        mb = sum(e["pfs_bytes"] for e in later) / len(later) / MIB
        same = "same" if c["checksum"] == lb["checksum"] else "DIFFERENT"
        lines.append(f"| {c['name']} | {CONFIG_TEXT.get(c['name'], '')} | {e1:.2f} | {rest:.2f} | "
                     f"{e1 / lb['epochs'][0]['seconds']:.2f}x | {rest / later_mean(lb):.2f}x | "
                     f"{later_mean(pfs) / rest:.2f}x | {opens:.0f} | {mb:.1f} | {same} | {predicted_cells(c)} |")
    lines += prediction_notes(result)
    bound = bounds(result)
    if bound:
        lines += ["", f"Bound for epochs 2+: max(compute {bound['compute_s']:.2f} s, (D − C) / bandwidth "
                      f"{bound['transfer_s']:.2f} s) = {bound['bound_s']:.2f} s; clairvoyant "
                      f"{bound['clairvoyant_s']:.2f} s: {bound['ratio']:.2f}x the bound (its time / the bound: "
                      "1.00x is at the bound, more is slower)."]
    return "\n".join(lines)


def predicted_cells(c: dict[str, Any]) -> str:
    p = c.get("predicted")
    if not p:
        return " | | "
    rest = p["epochs"][1:] or p["epochs"]
    ratios = " ".join("-" if r is None else f"{r:.2f}{'' if within(r) else '!'}" for r in p["ratio"])
    return f"{p['epochs'][0]:.2f} | {sum(rest) / len(rest):.2f} | {ratios} ({p['policy']})"


def prediction_notes(result: dict[str, Any]) -> list[str]:
    pred = result.get("prediction")
    if not pred:
        return []
    pr, cfg = pred["probe"], pred["config"]
    out = [c["name"] for c in result["configurations"] if "predicted" in c
           and not all(within(r) for r in c["predicted"]["ratio"])]
    def mi(mb: float) -> float:   # the model's MB (10^6 bytes) in the summary's MiB
        return mb * 1e6 / 2 ** 20

    return ["", f"Predicted by `tiering simulate`'s model (bench/predict.py) from this run's settings: compute "
                f"{mi(cfg['compute_mb_s']):.1f} MiB/s (the lower bound's epochs; "
                f"{mi(cfg['settings_compute_mb_s']):.1f} MiB/s from the compute time alone), tiers "
                + ", ".join(f"{k} {mi(v):.0f} MiB/s" for k, v in cfg["tier_mb_s"].items())
                + f" (probed copy writes), loader read-ahead {mi(cfg['staging_mb']):.1f} MiB by "
                f"{cfg['staging_threads']} thread(s), PFS {cfg['pfs_latency_ms']:.2f} ms per file read by the "
                f"reader and {cfg['copy_latency_ms']:.2f} ms per copy (calibrated on the pfs configuration's mean "
                f"epoch; the probe before the configurations: median {pr['read_ms']:.2f} ms per file "
                f"by {pr.get('readers', 1)} thread(s), mean {pr.get('read_mean_ms', pr['read_ms']):.2f}; "
                f"{pr['copy_ms']:.2f} ms per copy, one thread; slowfs's settings alone: {pr['settings_read_ms']:.2f} / "
                f"{pr['settings_copy_ms']:.2f} ms for {pr['meta_ops_per_read']:.1f} / {pr['meta_ops_per_copy']:.1f} "
                f"metadata operations and {pr['reads_per_read']:.2f} / {pr['reads_per_copy']:.2f} reads), "
                f"{cfg['copy_threads']} copy threads, copies {cfg['head_start_s']:.2f} s ahead of the reader "
                f"(stage). Ratios outside ±{TOLERANCE:.0%} are marked !"
                + (f": {', '.join(out)}." if out else "; none is.") + spread_note(result)]


def spread_note(result: dict[str, Any]) -> str:
    """How much the same configuration's epochs differ within the run (the machine's
    other load, which no model has): the lower bound's and the PFS's."""
    by = {c["name"]: [e["seconds"] for e in c["epochs"]] for c in result["configurations"]}
    parts = []
    for name in ("lower-bound", "pfs"):
        xs = by.get(name, [])
        if len(xs) > 1:
            mean = sum(xs) / len(xs)
            parts.append(f"the {name}'s by ±{(max(xs) - min(xs)) / 2 / mean:.0%}")
    return (" Within this run, the same configuration's epochs spread: " + ", ".join(parts) + ".") if parts else ""


def bounds(result: dict[str, Any]) -> dict[str, float]:
    """max(compute time, (D - C) / PFS bandwidth) for the epochs after the first."""
    by = {c["name"]: c for c in result["configurations"]}
    if "clairvoyant" not in by or "lower-bound" not in by:
        return {}
    d = result["dataset"]["bytes"]
    c = sum(t["capacity"] for t in result["tiers"])
    transfer = max(0, d - c) / (result["pfs"]["bandwidth_mbps"] * 1e6)
    compute = later_mean(by["lower-bound"])   # the workload with no I/O cost at all
    bound = max(compute, transfer)
    cv = later_mean(by["clairvoyant"])
    return {"compute_s": compute, "transfer_s": transfer, "bound_s": bound, "clairvoyant_s": cv,
            "ratio": cv / bound}


def plot(results: list[dict[str, Any]], path: Path) -> None:
    figure(results).savefig(path, dpi=90)


def figure(results: list[dict[str, Any]]) -> Any:
    """One panel per scenario: seconds per epoch of every configuration, the
    lower bound's line, the data set and the tiers' sizes in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 5.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        configs = res["configurations"]
        epochs = len(configs[0]["epochs"])
        width = 0.8 / epochs
        for k in range(epochs):
            ax.bar([i + k * width for i in range(len(configs))], [c["epochs"][k]["seconds"] for c in configs],
                   width, label=f"epoch {k + 1}")
        by = {c["name"]: c for c in configs}
        if "lower-bound" in by:
            ax.axhline(later_mean(by["lower-bound"]), color="black", linestyle="--", linewidth=1,
                       label="lower bound (copy in /dev/shm), epochs 2+")
        b = bounds(res)
        if b and b["bound_s"] > later_mean(by["lower-bound"]) * 1.02:
            ax.axhline(b["bound_s"], color="tab:red", linestyle=":", linewidth=1,
                       label="bound with the PFS: max(compute, (D - C) / bandwidth)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))])
        ax.set_xticklabels([c["name"] for c in configs], rotation=40, ha="right")
        ax.set_title(f"{res['scenario']}: {res['description']}\n{tiers_text(res)}", fontsize=9)
        ax.set_ylabel("seconds per epoch")
        top = max(e["seconds"] for c in configs for e in c["epochs"])
        ax.set_ylim(0, 1.45 * top)      # room for the legend above the bars
        ax.legend(fontsize=7, ncol=2, loc="upper center")
    key = "; ".join(f"{n}: {t}" for n, t in CONFIG_TEXT.items())
    fig.text(0.01, 0.01, key, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def header(results: list[dict[str, Any]], command: str) -> str:
    w, pfs = results[0]["workload"], results[0]["pfs"]
    seconds = [r["seconds"] for r in results if "seconds" in r]
    took = f"; {sum(seconds):.0f} s in all" if len(seconds) == len(results) else ""
    loader = f", {w['workers']} DataLoader workers" if w["reader"] != "c" else ""
    return (f"Measured with `{command}` ({results[0]['dataset']['files']} files, {w['epochs']} epochs, "
            f"{w['compute_ms_per_batch']:g} ms compute per batch of {w['batch_size']}{loader}; slowfs: "
            f"{pfs['meta_latency_ms']:g} ms per metadata operation, {pfs['read_latency_ms']:g} ms per read, "
            f"{pfs['bandwidth_mbps'] * 1e6 / MIB:.0f} MiB/s, {pfs['max_inflight']} in flight). Sizes in MiB "
            f"(2^20 bytes). Ratios are within this run{took}. \"x slower than the lower bound\": the "
            "configuration's time / the lower bound's (1.00x is as fast as a copy in /dev/shm; more is slower). "
            "\"speed-up over the PFS\": the PFS's time / the configuration's (more is faster).")


def write_summary(results: list[dict[str, Any]], out: Path, command: str) -> str:
    md = "\n".join([header(results, command), ""] + [table(r) + "\n" for r in results])
    (out / "summary.md").write_text(md)
    plot(results, out / "epochs.png")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small run (under a minute) for smoke tests")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--files", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--compute-ms", type=float, help="compute time per batch of 32")
    p.add_argument("--reader", choices=["dataloader", "plain", "c"], default="dataloader",
                   help="the workload: a DataLoader (2 workers), the same order in a plain Python loop, "
                        "or a C program reading with pread")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tiering-bench")
    p.add_argument("--report-only", action="store_true",
                   help="write summary.md and epochs.png again from the <scenario>.json files in --out")
    p.add_argument("--predict-only", action="store_true",
                   help="with --report-only: the simulator's predictions made again (after a change of the model) "
                        "from each scenario's stored probe and the data set in --work")
    a = p.parse_args(argv)
    s = Settings(files=a.files or (40 if a.quick else 2000), epochs=a.epochs or (2 if a.quick else 3),
                 compute_ms=a.compute_ms if a.compute_ms is not None else (0.0 if a.quick else 30.0),
                 workers=0 if a.quick else 2, batch_size=32, reader=a.reader, pfs=SlowFsOptions(),
                 work=a.work, out=a.out)
    names = a.scenario or list(SCENARIOS)
    command = (f"python -m bench.run{' --quick' if a.quick else ''}"
               f"{'' if s.reader == 'dataloader' else ' --reader ' + s.reader}")
    if a.report_only:
        results = [json.loads((a.out / f"{name}.json").read_text()) for name in names]
        if a.predict_only:
            for name, res in zip(names, results):
                repredict(res, s)
                (a.out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(write_summary(results, a.out, command))
        return 0
    ensure_built()
    a.work.mkdir(parents=True, exist_ok=True)
    if s.reader == "c":
        subprocess.run(["cc", "-O2", "-pthread", "-o", str(a.work / "preader"),
                        str(REPO / "bench" / "workloads" / "preader.c")], check=True)
    sweep_stale_mounts(a.work)
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        t0 = time.monotonic()
        res = run_scenario(SCENARIOS[name], s)
        res["bound"] = bounds(res)
        res["seconds"] = round(time.monotonic() - t0, 1)
        (a.out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        results.append(res)
        sums = {c["checksum"] for c in res["configurations"]}
        if len(sums) != 1:
            print(f"bench: {name}: configurations read different bytes: {sums}", file=sys.stderr)
            return 1
    print(write_summary(results, a.out, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
