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

from .observe.epochs import epoch_records
from .observe.view import change, pct, warm_text
from .placement.daemon import DaemonStats
from .units import human_bytes, plain_number

MANY_FALLBACKS = 0.01     # of the opens served from tiers: worth a warning
BYTES_MEASURE = "bytes read, by file position at close"   # what the PFS byte figures count


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
    observed: dict[str, Any] = field(default_factory=dict)      # JobWatch.finish(): series, warm_after, t0
    warm: dict[str, Any] | None = None                           # --warm: WarmResult.to_json()
    unsized: int = 0              # files whose sizes were not read by the end (NOTE [names first]): not in bytes
    few_large: bool = False       # the data set is a few large files (NOTE [few large files])


def in_force(r: JobRecord) -> tuple[str, str | None]:
    """The policy that actually placed the files, and why it is not the one
    asked for (None when it is)."""
    if r.policy != "clairvoyant":
        return r.policy, None
    o = r.order
    if o.get("gave_up"):
        return "first-touch", f"clairvoyant until the mapping was given up: {o['gave_up']}"
    if o.get("diverged"):
        return "first-touch", (f"clairvoyant until the reads stopped following the order after "
                               f"{o.get('matched_opens', 0)} matched opens")
    if not o.get("epochs_known"):
        if r.no_order:
            why = r.no_order
        elif str((o.get("mapping") or {}).get("source", "")).startswith("none") and o.get("mapping", {}).get("indices"):
            why = "the data set's indices could not be mapped to its files (see order.mapping)"
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
    total = c.get("opens", 0)
    served = sum(by_tier.values())
    policy, reason = in_force(r)
    order = dict(r.order)
    per_epoch = order.pop("per_epoch", [])
    obs = r.observed
    series = obs.get("series") or {}
    seconds: dict[str, float | None] = {k: round(v, 3) for k, v in r.seconds.items()}
    seconds["warm"] = round(obs["warm_after"], 3) if obs.get("warm_after") is not None else None
    # NOTE [read counters]: what COMMAND read, by the file positions of its descriptors at close
    job_read, tier_read = c.get("read_pfs", 0), c.get("read_tier", 0)
    out = {
        "policy": policy,
        "policy_requested": r.policy,
        "policy_reason": reason,
        "exit_code": r.exit_code,
        "command": r.command,
        "profile": r.profile,
        "data": r.data,
        "files": r.files,
        "bytes": r.bytes,
        **({"files_unsized": r.unsized} if r.unsized else {}),
        "tiers": r.tiers,
        "opens": {
            "total": total,
            "pfs": job_pfs,
            "by_tier": by_tier,
            "fallbacks": c.get("fallbacks", 0),
            "bytes_read_from_tiers": tier_read,
            # what the shim knows at open time: an upper bound of the bytes read from tiers
            "bytes_of_files_served": c.get("bytes_tier", 0),
            # open files closed at file position 0 (pread or mmap readers, or nothing read):
            # what they read is in no "read" figure; their files' sizes
            "closed_at_position_0": c.get("closed_at_zero", 0),
            "bytes_of_files_closed_at_position_0": c.get("closed_at_zero_bytes", 0),
        },
        "hit_ratio": round(served / total, 4) if total else None,
        "pfs": {
            "opens": job_pfs + d.pfs_opens,
            "opens_by_job": job_pfs,
            "opens_by_daemon": d.pfs_opens,
            "bytes_read_by_daemon": d.pfs_bytes,
            "bytes_read_by_job": job_read,
            # sizes of the files COMMAND opened on the PFS: an upper bound of what it read there
            "bytes_of_files_opened_by_job": d.job_pfs_bytes,
            "bytes": job_read + d.pfs_bytes,
            "opens_without_tiering": total,
            # what COMMAND read, from the PFS and from the tiers: all of it from the PFS without tiering
            "bytes_without_tiering": job_read + tier_read,
            "bytes_without_tiering_upper_bound": d.job_pfs_bytes + c.get("bytes_tier", 0),
            "bytes_measure": BYTES_MEASURE,
            "opens_avoided": served,
        },
        "placement": {
            "copies": d.copies,
            "copy_failures": d.copy_failures,
            "copy_failures_by_reason": dict(sorted(d.failure_reasons.items(), key=lambda kv: -kv[1])),
            "changed_sources": d.changed_sources,
            "evictions": d.evictions,
            "invalidated": d.invalidated,
            "write_opens": c.get("writes", 0),
            # NOTE [one read per file]: copies not made then because COMMAND read the file first, and
            # opens that waited for a copy in flight
            "copies_read_first": d.claims_read,
            "opens_waited_for_copy": c.get("copy_waits", 0),
            "abandoned": r.abandoned,
            "placement_errors": d.placement_errors,
            "errors": d.errors[:20],
        },
        "order": order,
        "warm": r.warm,
        "few_large_files": r.few_large,
        # a few large files are opened once and read in place: opens mark no epochs (NOTE [few large files])
        "epochs": [] if r.few_large else epoch_records(per_epoch, obs.get("t0"), series),
        "events": c.get("events_posted", 0),
        "events_dropped": c.get("events_dropped", 0),
        "seconds": seconds,
        "series": series,
    }
    if d.peer is not None:   # the peer tier: this node's fetches, fallbacks by reason, the clients' counters
        out["peer"] = d.peer
    out["warnings"] = warnings(out)
    return out


