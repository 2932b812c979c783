"""What a job did: the record written by --stats-json and the summary printed
at exit, both from one explicit `JobRecord` that the job fills in."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .placement.daemon import DaemonStats
from .units import human_bytes


@dataclass
class JobRecord:
    """Everything the report needs, gathered by the job at its end."""

    policy: str
    exit_code: int
    command: list[str]
    profile: str
    data: list[str]
    files: int
    bytes: int
    tiers: list[dict[str, Any]] = field(default_factory=list)   # Daemon.tier_summary()
    counters: dict[str, Any] = field(default_factory=dict)       # SharedIndex.counters()
    daemon: DaemonStats = field(default_factory=DaemonStats)
    abandoned: int = 0                                           # copies blocked in a PFS read at exit
    order: dict[str, Any] = field(default_factory=dict)          # the policy's report
    seconds: dict[str, float] = field(default_factory=dict)


def to_json(r: JobRecord) -> dict[str, Any]:
    c, d = r.counters, r.daemon
    opens_tier = c.get("opens_tier", [0] * len(r.tiers))
    by_tier = {t["name"]: opens_tier[k] for k, t in enumerate(r.tiers)}
    job_pfs = c.get("opens_pfs", 0)
    return {
        "policy": r.policy,
        "exit_code": r.exit_code,
        "command": r.command,
        "profile": r.profile,
        "data": r.data,
        "files": r.files,
        "bytes": r.bytes,
        "tiers": r.tiers,
        "opens": {
            "total": c.get("opens", 0),
            "pfs": job_pfs,
            "by_tier": by_tier,
            "fallbacks": c.get("fallbacks", 0),
        },
        "pfs": {
            "opens": job_pfs + d.pfs_opens,
            "opens_by_job": job_pfs,
            "opens_by_daemon": d.pfs_opens,
            "bytes_read_by_daemon": d.pfs_bytes,
            "opens_avoided": sum(by_tier.values()),
            "bytes_avoided": c.get("bytes_tier", 0),
        },
        "placement": {
            "copies": d.copies,
            "copy_failures": d.copy_failures,
            "changed_sources": d.changed_sources,
            "evictions": d.evictions,
            "invalidated": d.invalidated,
            "write_opens": c.get("writes", 0),
            "abandoned": r.abandoned,
            "placement_errors": d.placement_errors,
            "errors": d.errors[:20],
        },
        "order": r.order,
        "events": c.get("events_posted", 0),
        "events_dropped": c.get("events_dropped", 0),
        "seconds": {k: round(v, 3) for k, v in r.seconds.items()},
    }


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"tiering: policy {s['policy']}, {s['files']} files ({human_bytes(s['bytes'])}) "
             f"in {', '.join(s['data'])}; COMMAND exited {s['exit_code']}"]
    for t in s["tiers"]:
        lines.append(f"  tier {t['name']:<8} {t['files']:>9} files {human_bytes(t['bytes']):>11} placed"
                     f" (capacity {human_bytes(t['capacity'])})")
    o = s["opens"]
    per_tier = ", ".join(f"{n} {v}" for n, v in o["by_tier"].items())
    lines.append(f"  opens    {o['total']} of data-set files: {o['total'] - o['pfs']} from tiers"
                 f"{f' ({per_tier})' if per_tier else ''}, {o['pfs']} from the PFS")
    p = s["pfs"]
    lines.append(f"  PFS      {p['opens_avoided']} opens and {human_bytes(p['bytes_avoided'])} avoided;"
                 f" the daemon read {human_bytes(p['bytes_read_by_daemon'])} in {p['opens_by_daemon']} opens")
    pl = s["placement"]
    if pl["copy_failures"] or pl["evictions"] or pl["invalidated"] or pl["changed_sources"]:
        lines.append(f"  copies   {pl['copies']} done, {pl['copy_failures']} failed, {pl['evictions']} evicted,"
                     f" {pl['invalidated']} invalidated by writes, {pl['changed_sources']} changed on the PFS")
    o = s.get("order") or {}
    if s["policy"] == "clairvoyant":
        if o.get("diverged"):
            lines.append(f"  order    the reads stopped following the order after {o['matched_opens']} matched opens:"
                         " placed by first touch from then on")
        elif o.get("following"):
            lines.append(f"  order    {o['epochs_known']} epochs known, {o['matched_opens']} opens followed,"
                         f" {o['fetches']} files fetched ahead, {o['evictions']} evicted")
        else:
            lines.append("  order    none received: placed by first touch")
        for err in o.get("hook_errors", []):
            lines.append(f"  order    hook: {err}")
    if pl.get("abandoned"):
        lines.append(f"  copies   {pl['abandoned']} still blocked reading the PFS at exit: abandoned"
                     " (is the PFS hung?)")
    if pl.get("placement_errors"):
        lines.append(f"  errors   {pl['placement_errors']} placement errors (see placement.errors in --stats-json);"
                     " placement went on")
    if s["events_dropped"]:
        lines.append(f"  events   {s['events_dropped']} of {s['events']} dropped (ring full)")
    return "\n".join(lines)
