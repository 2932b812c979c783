"""Words and numbers for people: the status line tier-run prints while
COMMAND runs and the view `tiering status` shows, both from one status dict
(NOTE [status file]).  Sizes in binary units (KiB, MiB, GiB) throughout."""
from __future__ import annotations

from typing import Any

from ..units import human_bytes

MIB = 1 << 20


def clock(seconds: float | None) -> str:
    """0:45, 12:03, 1:02:03."""
    if seconds is None:
        return "?"
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def pct(x: float | None) -> str:
    """A share in percent: whole numbers, but one decimal near 0 and 100
    (99.7% is not 100%)."""
    if x is None:
        return "-"
    v = 100 * x
    return f"{v:.1f}%" if 0 < v < 10 or 99.5 <= v < 100 else f"{v:.0f}%"


def change(now: float, before: float) -> str:
    """now against before, in percent: "-33%", "+5%"; "n/a" without a before."""
    return f"{100 * (now - before) / before:+.0f}%" if before else "n/a"


def count(n: int) -> str:
    return f"{n:,}"


def rate_mib(bytes_per_s: float) -> str:
    v = bytes_per_s / MIB
    return f"{v:.0f} MiB/s" if v >= 10 else f"{v:.1f} MiB/s"


def phase_text(st: dict[str, Any]) -> str:
    lead = st.get("prefetch_lead")
    kind = st.get("phase_kind")
    if kind == "prefetching" and lead:
        return f"prefetching {count(lead['samples'])} samples{lead_text(lead, ', ', '')} ahead of the reader"
    return str(st.get("phase", ""))


def warm_text(warm: float | None) -> str:
    """When the tiers were warm, seconds after COMMAND started: 0 or less
    is a warm-up's end (--warm filled them before COMMAND started)."""
    if warm is None:
        return "tiers never warm"
    if warm <= 0:
        return "tiers warm before COMMAND started (at the warm-up's end)"
    return f"tiers warm after {warm:.1f} s"


def lead_text(lead: dict[str, Any], before: str, after: str) -> str:
    """The lead's seconds, measured (series.lead_seconds): "6.5 s", "over
    40 s" when the reader has not read that many positions yet; "" when
    there is nothing to say."""
    secs = lead.get("seconds")
    if secs is None or (lead.get("at_least") and secs < 1):
        return ""
    return f"{before}{'over ' if lead.get('at_least') else ''}{secs:.1f} s{after}"


def placed_text(st: dict[str, Any]) -> str:
    p, ds = st["placed"], st["dataset"]
    share = f"{pct(p['share'])} of the data set in tiers"
    if ds["fits_bytes"] < ds["bytes"]:
        share += f" ({pct(p['share_of_fit'])} of what fits)"
    return share


def status_line(st: dict[str, Any]) -> str:
    """One line, for stderr while COMMAND runs."""
    parts = [f"tiering {clock(st.get('elapsed'))} {phase_text(st)}"]
    parts.append(placed_text(st))
    r = st["rates"]
    if st.get("warm_after") is None and st["copies"]["in_flight"]:
        eta = f", ETA {clock(st['eta'])}" if st.get("eta") is not None else ""
        parts.append(f"copying {rate_mib(r['copy_bytes_per_s'])}, {r['copy_files_per_s']:.0f} files/s{eta}")
    h = st["hit_ratio"]
    parts.append(f"{r['opens_per_s']:.0f} opens/s, {pct(h['recent'])} from tiers "
                 f"(last {h['window']:.0f} s; {pct(h['total'])} in all)")
    parts.append(f"PFS {rate_mib(r['pfs_bytes_per_s'])}")
    if st.get("events_dropped"):
        parts.append(f"{count(st['events_dropped'])} events dropped")
    return " | ".join(parts)


def tier_lines(st: dict[str, Any]) -> list[str]:
    out = []
    for t in st["tiers"]:
        fill = t["used"] / t["capacity"] if t["capacity"] else 0.0
        out.append(f"  tier {t['name']:<8} {human_bytes(t['bytes']):>10} in {count(t['files']):>9} files,"
                   f" {pct(fill):>4} of {human_bytes(t['capacity'])}")
    return out


def status_view(st: dict[str, Any]) -> str:
    """The several lines of `tiering status`."""
    cmd = " ".join(st.get("command", []))
    stale = st.get("stale_seconds")
    if st.get("state") == "scanning":
        sc = st["scan"]
        if sc.get("phase") == "reading sizes":    # COMMAND runs (NOTE [names first])
            return (f"job {st['job']} (tier-run pid {st['pid']}, COMMAND pid {st.get('command_pid') or '-'}): "
                    f"{cmd}\n  running {clock(st.get('elapsed'))}, placement starts once the sizes are read: "
                    f"{count(sc.get('sized', 0))} of {count(sc['files'])} files ({human_bytes(sc['bytes'])})"
                    + (f"  [no update for {stale:.0f} s]" if stale else ""))
        return (f"job {st['job']} (tier-run pid {st['pid']}): {cmd}\n"
                f"  {sc['phase']} the data set {clock(st.get('elapsed'))}: {count(sc['files'])} files "
                f"({human_bytes(sc['bytes'])}) in {count(sc['dirs'])} directories found so far"
                + (f"  [no update for {stale:.0f} s]" if stale else ""))
    lines = [f"job {st['job']} (tier-run pid {st['pid']}, COMMAND pid {st.get('command_pid') or '-'}): {cmd}",
             f"  {st['state']} {clock(st.get('elapsed'))}, policy {st['policy']}: {phase_text(st)}"
             + (f"  [no update for {stale:.0f} s]" if stale else "")]
    ds = st["dataset"]
    warm = f"; {warm_text(st['warm_after'])}" if st.get("warm_after") is not None else ""
    lines.append(f"  data set {count(ds['files'])} files, {human_bytes(ds['bytes'])}: {placed_text(st)}{warm}")
    lines += tier_lines(st)
    o, h, r = st["opens"], st["hit_ratio"], st["rates"]
    lines.append(f"  opens    {r['opens_per_s']:.0f}/s; from tiers {pct(h['recent'])} in the last "
                 f"{h['window']:.0f} s, {pct(h['total'])} in all ({count(o['from_tiers'])} of {count(o['total'])})")
    lines.append(f"  PFS      {rate_mib(r['pfs_bytes_per_s'])} (copies {rate_mib(r['copy_bytes_per_s'])}, "
                 f"{r['copy_files_per_s']:.0f} files/s)")
    c = st["copies"]
    lead = st.get("prefetch_lead")
    lead_words = ""
    if lead:
        lead_words = f"; prefetch lead {count(lead['samples'])} samples{lead_text(lead, ' (', ')')}"
    lines.append(f"  copies   {count(c['done'])} done, {c['reading']} reading the PFS, {c['queued']} queued, "
                 f"{c['failed']} failed, {count(c['evictions'])} evicted{lead_words}")
    lines.append(f"  events   {count(st.get('events_dropped', 0))} dropped")
    return "\n".join(lines)
