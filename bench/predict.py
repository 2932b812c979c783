"""The simulator's prediction of each benchmark configuration (NOTE [bench
prediction] in docs/design.md), made from the bench's own settings through the
code `tiering simulate` runs (a SimConfig built here, tiering.simulate.runner).

What the model is given, per scenario:

- files: the real sizes, in catalog order; one node; the reader's real order
  (DataLoader(shuffle=True, generator=seed 0), reproduced by
  tiering.clairvoyant.samplers);
- compute c: calibrated on the lower-bound configuration of the same run (data
  bytes / its mean epoch: the compute time per batch plus the loader's own
  start and hand-over of batches); the value from the compute time alone
  (data bytes / (batches x compute ms)) is stored beside;
- the staging buffer (class 0): the DataLoader's read-ahead, workers threads
  holding prefetch_factor (2) x workers batches (process memory: no cost of
  its own); no read-ahead without workers;
- classes 1..: the generated profile's tiers: capacities, and r_j probed in
  the same run (one thread writing copies of PROBE_FILES files into the tier's
  directory as a copy lands: create, write, fchmod, fstat, rename);
- the PFS: slowfs's bandwidth t(gamma) and a latency per file calibrated in the
  same run on the `pfs` configuration (the latency that makes the model's
  epoch of reading the PFS directly the measured mean; its own ratio is then 1
  on average by construction), a copy's latency by the same factor over the
  probe's (below); tier-run's copies share pfs.read_threads threads (slowfs's
  in-flight limit, as the profile says).  The predictions from the probe alone
  are stored beside (`probed_epochs`): on this shared machine the probe's
  median per file is 10-30% under what the workers see in the minutes after;
- head start: stage's copies run while the reader starts up (the lower-bound
  configuration's wall time minus its epochs).

The probe, before the configurations: as many threads as the loader has
workers do the reader's per-file work (the loader's own __getitem__: open,
read, sha256) on PROBE_FILES files of the mount, each file timed (the median
is the PFS's time per file: a burst of other load on the machine during the
probe would otherwise set the PFS's speed for the whole run), and one thread
tier-run's copy read (open O_NOFOLLOW, fstat, sendfile, fstat), counting
slowfs's operations meanwhile.  slowfs's settings alone (operations x latency
+ bytes / bandwidth) leave out FUSE's own cost per request (a round trip
through the kernel, about a tenth of a millisecond per request on an idle
machine) and the machine's load; both are stored.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiering.simulate.config import MB, FileSpec, SimConfig, StorageClass, Table
from tiering.simulate.fromprofile import DEFAULT_TIER_MB_S
from tiering.simulate.runner import simulate

PROBE_FILES = 128
PREFETCH_FACTOR = 2          # torch's DataLoader default: batches read ahead per worker
UNLIMITED = 1e12             # MB/s
# benchmark configuration -> simulated policy
POLICY_OF = {"pfs": "staging-pool", "off": "staging-pool", "first-touch": "first-touch", "stage": "stage",
             "lru": "lru", "clairvoyant": "clairvoyant", "lower-bound": "lower-bound"}
TIER_KIND = {"ram": "memory", "ssd": "filesystem"}
TOLERANCE = 0.15


@dataclass(frozen=True)
class Probe:
    files: int
    readers: int                 # threads reading at once (the loader's workers, at least 1)
    read_ms: float               # the reader's work on one file of the PFS, per thread: the median
    read_mean_ms: float          # ... the mean (spikes of the machine's other load included)
    copy_ms: float               # tier-run's copy read of one file, one thread
    mean_bytes: float            # of the probed files
    meta_ops_per_read: float     # slowfs's counts per file
    reads_per_read: float
    meta_ops_per_copy: float
    reads_per_copy: float

    def settings_ms(self, meta_ops: float, reads: float, pfs: dict[str, Any]) -> float:
        """What slowfs's settings alone charge for a file."""
        bw = pfs["bandwidth_mbps"] * 1e6
        return (meta_ops * pfs["meta_latency_ms"] + reads * pfs["read_latency_ms"]
                + (1000 * self.mean_bytes / bw if bw else 0.0))

    def as_dict(self, pfs: dict[str, Any]) -> dict[str, Any]:
        d: dict[str, Any] = {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()}
        d["settings_read_ms"] = round(self.settings_ms(self.meta_ops_per_read, self.reads_per_read, pfs), 4)
        d["settings_copy_ms"] = round(self.settings_ms(self.meta_ops_per_copy, self.reads_per_copy, pfs), 4)
        return d


def _copy_read(src: str, out_fd: int) -> None:
    """tier-run's copy of one file as the PFS sees it (placement/tiers.py copy_file)."""
    fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fstat(fd)
        os.set_blocking(fd, True)
        size, off = os.fstat(fd).st_size, 0
        os.lseek(out_fd, 0, os.SEEK_SET)
        while off <= size:
            n = os.sendfile(out_fd, fd, off, 1 << 20)
            if n == 0:
                break
            off += n
        os.fstat(fd)
    finally:
        os.close(fd)


