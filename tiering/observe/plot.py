"""`tiering report`: pictures of what a job did, from its --stats-json.

Three panels, one above the other, sharing nothing but the job:
1. the tiers filling over time (bytes in each tier, stacked; capacities
   dashed; the moment the tiers were warm);
2. the hit ratio per epoch (opens served from tiers / opens of data-set
   files), or over time when no epochs were known;
3. the PFS traffic over time (MiB/s, COMMAND's and the copies' together)
   with the reader's epochs marked;
4. the epoch times (COMMAND's time when no epochs were known), beside those
   of the same training run without tier-run when they are given (`--direct`).
An .html output is a page with the picture and the summary tier-run printed.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..units import human_bytes
from .view import change, pct

PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]


class PlotError(Exception):
    """The stats file cannot be drawn; the message says why."""


def load_stats(path: Path) -> dict[str, Any]:
    """The --stats-json file, with every field the pictures read checked
    (PlotError names the first one that is missing or of the wrong kind)."""
    try:
        s = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise PlotError(f"{path}: not a tier-run --stats-json file ({str(e)[:200]})") from None
    if not isinstance(s, dict) or "opens" not in s or "tiers" not in s:
        raise PlotError(f"{path}: not a tier-run --stats-json file (no opens or tiers)")
    series = s.get("series")
    if not isinstance(series, dict) or not series.get("t"):
        raise PlotError(f"{path}: no time series in it (written by an older tier-run, or COMMAND ended "
                        "before the first sample)")
    if (problem := _problem(s)) is not None:
        raise PlotError(f"{path}: not a tier-run --stats-json file of this version: {problem}")
    return s


LARGEST = 1e30            # no count or second of a job comes near: the axes' limits stay finite


def _number(v: Any, none: bool = False) -> bool:
    if v is None:
        return none
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < LARGEST


def _numbers(v: Any, n: int, none: bool = False) -> bool:
    return isinstance(v, list) and len(v) == n and all(_number(x, none) for x in v)


def _records(v: Any, fields: dict[str, bool]) -> bool:
    """A list of objects, each with these number fields (True: may be null)."""
    return isinstance(v, list) and all(isinstance(r, dict) and all(_number(r.get(k), none) for k, none in
                                                                   fields.items()) for r in v)


def _problem(s: dict[str, Any]) -> str | None:
    """The first field the pictures read that is missing or of the wrong kind, or None."""
    ser = s["series"]
    t = ser["t"]
    n = len(t) if isinstance(t, list) else 0
    seconds = s.get("seconds") if s.get("seconds") is not None else {}
    pfs = s.get("pfs")
    checks = [
        ("files", isinstance(s.get("files"), int) and _number(s.get("files"))),
        ("bytes", _number(s.get("bytes"))),
        ("policy", isinstance(s.get("policy"), str)),
        ("policy_reason", s.get("policy_reason") is None or isinstance(s.get("policy_reason"), str)),
        ("command", isinstance(s.get("command", []), list) and all(isinstance(a, str) for a in s.get("command", []))),
        ("seconds", isinstance(seconds, dict) and _number(seconds.get("command", 0), none=False)
         and _number(seconds.get("warm"), none=True)),
        ("hit_ratio", _number(s.get("hit_ratio"), none=True)),
        ("tiers", isinstance(s["tiers"], list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                                      and _number(x.get("capacity")) for x in s["tiers"])),
        ("series.t", _numbers(t, n)),
        ("series.tier_bytes", isinstance(ser.get("tier_bytes"), dict)
         and all(_numbers(v, n) for v in ser["tier_bytes"].values())),
        ("series.hit_ratio", _numbers(ser.get("hit_ratio"), n, none=True)),
        ("series.pfs_mib_per_s", _numbers(ser.get("pfs_mib_per_s"), n)),
        ("epochs", s.get("epochs") is None or _records(s["epochs"], {"epoch": False, "start": False,
                                                                    "seconds": False, "hit_ratio": True})),
        ("pfs", isinstance(pfs, dict) and ("bytes_without_tiering" not in pfs or (
            _number(pfs["bytes_without_tiering"]) and _number(pfs.get("bytes"))
            and isinstance(pfs.get("bytes_measure", ""), str)))),
    ]
    return next((f"{name} is missing or not what tier-run writes" for name, ok in checks if not ok), None)


def _unit(nbytes: float) -> tuple[float, str]:
    for div, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= div:
            return float(div), name
    return 1.0, "B"


def _tiers_panel(ax: Any, s: dict[str, Any]) -> None:
    ser = s["series"]
    t = [0.0] + ser["t"]
    names = [tier["name"] for tier in s["tiers"]]
    layers = [[0] + ser["tier_bytes"].get(n, [0] * len(ser["t"])) for n in names]
    filled = max([sum(col) for col in zip(*layers)] if layers else [0])
    # up to what matters: the data set or the fill; a capacity far above both is named, not drawn
    top = 1.15 * max(s["bytes"], filled, 1)
    div, unit = _unit(top)
    if layers:
        ax.stackplot(t, [[v / div for v in layer] for layer in layers], labels=names,
                     colors=COLORS[:len(layers)], alpha=0.8)
    for k, tier in enumerate(s["tiers"]):
        if tier["capacity"] <= top:
            ax.axhline(tier["capacity"] / div, color=COLORS[k % len(COLORS)], linestyle="--", linewidth=1,
                       label=f"{tier['name']} capacity {human_bytes(tier['capacity'])}")
    ax.axhline(s["bytes"] / div, color="black", linestyle=":", linewidth=1,
               label=f"data set {human_bytes(s['bytes'])}")
    warm = (s.get("seconds") or {}).get("warm")
    if warm is not None:
        ax.axvline(max(0.0, warm), color="tab:red", linewidth=1,
                   label=f"warm after {warm:.1f} s" if warm > 0 else "warm at the start (--warm)")
    ax.set_ylabel(f"bytes in tiers ({unit})")
    ax.set_xlabel("seconds since COMMAND started")
    ax.set_title("Tiers: " + ", ".join(f"{t['name']} {human_bytes(t['capacity'])}" for t in s["tiers"])
                 + f"; data set {s['files']:,} files, {human_bytes(s['bytes'])}")
    ax.set_ylim(0, top / div)
    ax.legend(fontsize=7, loc="lower right")


def _hits_panel(ax: Any, s: dict[str, Any]) -> None:
    epochs = s.get("epochs") or []
    total = s.get("hit_ratio")
    if epochs:
        xs = [e["epoch"] for e in epochs]
        ys = [100 * (e["hit_ratio"] or 0) for e in epochs]
        bars = ax.bar(xs, ys, color="tab:green", label="opens served from tiers")
        for b, e in zip(bars, epochs):
            ax.annotate(pct(e["hit_ratio"]), (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=7)
        ax.set_xlabel("epoch")
        ax.set_xticks(xs if len(xs) <= 20 else xs[::max(1, len(xs) // 20)])
        ax.set_title("Hit ratio per epoch (opens from tiers / opens of data-set files)")
    else:
        ser = s["series"]
        pts = [(t, 100 * h) for t, h in zip(ser["t"], ser["hit_ratio"]) if h is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:green", marker=".",
                label="opens served from tiers")
        ax.set_xlabel("seconds since COMMAND started")
        ax.set_title("Hit ratio over time (no epochs known: the order was not followed)")
    if total is not None:
        ax.axhline(100 * total, color="black", linestyle=":", linewidth=1, label=f"all opens {100 * total:.0f}%")
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of opens")
    ax.legend(fontsize=7, loc="lower right")


def _pfs_panel(ax: Any, s: dict[str, Any]) -> None:
    ser = s["series"]
    t = [0.0] + ser["t"]
    mib = [0.0] + ser["pfs_mib_per_s"]
    ax.step(t, mib, where="pre", color="tab:red", label="PFS MiB/s (COMMAND + copies)")
    ax.fill_between(t, mib, step="pre", color="tab:red", alpha=0.2)
    for e in s.get("epochs") or []:
        ax.axvline(e["start"], color="gray", linestyle="--", linewidth=0.8)
        ax.annotate(f"epoch {e['epoch']}", (e["start"], 1.0), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=7, color="gray")
    p = s["pfs"]
    if "bytes_without_tiering" in p:
        before = p["bytes_without_tiering"]
        diff = f" ({change(p['bytes'], before)})" if before else ""
        ax.set_title(f"PFS traffic: {human_bytes(p['bytes'])} instead of {human_bytes(before)}{diff} "
                     f"({p.get('bytes_measure', 'sizes of the files opened: upper bounds')})")
    ax.set_xlabel("seconds since COMMAND started")
    ax.set_ylabel("PFS MiB/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")


def _times_panel(ax: Any, s: dict[str, Any], direct: list[float] | None) -> None:
    """Seconds per epoch under tier-run (from each epoch's first open to the
    next one's) and, given, the direct run's, side by side; without epochs,
    COMMAND's time against the direct run's total."""
    epochs = s.get("epochs") or []
    if epochs:
        ours = [float(e["seconds"]) for e in epochs]
        names = [str(e["epoch"]) for e in epochs]
        ax.set_xlabel("epoch")
        ax.set_title("Epoch times" + (", directly and under tier-run" if direct else " under tier-run"))
    else:
        ours = [float((s.get("seconds") or {}).get("command", 0))]
        names = ["COMMAND"]
        direct = [sum(direct)] if direct else None
        ax.set_title("COMMAND's time (no epochs known: the order was not followed)"
                     + (", directly and under tier-run" if direct else ""))
    n = max(len(ours), len(direct or []))
    names += [str(k + 1) for k in range(len(names), n)]
    xs = list(range(n))
    width = 0.4 if direct else 0.6
    if direct:
        bars = ax.bar([x - width / 2 for x in range(len(direct))], direct, width, color="tab:gray",
                      label="directly (PFS)")
        ax.bar_label(bars, fmt="%.1f s", fontsize=7)
    bars = ax.bar([x + (width / 2 if direct else 0) for x in range(len(ours))], ours, width, color="tab:blue",
                  label="under tier-run")
    ax.bar_label(bars, labels=[f"{t:.1f} s" + (f"\n{direct[k] / t:.2f}x" if direct and k < len(direct) and t > 0
                                                else "") for k, t in enumerate(ours)], fontsize=7)
    ax.set_xticks(xs if n <= 20 else xs[::max(1, n // 20)])
    ax.set_xticklabels(names if n <= 20 else names[::max(1, n // 20)])
    ax.set_ylabel("seconds")
    ax.set_ylim(0, 1.25 * max(ours + (direct or []) + [1e-3]))
    ax.legend(fontsize=7, loc="upper right")


def figure(s: dict[str, Any], direct: list[float] | None = None) -> Any:
    """The four panels; direct: the seconds per epoch of the same training
    run without tier-run, drawn beside its epoch times."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(4, 1, figsize=(9, 13))
    _tiers_panel(axes[0], s)
    _hits_panel(axes[1], s)
    _pfs_panel(axes[2], s)
    _times_panel(axes[3], s, direct)
    why = f" ({s['policy_reason']})" if s.get("policy_reason") else ""
    fig.suptitle(f"tier-run: policy {s['policy']}{why}; COMMAND {(s.get('seconds') or {}).get('command', 0):.1f} s, "
                 f"exit {s.get('exit_code')}", fontsize=10)
    fig.tight_layout()
    return fig


def write_report(stats: Path, out: Path, direct: list[float] | None = None,
                 summary: Callable[[dict[str, Any]], str] | None = None) -> None:
    """The picture of a job from its --stats-json file, into out (.png, .svg,
    .pdf, or .html with `summary`'s text of the stats below it: the caller's,
    report.summary_text, which sits above this module)."""
    s = load_stats(stats)
    suffix = out.suffix.lower()
    if suffix not in PICTURE_SUFFIXES + (".html",):
        raise PlotError(f"-o {out}: give a .png, .svg, .pdf or .html file")
    import matplotlib.pyplot as plt
    fig = figure(s, direct)
    try:
        if suffix == ".html":
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100)
            out.write_text(_page(s, base64.b64encode(buf.getvalue()).decode(), summary))
        else:
            fig.savefig(out, dpi=100)
    except OSError as e:
        raise PlotError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def _page(s: dict[str, Any], png_b64: str, summary: Callable[[dict[str, Any]], str] | None) -> str:
    try:
        text = summary(s) if summary is not None else "(no summary)"
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        text = "(no summary: the stats file is of another version)"
    return ("<!doctype html><meta charset='utf-8'><title>tier-run report</title>"
            "<body style='font-family:sans-serif'>"
            f"<h1>tier-run: {html.escape(' '.join(s.get('command', [])))}</h1>"
            f"<img alt='tiers, hit ratio, PFS traffic and epoch times' src='data:image/png;base64,{png_b64}'>"
            f"<pre>{html.escape(text)}</pre></body>\n")