def warnings(s: dict[str, Any]) -> list[str]:
    """What the user should know and do something about."""
    out = []
    o, pl = s["opens"], s["placement"]
    served = o["total"] - o["pfs"]
    if not s["files"]:
        out.append(f"the data set is empty: no regular file under {', '.join(s['data'])}; check --data")
    elif not o["total"]:
        out.append(f"COMMAND opened no file of the data set: does it read from {', '.join(s['data'])}? "
                   "(a path to another copy of the data, or a different --data?)")
    if s.get("files_unsized"):
        out.append(f"COMMAND ended before the sizes of {s['files_unsized']:,} files were read (the scan lists "
                   "names first and reads the sizes while COMMAND runs): nothing was placed, and the bytes "
                   "above leave those files out")
    if pl["copies"] and not served:
        out.append(f"{pl['copies']:,} copies made, none served: COMMAND read each file before its copy landed "
                   "or never again (one epoch?); --warm fills the tiers before COMMAND starts")
    if o["fallbacks"] and o["fallbacks"] >= max(10, MANY_FALLBACKS * served):
        out.append(f"{o['fallbacks']:,} opens fell back to the PFS because their copy went away between lookup "
                   "and open (evicted while the reader came for it): the tiers are tight for this reader")
    if s["events_dropped"]:
        out.append(f"{s['events_dropped']:,} of {s['events']:,} events dropped (ring full): the daemon missed "
                   "opens and closes, so the per-epoch numbers are undercounted (the totals are not)")
    return out


