"""What a job did: the record written by --stats-json and the summary printed
at exit, both from one explicit `JobRecord` that the job fills in; and the
--stats-json file itself (checked before COMMAND starts, written after)."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .placement.daemon import DaemonStats
from .units import human_bytes


@dataclass
class JobRecord:
    """Everything the report needs, gathered by the job at its end."""

    policy: str                 # the policy asked for (or chosen by default)
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
    no_order: str | None = None   # why no order can come (the hook is missing, did not start)


def in_force(r: JobRecord) -> tuple[str, str | None]:
    """The policy that actually placed the files, and why it is not the one
    asked for (None when it is)."""
    if r.policy != "clairvoyant":
        return r.policy, None
    o = r.order
    if o.get("diverged"):
        return "first-touch", (f"clairvoyant until the reads stopped following the order after "
                               f"{o.get('matched_opens', 0)} matched opens")
    if not o.get("epochs_known"):
        if r.no_order:
            why = r.no_order
        elif o.get("hook_errors"):
            why = "the order hook could not use COMMAND's DataLoader (see order.hook_errors)"
        else:
            why = "no DataLoader of COMMAND announced an epoch"
        return "first-touch", f"no order received: {why}"
    return "clairvoyant", None


def to_json(r: JobRecord) -> dict[str, Any]:
    c, d = r.counters, r.daemon
    opens_tier = c.get("opens_tier", [0] * len(r.tiers))
    by_tier = {t["name"]: opens_tier[k] for k, t in enumerate(r.tiers)}
    job_pfs = c.get("opens_pfs", 0)
    policy, reason = in_force(r)
    return {
        "policy": policy,
        "policy_requested": r.policy,
        "policy_reason": reason,
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
            # what the shim knows at open time: an upper bound of the bytes read from tiers
            "bytes_of_files_served": c.get("bytes_tier", 0),
        },
        "pfs": {
            "opens": job_pfs + d.pfs_opens,
            "opens_by_job": job_pfs,
            "opens_by_daemon": d.pfs_opens,
            "bytes_read_by_daemon": d.pfs_bytes,
            "opens_avoided": sum(by_tier.values()),
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
    why = f" ({s['policy_reason']})" if s.get("policy_reason") else ""
    lines = [f"tiering: policy {s['policy']}{why}, {s['files']} files ({human_bytes(s['bytes'])}) "
             f"in {', '.join(s['data'])}; COMMAND exited {s['exit_code']}"]
    for t in s["tiers"]:
        lines.append(f"  tier {t['name']:<8} {t['files']:>9} files {human_bytes(t['bytes']):>11} placed"
                     f" (capacity {human_bytes(t['capacity'])})")
    o = s["opens"]
    per_tier = ", ".join(f"{n} {v}" for n, v in o["by_tier"].items())
    lines.append(f"  opens    {o['total']} of data-set files: {o['total'] - o['pfs']} from tiers"
                 f"{f' ({per_tier})' if per_tier else ''}, {o['pfs']} from the PFS")
    p = s["pfs"]
    lines.append(f"  PFS      {p['opens_avoided']} opens avoided (files of {human_bytes(o['bytes_of_files_served'])}"
                 f" served from tiers); the daemon read {human_bytes(p['bytes_read_by_daemon'])}"
                 f" in {p['opens_by_daemon']} opens")
    pl = s["placement"]
    if pl["copy_failures"] or pl["evictions"] or pl["invalidated"] or pl["changed_sources"]:
        lines.append(f"  copies   {pl['copies']} done, {pl['copy_failures']} failed, {pl['evictions']} evicted,"
                     f" {pl['invalidated']} invalidated by writes, {pl['changed_sources']} changed on the PFS")
    o = s.get("order") or {}
    if s["policy"] == "clairvoyant":   # else the policy line says why not
        lines.append(f"  order    {o['epochs_known']} epochs known, {o['matched_opens']} opens followed,"
                     f" {o['fetches']} files fetched ahead, {o['evictions']} evicted")
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


# -- the --stats-json file -------------------------------------------------------

def stats_path_problem(path: Path) -> str | None:
    """What keeps tier-run from writing --stats-json PATH, with the fix; None
    when it can (checked before COMMAND starts, so a typo costs no run)."""
    parent = path.parent if str(path.parent) else Path(".")
    if os.path.isdir(path):
        return f"--stats-json {path} is a directory; give a file name, e.g. {path / 'stats.json'}"
    if not os.path.isdir(parent):
        return (f"--stats-json {path}: the directory {parent} does not exist; create it first "
                f"(mkdir -p {parent}) or give a path in an existing directory")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            return f"--stats-json {path}: you may not write this file; give another path"
        return None
    try:   # access() says yes to root on a read-only file system: try for real
        fd, probe = tempfile.mkstemp(prefix=".tiering-probe-", dir=parent)
    except OSError as e:
        return (f"--stats-json {path}: cannot create a file in {parent} ({e.strerror}); give a path "
                "in a directory you can write to")
    os.close(fd)
    os.unlink(probe)
    return None


def write_stats(path: Path, stats: dict[str, Any]) -> str | None:
    """Writes the JSON; returns what went wrong instead of raising (a full
    device, a vanished directory: the job's exit status stays COMMAND's)."""
    text = json.dumps(stats, indent=2) + "\n"
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        return f"cannot write --stats-json {path}: {e.strerror or e}; the statistics are lost"
    return None
