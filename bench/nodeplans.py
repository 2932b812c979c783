"""The node-aware plan's cost and what it promises, without a network: node 0
plans its own stream and, with NodePlans, every other node's; each of its
fetches is asked of the node the plan names, else of the PFS.

    python -m bench.nodeplans [--files N] [--nodes 2,3,4] [--local-world L] [--epochs E] [--step S]

Data set: N files of 1 KiB to 220 KiB (about ImageNet's 110 KiB mean); each
node's tiers hold half of it (the data set is twice one node's tiers, as
`make bench-multinode` will run it).  The readers move in lockstep, S stream
positions at a time.  Per node count: seconds of node 0's own planner and of
its NodePlans (the homes, and every answer), the peak memory NodePlans adds
(tracemalloc, the homes' computation included),
and per epoch the bytes node 0 reads from the PFS (its fetches the plans
name no peer for, and the positions its reader reads before their copy is
planned) and from peers, as the plans answer (a peer that does not hold a
file in the end is the PFS's again: the real fetch falls back).  Writes DIR/nodeplans.json and DIR/nodeplans.md
(default bench/results).
"""
from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np

from tiering.clairvoyant.nodes import NodePlans, NodeStreams, home_budget
from tiering.clairvoyant.planner import FETCH, Planner, allocations
from tiering.clairvoyant.policy import Clairvoyant
from tiering.clairvoyant.samplers import SamplerSpec

REPO = Path(__file__).resolve().parent.parent


def run(files: int, nodes: int, local_world: int, epochs: int, step: int, seed: int = 11) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1024, 220 * 1024, files).astype(np.int64)
    capacity = int(sizes.sum()) // 2
    spec = SamplerSpec("distributed", seed=seed, num_replicas=nodes * local_world, rank=0)
    streams = NodeStreams(spec, local_world, np.arange(files, dtype=np.int64))
    streams(0, 0)   # torch is imported outside the measured memory
    budgets = [home_budget([capacity], int(allocations(sizes).mean()))] * nodes   # as tier-run computes it
    t0 = time.perf_counter()
    plans = NodePlans.of_streams(streams, nodes, 0, sizes, budgets)
    plans_s = time.perf_counter() - t0
    own = Planner(sizes, Clairvoyant.plan_capacities([capacity]), window=64, pinned=plans.pinned())
    own_s = 0.0
    starts: list[int] = []
    per_epoch: list[dict[str, int]] = []
    for e in range(epochs):
        while len(starts) < min(epochs, e + 1 + Clairvoyant.ahead):
            starts.append(own.end)
            own.extend(streams(0, len(starts) - 1))
        length = len(streams(0, e))
        got = {"epoch": e, "pfs_bytes": 0, "peer_bytes": 0, "fetches": 0, "peer_fetches": 0, "missed_bytes": 0}
        for offset in range(0, length, step):
            read = own.stream[own.reader - own.base:starts[e] + offset - own.base]
            missed = np.array([f not in own.resident for f in read.tolist()], bool)
            got["missed_bytes"] += int(sizes[read[missed]].sum())   # the reader's own PFS reads
            t1 = time.perf_counter()
            own.consume_range(own.reader, starts[e] + offset)
            acts = own.advance()
            t2 = time.perf_counter()
            own_s += t2 - t1
            fetched = acts.file[acts.kind == FETCH]
            holders = np.array([plans.holder(int(f)) is not None for f in fetched.tolist()], bool)
            plans_s += time.perf_counter() - t2
            got["fetches"] += len(fetched)
            got["peer_fetches"] += int(holders.sum())
            got["peer_bytes"] += int(sizes[fetched[holders]].sum())
            got["pfs_bytes"] += int(sizes[fetched[~holders]].sum())
        got["pfs_bytes"] += got["missed_bytes"]
        per_epoch.append(got)
    peak, kept = memory(streams, nodes, sizes, budgets)
    return {"files": files, "nodes": nodes, "local_world": local_world, "epochs": epochs,
            "data_bytes": int(sizes.sum()), "capacity_per_node": capacity,
            "own_planner_seconds": round(own_s, 3), "node_plans_seconds": round(plans_s, 3),
            "node_plans_peak_bytes": peak, "node_plans_kept_bytes_per_file": round(kept / files, 1),
            "per_epoch": per_epoch,
            "pfs_bytes_per_job_node0": sum(p["pfs_bytes"] for p in per_epoch)}


def memory(streams: NodeStreams, nodes: int, sizes: np.ndarray, budgets: list[int]) -> tuple[int, int]:
    """Memory NodePlans takes, alone (tracemalloc): the peak (computing the
    homes), and what it keeps (the sampler's permutation of epoch 0, which
    it caches, is made before)."""
    for n in range(nodes):
        streams(n, 0)
    tracemalloc.start()
    plans = NodePlans.of_streams(streams, nodes, 0, sizes, budgets)
    kept, peak = tracemalloc.get_traced_memory()   # while plans is alive
    tracemalloc.stop()
    del plans
    return peak, kept


def markdown(rows: list[dict[str, object]]) -> str:
    out = ["| nodes | files | own planner s | NodePlans s | NodePlans peak MB (kept B/file) | node 0 PFS GB by epoch "
           "| node 0 peer GB by epoch |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        pe = r["per_epoch"]
        assert isinstance(pe, list)
        pfs = ", ".join(f"{p['pfs_bytes'] / 1e9:.2f}" for p in pe)
        peer = ", ".join(f"{p['peer_bytes'] / 1e9:.2f}" for p in pe)
        peak = float(str(r["node_plans_peak_bytes"])) / 1e6
        out.append(f"| {r['nodes']} | {r['files']:,} | {r['own_planner_seconds']} | {r['node_plans_seconds']} | "
                   f"{peak:.0f} ({r['node_plans_kept_bytes_per_file']}) "
                   f"| {pfs} | {peer} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--nodes", default="2,3,4")
    ap.add_argument("--local-world", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--step", type=int, default=64)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    a = ap.parse_args()
    rows = [run(a.files, int(n), a.local_world, a.epochs, a.step) for n in a.nodes.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nodeplans.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "nodeplans.md").write_text(markdown(rows))
    print(markdown(rows), end="")


if __name__ == "__main__":
    main()
