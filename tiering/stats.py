"""What a job did: the summary printed at exit and the --stats-json record."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .units import human_bytes

if TYPE_CHECKING:
    from .job import Job


def collect(job: "Job", exit_code: int) -> dict[str, Any]:
    cat = job.catalog
    assert cat is not None
    c = job.index.counters() if job.index else None
    d = job.daemon
    tiers = d.tier_summary() if d else []
    by_tier = {t.name: (c["opens_tier"][k] if c else 0) for k, t in enumerate(job.tiers)}
    job_pfs = c["opens_pfs"] if c else 0
    daemon_opens = d.stats.pfs_opens if d else 0
    return {
        "policy": job.policy,
        "exit_code": exit_code,
        "command": job.opts.command,
        "profile": job.opts.profile.name,
        "data": cat.roots,
        "files": len(cat.files),
        "bytes": cat.total_bytes,
        "tiers": tiers,
        "opens": {
            "total": c["opens"] if c else 0,
            "pfs": job_pfs,
            "by_tier": by_tier,
            "fallbacks": c["fallbacks"] if c else 0,
        },
        "pfs": {
            "opens": job_pfs + daemon_opens,
            "opens_by_job": job_pfs,
            "opens_by_daemon": daemon_opens,
            "bytes_read_by_daemon": d.stats.pfs_bytes if d else 0,
            "opens_avoided": sum(by_tier.values()),
            "bytes_avoided": c["bytes_tier"] if c else 0,
        },
        "placement": {
            "copies": d.stats.copies if d else 0,
            "copy_failures": d.stats.copy_failures if d else 0,
            "changed_sources": d.stats.changed_sources if d else 0,
            "evictions": d.stats.evictions if d else 0,
            "invalidated": d.stats.invalidated if d else 0,
            "write_opens": c["writes"] if c else 0,
            "abandoned": d.stuck if d else 0,   # copies still blocked in a PFS read at exit
            "errors": d.stats.errors[:20] if d else [],
        },
        "order": d.policy.report() if d else {},
        "events": c["events_posted"] if c else 0,
        "events_dropped": c["events_dropped"] if c else 0,
        "seconds": {k: round(v, 3) for k, v in job.timings.items()},
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
    if s["events_dropped"]:
        lines.append(f"  events   {s['events_dropped']} of {s['events']} dropped (ring full)")
    return "\n".join(lines)
