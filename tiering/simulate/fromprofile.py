"""A simulator config from a cluster profile, a scanned data set and the
real order (the options `tiering plan` takes).

- class 0, the staging buffer, is the training loader's read-ahead
  (--staging-mb, --loader-threads), reading at the fastest tier's speed;
- classes 1.. are the profile's tiers: capacity, threads and `bandwidth`
  table (MB/s by threads; a memory tier without one is taken as 10 GB/s, a
  file-system tier as 2 GB/s);
- the PFS is the profile's `pfs.bandwidth` table, read as aggregate MB/s by
  concurrent clients (500 MB/s when missing), and its `latency_ms` per file;
- tier-run's copies share one pool of `pfs.read_threads` threads (its PFS
  semaphore), whatever the tier;
- each node's stream is the sampler's: with a distributed or PLS sampler node i
  serves ranks i*L .. i*L+L-1 of a world of N*L ranks (L local ranks);
  otherwise every node reads the same stream."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ._deps import DEFAULT_PFS_MB_S, RANKED, OrderOptions, Profile, epochs_from_options
from .config import FileSpec, SimConfig, StorageClass, Table

DEFAULT_TIER_MB_S = {"memory": 10_000.0, "filesystem": 2_000.0}


@dataclass(frozen=True)
class Workload:
    compute_mb_s: float = 100.0
    preprocess_mb_s: float = 1e12
    network_mb_s: float = 12_500.0
    pfs_link_mb_s: float = 12_500.0
    staging_mb: float = 1024.0
    loader_threads: int = 2


def storage_of(profile: Profile, w: Workload) -> tuple[StorageClass, ...]:
    tiers = []
    for t in profile.tiers:
        table = Table.parse(t.bandwidth or {1: DEFAULT_TIER_MB_S.get(t.kind, 2_000.0)}, f"tiers[{t.name}].bandwidth")
        tiers.append(StorageClass(t.capacity / 1e6, t.threads, table, t.name))
    fastest = max(c.rate for c in tiers) if tiers else DEFAULT_TIER_MB_S["memory"]
    staging = StorageClass(w.staging_mb, w.loader_threads, Table(((1, fastest),)), "staging")
    return (staging, *tiers)


def config_from_profile(profile: Profile, sizes_bytes: Sequence[int], node_epochs: Sequence[Sequence[Sequence[int]]],
                        batch_size: int, w: Workload = Workload()) -> SimConfig:
    """node_epochs[node][epoch] = catalog file ids in read order."""
    nodes = len(node_epochs)
    pfs = Table.parse(profile.pfs.bandwidth or {1: DEFAULT_PFS_MB_S}, "pfs.bandwidth")
    return SimConfig(
        nodes=nodes, epochs=max(len(e) for e in node_epochs), batch_size=batch_size * nodes,
        files=FileSpec(count=len(sizes_bytes), sizes_mb=tuple(s / 1e6 for s in sizes_bytes)),
        compute_mb_s=w.compute_mb_s, preprocess_mb_s=w.preprocess_mb_s, network_mb_s=w.network_mb_s,
        pfs_link_mb_s=w.pfs_link_mb_s, pfs=pfs, storage=storage_of(profile, w), drop_last=False,
        pfs_latency_ms=profile.pfs.latency_ms or 0.0, copy_threads=profile.pfs.read_threads,
        orders=tuple(tuple(tuple(e) for e in node) for node in node_epochs))


def node_streams(order: OrderOptions, catalog, nodes: int) -> list[list[list[int]]]:  # type: ignore[no-untyped-def]
    """Each node's epochs, from the same options `tiering plan` takes."""
    if order.sampler not in RANKED:
        one = [list(e) for e in epochs_from_options(order, catalog)]
        return [one] * nodes
    local = order.local_world_size or 1
    world = order.world_size or nodes * local
    out = []
    for i in range(max(1, world // local)):
        opts = dataclasses.replace(order, world_size=world, rank=i * local, local_world_size=local)
        out.append([list(e) for e in epochs_from_options(opts, catalog, env={})])
    return out


def plan_prediction(profile: Profile, sizes_bytes: Sequence[int], epochs: Sequence[Sequence[int]],
                    batch_size: int | None) -> dict[str, object]:
    """For `tiering plan`: predicted seconds per epoch of the clairvoyant policy
    and of the loader reading the PFS directly (staging-pool), on one node."""
    from .runner import simulate
    cfg = config_from_profile(profile, sizes_bytes, [epochs], batch_size or 32)
    rep = simulate(cfg, ["staging-pool", "clairvoyant"])
    ours, pfs = rep.policies["clairvoyant"], rep.policies["staging-pool"]
    return {"compute_mb_s": cfg.compute_mb_s, "clairvoyant_epochs": ours.epochs, "pfs_epochs": pfs.epochs,
            "clairvoyant_seconds": ours.seconds, "pfs_seconds": pfs.seconds,
            "gain": pfs.seconds / ours.seconds if ours.seconds > 0 else None}


def format_prediction(p: dict[str, object]) -> str:
    per = "  ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(p["clairvoyant_epochs"], p["pfs_epochs"]))  # type: ignore[call-overload]
    gain = p["gain"]
    return (f"predicted seconds per epoch, clairvoyant/PFS directly (compute {p['compute_mb_s']:g} MB/s; "
            f"`tiering simulate` for more): {per}\n"
            f"predicted total {p['clairvoyant_seconds']:.1f} s against {p['pfs_seconds']:.1f} s reading the PFS "
            f"directly" + (f": {gain:.2f}x faster" if gain else ""))
