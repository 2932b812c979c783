"""Multi-node benchmark: a torchrun gloo training across 1, 2 and 3 emulated
nodes (network namespaces on one bridge, each node its own tier; all read one
slowfs PFS), in three configurations side by side:

    pfs          the training alone, reading the PFS
    lower-bound  the training alone, each node reading a copy of the whole data
                 set on its own disk made before the job (not timed): no
                 caching does better on this machine
    local        a clairvoyant tier-run on each node, on its own (no peers)
    peers        the same, one multi-node job: the peer tier and the node-aware plan

The data set is twice one node's tiers by default (--tier-share 0.5 of what the data set
takes on a tier, each file in whole 4 KiB blocks as tiering counts it: the tiers of two nodes
hold it exactly; --share-of bytes takes the share of its bytes instead, 5-6% less at these
sizes, and two nodes' tiers then cannot hold it).
Per run: seconds per epoch (the slowest rank's), PFS opens and bytes per
epoch per node (tier-run's --stats-json; `pfs`: the samples each rank read),
the job's PFS opens and bytes as slowfs counted them, peer bytes, and a
checksum of every sample every rank read (same within a node count).

    python -m bench.multinode [--nodes 1,2,3] [--files 1920] [--epochs 4] [--tier-share 0.5]
                              [--share-of allocated|bytes] [--configs pfs,lower-bound,local,peers]
                              [--out bench/results]

Writes OUT/multinode.json, OUT/multinode.png and OUT/multinode.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import multinode  # noqa: E402

import netns  # noqa: E402
from tiering.placement.api import allocation  # noqa: E402

from .datagen import generate  # noqa: E402
from .slowfs import SlowFs, SlowFsOptions, ensure_built  # noqa: E402

MIB = 1 << 20
CONFIGS = multinode.MODES


def checksum(result: multinode.JobResult) -> str:
    h = hashlib.sha256()
    for r in result.ranks:
        for e in r.get("epochs", []):
            h.update(f"{e['samples']}:{e['digest']}\n".encode())
    return h.hexdigest()[:16]


def epoch_seconds(result: multinode.JobResult, epochs: int) -> list[float]:
    """Each epoch's time: from the first rank's start to the last rank's end."""
    out = []
    for k in range(epochs):
        spans = [r["epochs"][k] for r in result.ranks if len(r.get("epochs", [])) > k]
        out.append(round(max(s["end"] for s in spans) - min(s["start"] for s in spans), 3) if spans else -1.0)
    return out


def per_node_pfs(result: multinode.JobResult, config: str) -> list[list[dict[str, int | None]]]:
    """PFS opens and bytes per epoch per node."""
    if config == "pfs":   # the training reads every sample of its share from the PFS
        return [[{"opens": e["samples"], "bytes": None} for e in r.get("epochs", [])] for r in result.ranks]
    if config == "lower-bound":   # every sample from the node's own copy
        return [[{"opens": 0, "bytes": 0} for _ in r.get("epochs", [])] for r in result.ranks]
    return [[{"opens": e["pfs_opens"], "bytes": e["pfs_bytes"]} for e in s.get("epochs", [])]
            for s in result.stats]


