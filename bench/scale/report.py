"""Targets and verdicts: each row compares ours with its reference from the
same run; a figure that a case could not produce is "not measured" with the
reason, never a pass."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.scale.cases import LEAD_BUILT_S

MiB = 1 << 20


@dataclass
class Row:
    target: str          # what is measured
    goal: str            # the target, as text
    ours: str
    reference: str
    ratio: float | None
    verdict: str         # pass | FAIL | info | not measured (why)
    value: float | None = None


def _get(d: dict[str, Any] | None, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MiB:.0f} MiB"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.1f} k{unit}" if x >= 10_000 else f"{x:.0f} {unit}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}% of a core"


def _run_problem(run: dict[str, Any] | None) -> str | None:
    if not run:
        return "not run"
    if run.get("error"):
        return run["error"]
    if run.get("killed"):
        return f"killed after {run.get('seconds', 0):.0f} s"
    if "status" in run and run["status"] != 0:
        return f"exit status {run['status']}"
    return None


def _verdict(value: float | None, ok: Callable[[float], bool], problem: str | None) -> str:
    if problem:
        return f"not measured ({problem})"
    if value is None:
        return "not measured"
    return "pass" if ok(value) else "FAIL"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def startup_rows(res: dict[str, Any]) -> list[Row]:
    find = res.get("find_s")
    cold, cached = _get(res, "runs", "cold"), _get(res, "runs", "cached")
    one = _get(res, "runs", "cached-1-epoch")
    ref = f"find \\| wc -l {_s(find)}"
    scan, in_job = res.get("scan_s"), _get(cold, "stats_seconds", "scan")
    names, first_touch = res.get("names_first_s"), _get(res, "runs", "cold-first-touch")
    rows = [
        Row("start-up to COMMAND, cached catalog", "<= 5 s", _s(_get(cached, "startup_s")), ref,
            _ratio(_get(cached, "startup_s"), find),
            _verdict(_get(cached, "startup_s"), lambda v: v <= 5, _run_problem(cached) or res.get("error")),
            _get(cached, "startup_s")),
        Row("cold scan before COMMAND (`catalog.scan(names_first=True)` in a process of its own, no cache)",
            "<= 1.5x find", _s(names), ref, _ratio(names, find),
            _verdict(_ratio(names, find), lambda v: v <= 1.5,
                     res.get("error") or (None if names is not None else "the scan failed")), names),
        Row("cold scan with every stat (`catalog.scan` in a process of its own, no cache)", "info", _s(scan), ref,
            _ratio(scan, find), "info" if scan is not None else _verdict(None, bool, "the scan failed"), scan),
        Row("cold scan inside tier-run (names first)", "info", _s(in_job), ref, _ratio(in_job, find),
            "info" if in_job is not None else _verdict(None, bool, _run_problem(cold)), in_job),
        Row("start-up to COMMAND, cold scan, first touch (no order to compute)", "info",
            _s(_get(first_touch, "startup_s")), ref, _ratio(_get(first_touch, "startup_s"), find),
            "info" if _get(first_touch, "startup_s") is not None else
            _verdict(None, bool, _run_problem(first_touch) or res.get("error")), _get(first_touch, "startup_s")),
        Row("start-up to COMMAND, cold scan", "info", _s(_get(cold, "startup_s")), ref,
            _ratio(_get(cold, "startup_s"), find),
            "info" if _get(cold, "startup_s") is not None else
            _verdict(None, bool, _run_problem(cold) or res.get("error")), _get(cold, "startup_s")),
    ]
    hwm90, hwm1 = _get(cached, "peak_rss"), _get(one, "peak_rss")
    rows.append(Row(f"tier-run peak RSS, random, {_get(cached, 'epochs')} epochs, COMMAND exits at once", "<= 600 MiB",
                    _mib(hwm90), "-", None, _verdict(hwm90, lambda v: v <= 600 * MiB, _run_problem(cached)), hwm90))
    hwm_cold = _get(cold, "peak_rss")
    rows.append(Row(f"tier-run peak RSS, random, {_get(cold, 'epochs')} epochs, cold scan, COMMAND exits at once",
                    "<= 600 MiB", _mib(hwm_cold), "-", None,
                    _verdict(hwm_cold, lambda v: v <= 600 * MiB, _run_problem(cold)), hwm_cold))
    rows.append(Row("tier-run peak RSS, all epochs vs 1 epoch", "<= 1.1x (independent of epochs)",
                    _mib(hwm90), f"1 epoch {_mib(hwm1)}", _ratio(hwm90, hwm1),
                    _verdict(_ratio(hwm90, hwm1), lambda v: v <= 1.1, _run_problem(cached) or _run_problem(one)),
                    hwm90))
    return rows


def plan_rows(res: dict[str, Any], epochs: int) -> list[Row]:
    rows = []
    for key in ("random", "distributed", "random-half", "distributed-half"):
        if key.endswith("-half") and key not in res:
            continue   # measured before the case had a tier holding half of the data set
        name = key.replace("-half", ", tier holds half")
        r = res.get(key)
        problem = _run_problem(r) or res.get("error")
        killed = bool(_get(r, "killed"))
        rows.append(Row(f"`tiering plan` {epochs} epochs, {name}: time", "<= 30 s",
                        (">= " if killed else "") + _s(_get(r, "seconds")) + (" (killed)" if killed else ""), "-", None,
                        "FAIL" if killed else _verdict(_get(r, "seconds"), lambda v: v <= 30, problem),
                        _get(r, "seconds")))
        rss = _get(r, "maxrss")
        if _get(r, "killed"):   # the polled peak until it was killed is a lower bound
            polled = _get(r, "peak_rss_polled")
            over = polled is not None and polled > 600 * MiB
            rows.append(Row(f"`tiering plan` {epochs} epochs, {name}: peak RSS", "<= 600 MiB",
                            f">= {_mib(polled)} (killed)", "-", None, "FAIL" if over else f"not measured ({problem})",
                            polled))
            continue
        rows.append(Row(f"`tiering plan` {epochs} epochs, {name}: peak RSS", "<= 600 MiB", _mib(rss), "-",
                        None, _verdict(rss, lambda v: v <= 600 * MiB, problem), rss))
    return rows


def _events_row(label: str, phase: dict[str, Any], direct: float | None, reference: str,
                dropped: int | None, problem: str | None) -> Row:
    """No events dropped at >= 200 k opens/s in a full-speed phase served
    from the tiers: the phase's own drop count, from tier-run's time series
    (results before it: the job's, a drop in any phase failing each)."""
    if phase.get("events_dropped") is not None:
        dropped = phase["events_dropped"]
    rate = phase.get("opens_per_s")
    tier_share = phase.get("tier", 0) / phase["files"] if phase.get("files") else None
    if not problem and not phase.get("files"):
        problem = "the phase did not run"
    elif not problem and (rate is None or tier_share is None or tier_share < 0.99):
        problem = f"the phase was not served from the tiers (share {tier_share})"
    verdict = _verdict(dropped, lambda v: v == 0, problem)
    if verdict == "pass" and rate is not None and rate < 200_000:
        verdict = f"not measured (reached {_rate(rate, 'opens/s')} < 200 k/s; 0 dropped at that rate)"
    return Row(label, "0 dropped at >= 200 k opens/s",
               f"{dropped} dropped at {_rate(rate, 'opens/s')}" if dropped is not None else "-",
               f"{reference} without tier-run {_rate(direct, 'opens/s')}", _ratio(rate, direct), verdict, dropped)


def _rss_by_phase(phases: dict[str, Any]) -> str:
    """The peak RSS as of the end of each phase: where the peak came."""
    at = [(k, (phases.get(k) or {}).get("peak_rss_at_end")) for k in ("prefetching", "fits", "full", "opens")]
    said = [f"{k} {_mib(v)}" for k, v in at if v]
    return "by the end of: " + ", ".join(said) if said else "-"


def _drain_cost(phase: dict[str, Any]) -> str:
    share, rate = phase.get("daemon_core_share"), phase.get("opens_per_s")
    if share is None or not rate:
        return "-"
    return f"{_pct(share)} at {_rate(rate, 'opens/s')} ({share / rate * 1e6:.2f} us a file)"


def clairvoyant_rows(res: dict[str, Any], name: str, epochs: int) -> list[Row]:
    problem = _run_problem(res)
    ph = res.get("phases") or {}
    full, fits, pre = ph.get("full") or {}, ph.get("fits") or {}, ph.get("prefetching") or {}
    opens = ph.get("opens") or {}
    dropped = res.get("events_dropped")
    order = res.get("order") or {}
    following = order.get("following") is True and order.get("diverged") is False
    wait, wanted = ph.get("wait") or {}, res.get("wait_files")
    fits_problem = problem
    if not problem and wanted and wait.get("waited") != wanted:
        fits_problem = (f"only {wait.get('waited')} of {wanted} files were placed; the reader stopped waiting "
                        f"after a minute without a new copy")
    return [
        Row(f"tier-run peak RSS, {name}, {epochs} epochs", "<= 600 MiB", _mib(res.get("peak_rss")),
            _rss_by_phase(ph), None,
            # a run killed after its peak passed the bound has failed it all the same
            _verdict(res.get("peak_rss"), lambda v: v <= 600 * MiB,
                     None if (res.get("peak_rss") or 0) > 600 * MiB else problem), res.get("peak_rss")),
        _events_row(f"events, {name}: 8 reader threads from the tiers", full, _get(res, "direct", "opens_per_s"),
                    "same reader", dropped, problem),
        # the same threads opening and closing files without reading them: an open and a close
        # event each, at a rate these 2 cores cannot reach with reads (random sampler only)
        *([_events_row(f"events, {name}: 8 threads opening and closing files from the tiers, no reads", opens,
                       _get(res, "direct", "opens_only_per_s"), "same threads", dropped, problem)]
          if opens else []),
        # what draining those events cost the daemon (NOTE [event batches])
        Row(f"daemon CPU, {name}: draining the events of the full-speed phases", "info",
            f"reading: {_drain_cost(full)}" + (f"; opening only: {_drain_cost(opens)}" if opens else ""),
            "-", None, "info", (opens or full).get("daemon_core_share")),
        Row(f"clairvoyant keeps following, {name}", "following, not diverged",
            f"following={order.get('following')} diverged={order.get('diverged')} (matched "
            f"{order.get('matched_opens')}, unmatched {order.get('unmatched_opens')}, skipped "
            f"{order.get('skipped_positions')})", "-", None,
            _verdict(1.0 if following else 0.0, lambda v: v == 1.0, problem), None),
        Row(f"daemon CPU, {name}: reader {_rate(fits.get('opens_per_s'), 'files/s')}, data in the tiers", "<= 10%",
            _pct(fits.get("daemon_core_share")), "-", None,
            _verdict(fits.get("daemon_core_share"), lambda v: v <= 0.10, fits_problem), fits.get("daemon_core_share")),
        Row(f"daemon CPU, {name}: reader {_rate(pre.get('opens_per_s'), 'files/s')}, prefetching", "<= 25%",
            _pct(pre.get("daemon_core_share")), "-", None,
            _verdict(pre.get("daemon_core_share"), lambda v: v <= 0.25, problem), pre.get("daemon_core_share")),
        Row(f"daemon CPU, {name}: prefetching, its first {LEAD_BUILT_S:g} s left out (the lead built at full speed)",
            "info",
            _pct(pre.get("steady_core_share")), "-", None, "info", pre.get("steady_core_share")),
        Row(f"teardown after COMMAND exits, {name}", "<= 5 s", _s(res.get("teardown_s")), "-", None,
            _verdict(res.get("teardown_s"), lambda v: v <= 5, problem), res.get("teardown_s")),
        Row(f"start-up to COMMAND, {name}" + (" (cached catalog)" if res.get("catalog_cached") else " (cold)"),
            "<= 5 s" if res.get("catalog_cached") else "info", _s(res.get("startup_s")), "-", None,
            _verdict(res.get("startup_s"), lambda v: v <= 5, problem) if res.get("catalog_cached") else "info",
            res.get("startup_s")),
    ]


def _stage_problem(res: dict[str, Any], stage: dict[str, Any]) -> str | None:
    """Why a staging's rate is not a measure, or None."""
    if stage.get("invalid"):        # set by hand on a result found to be wrong, with the reason
        return str(stage["invalid"])
    problem = res.get("error") or _run_problem(stage)
    if not problem and stage.get("waited") != res.get("files"):
        problem = (f"stage placed {stage.get('waited')} of {res.get('files')} files, then made no copy for a minute")
    elif not problem and not stage.get("checksum_equal"):
        problem = "the staged copies were not all read back with the same bytes"
    return problem


def copies_rows(res: dict[str, Any], label: str, unit: str) -> list[Row]:
    """Each staging against the mean of the cp -r before and after it (older
    results: before only); with several rounds (bench/scale/cases.py,
    case_copies_small) the verdict is on the median of the rounds' ratios."""
    tar = res.get("tar") or {}
    key = "files_per_s" if unit == "files/s" else "mb_per_s"
    fmt = (lambda x: _rate(x, "files/s")) if key == "files_per_s" else (lambda x: "-" if x is None else f"{x:.0f} MB/s")
    rounds = [res, *(res.get("more_rounds") or [])]
    stages = [r.get("stage") or {} for r in rounds]
    problem = next((p for p in (_stage_problem(res, st) for st in stages) if p), None)
    # cp -r before the first staging and after each (a failed one has no rate)
    cps = [c for c in [res.get("cp") or {}, *(r.get("cp_after") or {} for r in rounds)] if c]
    cp_rates: list[float | None] = [c.get(key) if c.get("ok") else None for c in cps]
    ours = [st.get(key) for st in stages]
    refs: list[float | None] = []
    for k in range(len(stages)):
        near = cp_rates[k:k + 2] if len(cp_rates) == len(stages) + 1 else cp_rates[:1]
        refs.append(None if not near or None in near else sum(c or 0.0 for c in near) / len(near))
    ratios = [_ratio(o, c) for o, c in zip(ours, refs)]
    ratio = None if not ratios or None in ratios else statistics.median(r or 0.0 for r in ratios)
    if len(stages) == 1:
        cp_text = (f"cp -r {fmt(refs[0])} (before {fmt(cp_rates[0])}, after {fmt(cp_rates[1])})" if len(cp_rates) == 2
                   else f"cp -r {fmt(refs[0])}")
        ours_text = fmt(ours[0])
    else:
        cp_text = ("cp -r before and after each staging " + ", ".join(fmt(c) for c in cp_rates) +
                   "; by round " + ", ".join("-" if r is None else f"{r:.2f}x" for r in ratios) + " (median)")
        ours_text = ", ".join(fmt(o) for o in ours)
    known = [o for o in ours if o is not None]
    return [
        Row(f"copies, {label}: stage vs cp -r", ">= 0.9x cp -r", ours_text, cp_text,
            ratio, _verdict(ratio, lambda v: v >= 0.9, problem), statistics.median(known) if known else None),
        Row(f"copies, {label}: stage vs tar \\| tar", "info", fmt(ours[0]), f"tar \\| tar {fmt(tar.get(key))}",
            _ratio(ours[0], tar.get(key)), "info", ours[0]),
    ]


def teardown_row(results: dict[str, Any]) -> Row | None:
    """The slowest teardown of every tier-run of the run."""
    runs = [(f"startup/{k}", v) for k, v in (_get(results, "startup", "runs") or {}).items()]
    runs += [(k, results[k]) for k in ("clairvoyant-random", "clairvoyant-distributed") if k in results]
    runs += [(f"{k}/stage", _get(results, k, "stage"))
             for k in ("copies-small", "copies-small-ram", "copies-small-ext4", "copies-large") if k in results]
    seen = [(k, r["teardown_s"]) for k, r in runs if isinstance(r, dict) and r.get("teardown_s") is not None]
    if not seen:
        return None
    name, worst = max(seen, key=lambda kv: kv[1])
    return Row("teardown after COMMAND exits, slowest run", "<= 5 s", f"{_s(worst)} ({name})", "-", None,
               "pass" if worst <= 5 else "FAIL", worst)


def rows(results: dict[str, Any], epochs: int) -> list[Row]:
    out: list[Row] = []
    if "startup" in results:
        out += startup_rows(results["startup"])
    if "plan" in results:
        out += plan_rows(results["plan"], epochs)
    for name in ("random", "distributed"):
        if f"clairvoyant-{name}" in results:
            out += clairvoyant_rows(results[f"clairvoyant-{name}"], name, epochs)
    if "copies-small" in results:
        out += copies_rows(results["copies-small"], "small files", "files/s")
    if "copies-small-ram" in results:
        out += copies_rows(results["copies-small-ram"], "small files to /dev/shm", "files/s")
    if "copies-small-ext4" in results:
        out += copies_rows(results["copies-small-ext4"], "small files to ext4 in memory", "files/s")
    if "copies-large" in results:
        out += copies_rows(results["copies-large"], "large files", "MB/s")
    td = teardown_row(results)
    return out + ([td] if td else [])


def as_json(table: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in table]


def markdown(table: list[Row], headline: str) -> str:
    lines = [headline, "", "| target | goal | ours | reference | ratio | verdict |", "|---|---|---:|---:|---:|---|"]
    for r in table:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(f"| {r.target} | {r.goal} | {r.ours} | {r.reference} | {ratio} | {r.verdict} |")
    return "\n".join(lines) + "\n"