def probe(mount: Path, rels: Sequence[str], stats: Callable[[], dict[str, int]], n: int = PROBE_FILES,
          readers: int = 1) -> Probe:
    """Times the reader's per-file work on the mount with as many threads as the
    reader has (each reading its share in turn: seconds x threads / files), and a
    copy's with one."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.workloads.loader import Files
    step = max(1, len(rels) // n)
    picked = list(rels[::step][:n])
    ds = Files(str(mount), {})
    index = {p: k for k, (p, _) in enumerate(ds.samples)}
    ids = [index[str(mount / r)] for r in picked]
    readers = max(1, readers)

    def timed(i: int) -> tuple[float, int]:
        t = time.perf_counter()
        n = ds[i][3]
        return time.perf_counter() - t, n

    s0 = stats()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        shares = pool.map(lambda share: [timed(i) for i in share], [ids[k::readers] for k in range(readers)])
        each = [x for share in shares for x in share]
    t1 = time.perf_counter()
    nbytes = sum(n for _, n in each)
    s1 = stats()
    with tempfile.TemporaryFile(dir="/dev/shm") as out:
        for r in picked:
            _copy_read(str(mount / r), out.fileno())
    t2 = time.perf_counter()
    s2 = stats()
    k = len(picked)

    def per(a: dict[str, int], b: dict[str, int], key: str) -> float:
        return (b.get(key, 0) - a.get(key, 0)) / k

    return Probe(k, readers, 1000 * statistics.median(d for d, _ in each), 1000 * (t1 - t0) * readers / k,
                 1000 * (t2 - t1) / k, nbytes / k,
                 per(s0, s1, "meta_ops"), per(s0, s1, "reads"), per(s1, s2, "meta_ops"), per(s1, s2, "reads"))


def tier_rates(dirs: dict[str, Path], sources: Sequence[Path]) -> dict[str, float]:
    """MB/s of writing these (local) files into each tier's directory as a copy
    lands there (create, write, fchmod, fstat, rename), one thread."""
    out = {}
    for name, d in dirs.items():
        d.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".probe-", dir=d))
        try:
            nbytes, t0 = 0, time.perf_counter()
            for k, src in enumerate(sources):
                data = src.read_bytes()
                part = work / f"{k}.part"
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, data)
                    os.fchmod(fd, 0o400)
                    os.fstat(fd)
                finally:
                    os.close(fd)
                os.rename(part, work / str(k))
                nbytes += len(data)
            out[name] = nbytes / MB / max(time.perf_counter() - t0, 1e-9)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def compute_mb_s(result: dict[str, Any]) -> tuple[float, float]:
    """The reader's compute rate c: from the settings (compute ms per batch over
    the batch's bytes), and as the lower-bound configuration measured it (its
    epochs: the compute plus the loader's own start and hand-over of batches)."""
    w, ds = result["workload"], result["dataset"]
    batches = -(-ds["files"] // w["batch_size"])
    compute_s = batches * w["compute_ms_per_batch"] / 1000
    settings = ds["bytes"] / MB / compute_s if compute_s > 0 else UNLIMITED
    lb = next(c for c in result["configurations"] if c["name"] == "lower-bound")
    measured = sum(e["seconds"] for e in lb["epochs"]) / len(lb["epochs"])
    return settings, ds["bytes"] / MB / measured if measured > 0 else settings


def head_start(result: dict[str, Any]) -> float:
    """The reader's start-up: the lower-bound configuration's wall time minus its epochs."""
    lb = next(c for c in result["configurations"] if c["name"] == "lower-bound")
    return max(0.0, lb["wall_seconds"] - sum(e["seconds"] for e in lb["epochs"]))


def sim_config(result: dict[str, Any], sizes_bytes: Sequence[int], orders: Sequence[Sequence[int]],
               pr: Probe, head_start_s: float, compute: float, tier_mb_s: dict[str, float]) -> SimConfig:
    """The simulator's config of one benchmark scenario."""
    w, pfs = result["workload"], result["pfs"]
    n, batch = len(sizes_bytes), w["batch_size"]
    mean_mb = sum(sizes_bytes) / n / MB
    workers = w["workers"] if w["reader"] == "dataloader" else 0
    def rate(name: str) -> float:
        return tier_mb_s.get(name, DEFAULT_TIER_MB_S[TIER_KIND.get(name, "memory")])

    tiers = [StorageClass(t["capacity"] / MB, t.get("threads", 4), Table(((1, rate(t["name"])),)), t["name"])
             for t in result["tiers"]]
    # the read-ahead is the loader's own memory: no cost of its own beyond the probed reads
    staging = StorageClass(PREFETCH_FACTOR * workers * batch * mean_mb, max(1, workers),
                           Table(((1, UNLIMITED),)), "loader")
    bw = pfs["bandwidth_mbps"] or UNLIMITED
    transfer_ms = 1000 * mean_mb / bw
    return SimConfig(
        nodes=1, epochs=len(orders), batch_size=batch, drop_last=False,
        files=FileSpec(count=n, sizes_mb=tuple(s / MB for s in sizes_bytes)),
        compute_mb_s=compute,
        preprocess_mb_s=UNLIMITED, network_mb_s=UNLIMITED, pfs_link_mb_s=UNLIMITED,
        pfs=Table(((1, float(bw)),)), storage=(staging, *tiers),
        pfs_latency_ms=max(0.0, pr.read_ms - transfer_ms), copy_latency_ms=max(0.0, pr.copy_ms - transfer_ms),
        copy_threads=pfs["max_inflight"], head_start_s=head_start_s,
        orders=(tuple(tuple(int(i) for i in o) for o in orders),))


def _pfs_mean(cfg: SimConfig) -> float:
    ep = simulate(cfg, [POLICY_OF["pfs"]]).policies[POLICY_OF["pfs"]].epochs
    return sum(ep) / len(ep)


def calibrate_pfs(cfg: SimConfig, result: dict[str, Any], steps: int = 4) -> SimConfig:
    """The PFS latency per file (and a copy's, by the same factor) that makes the
    model's `pfs` configuration take the mean epoch it took in this run (secant
    steps from the probe's value); the probe's when the measurement is at or
    under what compute alone takes (nothing to learn about the PFS from it)."""
    pfs = next((c for c in result["configurations"] if c["name"] == "pfs"), None)
    if pfs is None or cfg.pfs_latency_ms <= 0:
        return cfg
    target = sum(e["seconds"] for e in pfs["epochs"]) / len(pfs["epochs"])

    def at(lat: float) -> SimConfig:
        k = lat / cfg.pfs_latency_ms
        return dataclasses.replace(cfg, pfs_latency_ms=lat, copy_latency_ms=(cfg.copy_latency_ms or 0.0) * k)

    x0, x1 = cfg.pfs_latency_ms, cfg.pfs_latency_ms * 1.2
    f0, f1 = _pfs_mean(at(x0)) - target, _pfs_mean(at(x1)) - target
    if f0 >= 0 and f1 - f0 <= 1e-9:
        return cfg
    for _ in range(steps):
        if abs(f1 - f0) < 1e-12:
            break
        x0, f0, x1 = x1, f1, max(1e-6, x1 - f1 * (x1 - x0) / (f1 - f0))
        f1 = _pfs_mean(at(x1)) - target
    return at(x1)


def predict(result: dict[str, Any], sizes_bytes: Sequence[int], orders: Sequence[Sequence[int]],
            pr: Probe, tier_mb_s: dict[str, float]) -> dict[str, Any]:
    """Adds to each configuration of `result` its prediction and measured / predicted
    per epoch; returns what the prediction was made from."""
    settings_c, measured_c = compute_mb_s(result)
    probed = sim_config(result, sizes_bytes, orders, pr, head_start(result), measured_c, tier_mb_s)
    cfg = calibrate_pfs(probed, result)
    names = sorted({POLICY_OF[c["name"]] for c in result["configurations"] if c["name"] in POLICY_OF} | {"naive"})
    rep, rep_probed = simulate(cfg, names), simulate(probed, names)
    for c in result["configurations"]:
        policy = POLICY_OF.get(c["name"])
        if policy is None or policy not in rep.policies:
            continue
        pred = rep.policies[policy].epochs
        c["predicted"] = {"policy": policy, "epochs": [round(p, 6) for p in pred],
                          "ratio": [round(e["seconds"] / p, 3) if p > 0 else None
                                    for e, p in zip(c["epochs"], pred)],
                          "probed_epochs": [round(p, 4) for p in rep_probed.policies[policy].epochs]}
    return {"probe": pr.as_dict(result["pfs"]),
            "probed_pfs_latency_ms": round(probed.pfs_latency_ms, 4),
            "config": {"compute_mb_s": round(cfg.compute_mb_s, 3), "settings_compute_mb_s": round(settings_c, 3),
                       "tier_mb_s": {c.name: round(c.rate, 1) for c in cfg.storage[1:]},
                       "pfs_latency_ms": round(cfg.pfs_latency_ms, 4),
                       "copy_latency_ms": round(cfg.copy_latency_ms or 0.0, 4), "copy_threads": cfg.copy_threads,
                       "head_start_s": round(cfg.head_start_s, 3),
                       "staging_mb": round(cfg.storage[0].capacity_mb, 3), "staging_threads": cfg.storage[0].threads,
                       "pfs_mb_s": cfg.pfs.as_dict()},
            "naive_epochs": [round(e, 4) for e in rep.policies["naive"].epochs]}


def within(ratio: float | None) -> bool:
    return ratio is not None and abs(ratio - 1) <= TOLERANCE