def one_run(fs: SlowFs, net: netns.Network, work: Path, nodes: int, config: str, args: argparse.Namespace,
            capacity: int, port: int, src: Path) -> dict[str, Any]:
    copies = None
    if config == "lower-bound":   # each node's copy of the data set, made before the job (not timed)
        copies = [work / f"n{nodes}-copy{node}" for node in range(nodes)]
        for c in copies:
            shutil.copytree(src, c)
    spec = multinode.JobSpec(fs.path, work / f"n{nodes}-{config}", nodes, mode=config, capacity=capacity,
                             epochs=args.epochs, batch=args.batch, step_ms=args.step_ms,
                             job_id=f"bench{nodes}{config}{int(time.time())}", port=port, timeout=args.timeout,
                             data_per_node=copies)
    before = fs.stats()
    result = multinode.run_job(spec, net)
    after = fs.stats()
    if any(result.codes):
        raise RuntimeError(f"{nodes} nodes, {config}: exit codes {result.codes}\n"
                           + "\n".join(e[-2000:] for e in result.errors))
    missing = [n for n, s in enumerate(result.stats) if not s.get("epochs")]
    if missing:   # a table without a node's figures would be wrong, not partial
        raise RuntimeError(f"{nodes} nodes, {config}: no --stats-json from node(s) {missing}\n"
                           + "\n".join(result.errors[n][-3000:] for n in missing))
    peers = [s.get("peer", {}) for s in result.stats]
    row = {"nodes": nodes, "config": config, "seconds": round(result.seconds, 2),
           "epoch_seconds": epoch_seconds(result, args.epochs),
           "pfs_per_node": per_node_pfs(result, config),
           "pfs_job": {k: after[k] - before[k] for k in ("opens", "bytes")},
           "peer_bytes": [p.get("bytes", 0) for p in peers],
           "peer_fallbacks": [p.get("fallbacks", {}) for p in peers],
           "relay": [p.get("relay") for p in peers],
           "checksum": checksum(result), "weights": result.ranks[0].get("weights")}
    print(f"{nodes} nodes {config:6s} epochs {row['epoch_seconds']} s, PFS {row['pfs_job']['bytes'] / MIB:.1f} MiB "
          f"({row['pfs_job']['opens']} opens), peers {sum(row['peer_bytes']) / MIB:.1f} MiB, "
          f"checksum {row['checksum']}", flush=True)
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    reason = netns.unavailable()
    if reason:
        raise SystemExit(f"bench.multinode: no emulated nodes here: {reason}")
    ensure_built()
    work = Path(tempfile.mkdtemp(prefix="tiering-multinode-"))
    try:
        src, mnt = work / "src", work / "mnt"
        # ImageNet-like sizes (log-normal) around 32 KiB in 8 class directories
        total = generate(src, classes=8, files=args.files, mean_size=32 << 10, seed=4).bytes
        allocated = sum(allocation(p.stat().st_size) for p in src.rglob("*") if p.is_file())
        mnt.mkdir()
        # by default the data set is twice one node's tiers
        capacity = int((allocated if args.share_of == "allocated" else total) * args.tier_share)
        rows = []
        opts = SlowFsOptions(meta_latency_ms=args.meta_ms, read_latency_ms=args.read_ms,
                             bandwidth_mbps=args.pfs_mb_s, max_inflight=16)
        with SlowFs(src, mnt, opts) as fs:
            for n in args.nodes:
                with netns.emulated_nodes(n, net=40 + n) as net:
                    for k, config in enumerate(CONFIGS):
                        if config not in args.configs or config == "peers" and n == 1:
                            continue   # one node has no peers
                        rows.append(one_run(fs, net, work, n, config, args, capacity, 29500 + k, src))
        return {"params": {"files": args.files, "bytes": total, "allocated": allocated, "share_of": args.share_of,
                           "tier_bytes_per_node": capacity,
                           "epochs": args.epochs, "batch": args.batch, "step_ms": args.step_ms,
                           "slowfs": {"meta_ms": args.meta_ms, "read_ms": args.read_ms, "mb_s": args.pfs_mb_s}},
                "runs": rows}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- report ---------------------------------------------------------------------------