def pfs_line(s: dict[str, Any]) -> str:
    """The net effect on the PFS, in one line."""
    p = s["pfs"]
    return (f"PFS traffic: {human_bytes(p['bytes'])} instead of {human_bytes(p['bytes_without_tiering'])} "
            f"({change(p['bytes'], p['bytes_without_tiering'])}), {p['opens']:,} opens instead of "
            f"{p['opens_without_tiering']:,} ({change(p['opens'], p['opens_without_tiering'])})")


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def epoch_table(epochs: list[dict[str, Any]], limit: int = 8) -> list[str]:
    head = ("  epoch   seconds     opens  from tiers   PFS opens  PFS bytes read   lead (samples)")
    rows = []
    for e in epochs:
        lead = "-" if e["prefetch_lead"] is None else f"{e['prefetch_lead']:,.0f}"
        rows.append(f"  {e['epoch']:>5} {e['seconds']:>9.1f} {e['opens']:>9,} {pct(e['hit_ratio']):>11}"
                    f" {e['pfs_opens']:>11,} {human_bytes(e['pfs_bytes']):>14} {lead:>16}")
    if len(rows) > limit:
        rows = rows[:limit // 2] + [f"  ... {len(rows) - limit + 1} more epochs ..."] + rows[-(limit // 2 - 1):]
    return [head] + rows


def summary_text(s: dict[str, Any]) -> str:
    why = f" ({s['policy_reason']})" if s.get("policy_reason") else ""
    lines = [f"tiering: policy {s['policy']}{why}, {s['files']:,} files ({human_bytes(s['bytes'])}) "
             f"in {', '.join(s['data'])}; COMMAND exited {s['exit_code']}"]
    sec = s["seconds"]
    warm = sec.get("warm")
    lines.append(f"  time     COMMAND {_seconds(sec.get('command'))}, scan {_seconds(sec.get('scan'))}, "
                 + warm_text(warm))
    o = s["opens"]
    per_tier = ", ".join(f"{n} {v:,}" for n, v in o["by_tier"].items())
    lines.append(f"  hits     {pct(s['hit_ratio'])} of {o['total']:,} opens of data-set files from tiers"
                 f"{f' ({per_tier})' if per_tier else ''}, {o['pfs']:,} from the PFS")
    lines.append(f"  {pfs_line(s)}")
    p = s["pfs"]
    lines.append(f"           {p['bytes_measure']}: COMMAND read {human_bytes(p['bytes_read_by_job'])} there "
                 f"(of files of {human_bytes(p['bytes_of_files_opened_by_job'])} it opened: an upper bound) "
                 f"and {human_bytes(o['bytes_read_from_tiers'])} from the tiers, the copies read "
                 f"{human_bytes(p['bytes_read_by_daemon'])}")
    if o.get("closed_at_position_0"):   # what the file positions cannot show (NOTE [read counters])
        lines.append(f"           {o['closed_at_position_0']:,} of {o['total']:,} opens were closed at file position 0 "
                     "(pread or mmap readers, or nothing read): not in these figures; their files hold "
                     f"{human_bytes(o['bytes_of_files_closed_at_position_0'])} (an upper bound)")
    if s.get("warm"):
        w = s["warm"]
        lines.append(f"  warm-up  {w['files']:,} files ({human_bytes(w['bytes'])}) copied before COMMAND started "
                     f"({w['percent']}% of what fits, {w['order']}), {w['seconds']:.1f} s"
                     + (" without --warm: the data set is a few large files" if w.get("auto") else ""))
    for t in s["tiers"]:
        lines.append(f"  tier {t['name']:<8} {t['files']:>9,} files {human_bytes(t['bytes']):>11} placed"
                     f" (capacity {human_bytes(t['capacity'])})")
    if s.get("epochs"):
        lines += epoch_table(s["epochs"])
    elif s.get("few_large_files"):
        lines.append(f"  epochs   not counted: the data set's {s['files']:,} large files are each opened once and "
                     "read in place (memory maps, reads at offsets), so opens do not mark its epochs")
    pl = s["placement"]
    if pl["copy_failures"] or pl["evictions"] or pl["invalidated"] or pl["changed_sources"]:
        reasons = pl.get("copy_failures_by_reason") or {}
        why = f" ({', '.join(f'{n:,} {r}' for r, n in reasons.items())})" if pl["copy_failures"] and reasons else ""
        lines.append(f"  copies   {pl['copies']:,} done, {pl['copy_failures']:,} failed{why}, {pl['evictions']:,} "
                     f"evicted, {pl['invalidated']} invalidated by writes, {pl['changed_sources']} changed on the PFS")
    if pl.get("copies_read_first") or pl.get("opens_waited_for_copy"):
        lines.append(f"  one read {pl.get('copies_read_first', 0):,} copies left to COMMAND's own read, "
                     f"{pl.get('opens_waited_for_copy', 0):,} opens waited for a copy in flight or next in its "
                     "queue")
    o = s.get("order") or {}
    if s["policy"] == "clairvoyant":   # else the policy line says why not
        lines.append(f"  order    {o['epochs_known']} epochs known, {o['matched_opens']:,} opens followed,"
                     f" {o['fetches']:,} files fetched ahead, {o['evictions']:,} evicted"
                     + (f", {o['passed_over']:,} left to COMMAND's own read (their copies could not have"
                        " landed before it)" if o.get("passed_over") else ""))
    if o.get("mapping") and s.get("few_large_files"):
        # NOTE [few large files]: indices mapped to a handful of files say nothing of what was served
        lines.append(f"  mapping  not needed: the data set is {s['files']:,} large files, each opened and "
                     "mapped whole")
    elif o.get("mapping"):
        m = o["mapping"]
        lines.append(f"  mapping  indices to files: {m['source']}"
                     + (f" ({m['mapped']:,} of {m['indices']:,} indices)" if m.get("indices") else ""))
    for err in o.get("hook_errors", []):
        lines.append(f"  order    hook: {err}")
    if pl.get("abandoned"):
        lines.append(f"  copies   {pl['abandoned']} still blocked reading the PFS at exit: abandoned"
                     " (is the PFS hung?)")
    if pl.get("placement_errors"):
        lines.append(f"  errors   {pl['placement_errors']} placement errors (see placement.errors in --stats-json);"
                     " placement went on")
    for w in s.get("warnings", []):
        lines.append(f"  warning  {w}")
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
    text = json.dumps(stats, indent=2, default=plain_number) + "\n"
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        return f"cannot write --stats-json {path}: {e.strerror or e}; the statistics are lost"
    return None
