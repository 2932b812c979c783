"""Runs policies over one config: the policy names and `simulate`."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from . import baselines, ours, reference
from .config import SimConfig
from .engine import run as run_engine
from .rates import Rates
from .reference import Built, Context, Unsupported
from .result import PolicyResult, Report, result_of
from .streams import Streams, build_streams


def _rng(ctx: Context) -> np.random.Generator:
    return np.random.default_rng(ctx.cfg.seed + 1)


BUILDERS: dict[str, Callable[[Context], Built]] = {
    "staging-pool": reference.staging_pool,
    "parallel-staging": lambda c: reference.parallel_staging(c, _rng(c)),
    "lbann-preload": lambda c: reference.lbann(c, preload=True),
    "lbann-dynamic": lambda c: reference.lbann(c, preload=False),
    "deepio-ordered": lambda c: reference.deepio(c, opportunistic=False, rng=_rng(c)),
    "deepio-opportunistic": lambda c: reference.deepio(c, opportunistic=True, rng=_rng(c)),
    "locality-aware": reference.locality_aware,
    "hdmlp": reference.hdmlp,
    "first-touch": lambda c: ours.first_touch(c, evict=False),
    "lru": lambda c: ours.first_touch(c, evict=True),
    "stage": ours.stage,
    "clairvoyant": lambda c: ours.clairvoyant(c, peers=False),
    "clairvoyant-peer": lambda c: ours.clairvoyant(c, peers=True),
}
VECTOR = {"lower-bound": baselines.lower_bound, "naive": baselines.naive}
POLICIES = ["lower-bound", "naive", "staging-pool", "parallel-staging", "lbann-preload", "lbann-dynamic",
            "deepio-ordered", "deepio-opportunistic", "locality-aware", "hdmlp",
            "first-touch", "lru", "stage", "clairvoyant", "clairvoyant-peer"]
PUBLISHED = POLICIES[:10]


def run_policy(name: str, cfg: SimConfig, streams: Streams, rates: Rates) -> PolicyResult:
    if name in VECTOR:
        return result_of(VECTOR[name](streams, rates), streams)
    built = BUILDERS[name](Context(cfg, streams, rates))
    s0 = cfg.storage[0]
    out = run_engine(built.pipeline, rates, s0.capacity_mb, s0.threads)
    return result_of(out, streams, bulk_pfs_mb=built.bulk_pfs_mb, bulk_peer_mb=built.bulk_peer_mb)


def simulate(cfg: SimConfig, policies: Iterable[str] = POLICIES, streams: Streams | None = None,
             progress: Callable[[str], None] | None = None) -> Report:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; policies: {', '.join(POLICIES)}")
    streams = build_streams(cfg) if streams is None else streams
    rates = Rates.of(cfg)
    report = Report()
    for name in policies:
        if progress is not None:
            progress(name)
        try:
            report.policies[name] = run_policy(name, cfg, streams, rates)
        except Unsupported as e:
            report.skipped[name] = str(e)
    return report