def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def compute_bound(p: dict[str, Any], nodes: int) -> float:
    """Seconds of compute per epoch (steps x step time): no data loading can beat it."""
    per_rank = -(-p["files"] // nodes)
    return -(-per_rank // p["batch"]) * p["step_ms"] / 1000


def table(res: dict[str, Any]) -> str:
    p = res["params"]
    lines = [f"{p['files']} files, {p['bytes'] / MIB:.1f} MiB (D); each node's tier "
             f"{p['tier_bytes_per_node'] / MIB:.1f} MiB ({p['tier_bytes_per_node'] / p['bytes']:.2f} D"
             + (f", {p['tier_bytes_per_node'] / p['allocated']:.2f} of the data set's {p['allocated'] / MIB:.1f} MiB "
                "in 4 KiB blocks" if p.get("allocated") else "") + "); "
             f"{p['epochs']} epochs, one rank a node, batch "
             f"{p['batch']}, {p['step_ms']:g} ms compute per step; slowfs {p['slowfs']['meta_ms']:g} ms per metadata "
             f"operation, {p['slowfs']['read_ms']:g} ms per read, {p['slowfs']['mb_s']:g} MB/s.  \"bound\": compute "
             "per epoch (steps x step time); \"lower bound\": the same training with each node reading its own "
             "local copy of the data set, made before the job (not timed, its PFS reads not counted), in the same "
             "run.  PFS per node: tier-run's --stats-json (pfs: the node's share).  PFS of the job: what slowfs "
             "counted over the whole run.",
             "",
             "| nodes | configuration | epoch 1 s | epochs 2+ s | epochs 2+ / bound | epochs 2+ / lower bound | "
             "PFS MiB per node per epoch (2+, mean) | PFS MiB, job | PFS / D | peer MiB | checksum |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    by_nodes: dict[int, str] = {}
    floor = {r["nodes"]: _mean(r["epoch_seconds"][1:]) for r in res["runs"] if r["config"] == "lower-bound"}
    for r in res["runs"]:
        es, n = r["epoch_seconds"], r["nodes"]
        vs_floor = f"{_mean(es[1:]) / floor[n]:.2f}x" if floor.get(n) else "-"
        if r["config"] == "pfs":
            later = f"{p['bytes'] / n / MIB:.2f}"
        else:
            later = f"{_mean([_mean([e['bytes'] for e in node[1:]]) for node in r['pfs_per_node']]) / MIB:.2f}"
        same = by_nodes.setdefault(n, r["checksum"]) == r["checksum"]
        lines.append(f"| {n} | {r['config']} | {es[0]:.2f} | {_mean(es[1:]):.2f} | "
                     f"{_mean(es[1:]) / compute_bound(p, n):.2f}x | {vs_floor} | {later} | "
                     f"{r['pfs_job']['bytes'] / MIB:.1f} | {r['pfs_job']['bytes'] / p['bytes']:.2f} | "
                     f"{sum(r['peer_bytes']) / MIB:.2f} | {'same' if same else 'DIFFERENT'} |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in res["runs"]:
        label = f"{r['nodes']} node{'s' if r['nodes'] > 1 else ''}, {r['config']}"
        style = {"pfs": ":", "lower-bound": "-.", "local": "--", "peers": "-"}[r["config"]]
        epochs = range(1, len(r["epoch_seconds"]) + 1)
        a.plot(epochs, r["epoch_seconds"], style, marker="o", label=label)
    a.set_xlabel("epoch")
    a.set_ylabel("seconds")
    a.set_title("seconds per epoch")
    a.legend(fontsize=7)
    names = [f"{r['nodes']}n {r['config']}" for r in res["runs"]]
    b.bar(names, [r["pfs_job"]["bytes"] / res["params"]["bytes"] for r in res["runs"]])
    b.set_ylabel("PFS bytes of the job / D")
    b.set_title("PFS traffic of the whole job")
    b.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,3", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--files", type=int, default=1920)
    ap.add_argument("--configs", default=",".join(CONFIGS), type=lambda s: s.split(","),
                    help=f"the configurations to run (default: all of {', '.join(CONFIGS)})")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--tier-share", type=float, default=0.5, help="each node's tier, a share of the data set")
    ap.add_argument("--share-of", choices=("allocated", "bytes"), default="allocated",
                    help="the share of what the data set takes on a tier (whole 4 KiB blocks) or of its bytes")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=60.0)
    ap.add_argument("--meta-ms", type=float, default=1.0)
    ap.add_argument("--read-ms", type=float, default=0.5)
    ap.add_argument("--pfs-mb-s", type=float, default=400.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--report-only", action="store_true", help="the table and plot again from OUT/multinode.json")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "multinode.json"
    if args.report_only:
        res = json.loads(path.read_text())
    else:
        res = run(args)
        path.write_text(json.dumps(res, indent=1))
    (args.out / "multinode.md").write_text(table(res))
    plot(res, args.out / "multinode.png")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
