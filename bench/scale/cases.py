"""The measurements, one function per case; each returns plain numbers (JSON)
and report.py turns them into verdicts against the targets.

tier-run and `tiering plan` are measured from the outside, through their
command lines and --stats-json; COMMAND is scaletool (stamp or read), which
writes its own wall-clock start and exit times."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import ext4mem
from bench.scale import monitor
from bench.scale.tool import SamplerCase, Tree, catalog_lists, make_large, order_lists, write_lines

MiB = 1 << 20
BLOCK = 4096
STALL = 60.0      # a reader waiting for copies gives up after this many seconds without a new one
SAMPLERS = (SamplerCase("random"), SamplerCase("distributed"))


@dataclass(frozen=True)
class Settings:
    files: int
    epochs: int
    size: int
    rate: float               # opens/s of the paced reader
    paced_seconds: float      # length of each paced phase
    threads: int              # reader threads of the full-speed phase
    large_count: int
    large_size: int
    limit: float              # wall-clock limit of one run, seconds
    plan_limit: float         # the same for `tiering plan`
    work: Path
    copy_rounds: int = 3      # stagings (each with a cp -r after it) onto the disk (case copies-small)


@dataclass
class Context:
    s: Settings
    tool: Path
    tree: Tree
    runs: Path                # this invocation's run directories
    shm: Path                 # private parent of the memory tiers

    def run_dir(self, name: str) -> Path:
        d = self.runs / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    @property
    def shared_cache(self) -> Path:
        return self.runs / "catalog-cache"


def _exe(name: str) -> str:
    """A console script of the package: next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"bench.scale: {name} not found; install the package (make install)")
    return found


def write_profile(path: Path, kind: str, tier_parent: Path, capacity: int) -> Path:
    tier_parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text("\n".join([
        f"name: scale-{path.stem}",
        "description: \"scale benchmark: one tier sized to the case\"",
        "tiers:",
        "  - name: tier0",
        f"    kind: {kind}",
        f"    path: {tier_parent}",
        f"    capacity: {capacity}",
        "    threads: 4",
        "pfs:",
        "  read_threads: 8",
    ]) + "\n")
    return path


def room(files: int, size: int) -> int:
    """Tier capacity that holds `files` files of `size` bytes with a quarter to
    spare: tiers count the blocks a copy takes (a 1 KiB file takes 4 KiB)."""
    return (files * -(-size // BLOCK) * BLOCK) * 5 // 4 + 64 * MiB


def fits_profile(ctx: Context, d: Path) -> tuple[Path, Path]:
    """A memory tier (a private directory in /dev/shm) that holds the data set."""
    parent = ctx.shm / d.name
    shutil.rmtree(parent, ignore_errors=True)
    return write_profile(d / "fits.yaml", "memory", parent, room(ctx.tree.files, ctx.tree.size)), parent


def half_profile(ctx: Context, d: Path) -> Path:
    """A memory tier that holds half of the data set's blocks: the planner
    evicts at nearly every position (its slow case)."""
    blocks = ctx.tree.files * -(-ctx.tree.size // BLOCK) * BLOCK
    return write_profile(d / "half.yaml", "memory", ctx.shm / d.name, blocks // 2)


def disk_profile(d: Path, tier_parent: Path, files: int, size: int) -> Path:
    """A file-system tier in the work directory (the file system cp writes to)."""
    return write_profile(d / "disk.yaml", "filesystem", tier_parent, room(files, size))


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stamp(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def tier_run(ctx: Context, d: Path, profile: Path, data: Path, cache: Path, options: list[str],
             command: list[str]) -> tuple[monitor.Finished, dict[str, Any] | None, bool]:
    """One monitored tier-run; its --stats-json; whether the catalog cache had
    an entry before it started."""
    cached = _has_cache(cache)
    cmd = [_exe("tier-run"), "--profile", str(profile), "--data", str(data), "--stats-json",
           str(d / "stats.json"), *options, "--", *command]
    env = _cache_env(cache)
    env.pop("TIERING_DISABLE", None)
    fin = monitor.run(cmd, d / "tier-run.log", ctx.s.limit, env)
    return fin, _load(d / "stats.json"), cached


def run_facts(fin: monitor.Finished, stats: dict[str, Any] | None, cached: bool,
              command_start: float | None, command_exit: float | None) -> dict[str, Any]:
    """What one tier-run measured, from the OS, COMMAND's stamps and --stats-json."""
    stats = stats or {}
    return {
        "command": fin.cmd, "status": fin.status, "killed": fin.killed, "seconds": fin.seconds,
        "catalog_cached": cached,
        "startup_s": None if command_start is None else command_start - fin.launched,
        "teardown_s": None if command_exit is None else fin.exited - command_exit,
        "peak_rss": fin.peak_rss, "cpu_s": fin.cpu, "tree_maxrss": fin.tree_maxrss, "tree_cpu_s": fin.tree_cpu,
        "stats_exit_code": stats.get("exit_code"), "files": stats.get("files"),
        "events": stats.get("events"), "events_dropped": stats.get("events_dropped"),
        "order": stats.get("order"), "placement": stats.get("placement"), "opens": stats.get("opens"),
        "stats_seconds": stats.get("seconds"),
    }


def _per_s(phase: dict[str, Any]) -> float | None:
    span = (phase.get("end") or 0) - (phase.get("start") or 0)
    return phase.get("files", 0) / span if span > 0 else None


def read_direct(ctx: Context, d: Path, listing: Path, src: Path, name: str = "direct",
                phases: list[str] | None = None) -> dict[str, Any]:
    """The reader with no tier-run, twice: the reference checksum and opens/s
    of the second pass, with the page cache warm (as for what follows).
    phases: the reader's phases (default: all of the list at full speed);
    opens_per_s is the first's, opens_only_per_s that of an `opens` phase."""
    out = d / f"{name}.json"
    args = [a for p in (phases or [f"full,{ctx.s.threads}"]) for a in ("-p", p)]
    for _ in range(2):
        fin = monitor.run([str(ctx.tool), "read", str(listing), str(out), str(src), *args],
                          d / f"{name}.log", ctx.s.limit)
    res = _load(out) or {}
    ran = res.get("phases") or [{}]
    opens = [p for p in ran if p.get("kind") == "opens"]
    return {"status": fin.status, "files": res.get("files"), "bytes": res.get("bytes"),
            "checksum": res.get("checksum"), "opens_per_s": _per_s(ran[0]),
            "opens_only_per_s": _per_s(opens[0]) if opens else None}


def reader_command(ctx: Context, listing: Path, out: Path, src: Path, phases: list[str]) -> list[str]:
    cmd = [str(ctx.tool), "read", str(listing), str(out), str(src)]
    for p in phases:
        cmd += ["-p", p]
    return cmd


# ---- start-up ----

def case_startup(ctx: Context) -> dict[str, Any]:
    """Start-up to COMMAND with a cold (private, empty) and a cached catalog,
    against `find DIR -type f | wc -l` (dentries warm for both)."""
    d = ctx.run_dir("startup")
    find, scans, names = [], [], []
    root = shlex.quote(str(ctx.tree.root))
    for k in range(2):      # side by side, each twice: the least of each
        find.append(monitor.timed_shell(f"find {ctx.tree.root} -type f | wc -l", d / f"find{k}.log", ctx.s.limit))
        names.append(monitor.timed_shell(f"{shlex.quote(sys.executable)} -c {shlex.quote(SCAN_NAMES_FIRST)} {root}",
                                         d / f"names{k}.log", ctx.s.limit))
        scans.append(monitor.timed_shell(f"{shlex.quote(sys.executable)} -c {shlex.quote(SCAN_ALONE)} {root}",
                                         d / f"scan{k}.log", ctx.s.limit))
    profile, parent = fits_profile(ctx, d)
    cache = d / "cache"
    runs: dict[str, Any] = {}
    sampler = SamplerCase("random")
    # cold-first-touch: a cold start-up with no order to compute before COMMAND (its own, empty cache)
    for label, epochs in (("cold", ctx.s.epochs), ("cached", ctx.s.epochs), ("cached-1-epoch", 1),
                          ("cold-first-touch", 0)):
        rd = ctx.run_dir(f"startup/{label}")
        stamp = rd / "stamp"
        options = sampler.tier_run_args(epochs) if epochs else ["--policy", "first-touch"]
        fin, stats, cached = tier_run(ctx, rd, profile, ctx.tree.root, cache if epochs else rd / "cache", options,
                                      [str(ctx.tool), "stamp", str(stamp)])
        t = _stamp(stamp)
        runs[label] = {"epochs": epochs, **run_facts(fin, stats, cached, t, t)}
        if label == "cold":   # a COMMAND that exits at once may leave the cache to a child (NOTE [names first])
            runs[label]["cache_wait_s"] = _wait_for_cache(cache, ctx.s.limit)
    shutil.rmtree(parent, ignore_errors=True)
    return {"find_s": min(f[0] for f in find), "find_count": int(find[0][1] or -1) if find[0][2] else None,
            "scan_s": min(t[0] for t in scans) if all(t[2] for t in scans) else None,
            "scan_count": int(scans[0][1] or -1) if scans[0][2] else None,
            "names_first_s": min(t[0] for t in names) if all(t[2] for t in names) else None,
            "names_first_count": int(names[0][1] or -1) if names[0][2] else None, "runs": runs}


def _cache_env(cache: Path) -> dict[str, str]:
    """The environment of a tiering command whose catalog cache is `cache`."""
    return dict(os.environ, XDG_CACHE_HOME=str(cache))


def _has_cache(cache: Path) -> bool:
    """A catalog cache under its name (not a writer's temporary, .tmp-*)."""
    return cache.is_dir() and any(not p.name.startswith(".") for p in cache.rglob("*.npz"))


def _wait_for_cache(cache: Path, limit: float) -> float | None:
    """Seconds until the catalog cache exists (None: not within limit)."""
    t0 = time.monotonic()
    while not _has_cache(cache):
        if time.monotonic() - t0 > limit:
            return None
        time.sleep(0.1)
    return time.monotonic() - t0


# the cold scan alone, in a process of its own as find is: no cache, the catalog's file count; with
# every stat, and names first (what tier-run does before COMMAND: NOTE [names first])
SCAN_ALONE = "import sys; from tiering.catalog import scan; print(len(scan([sys.argv[1]]).files))"
SCAN_NAMES_FIRST = ("import sys; from tiering.catalog import scan; "
                    "print(len(scan([sys.argv[1]], names_first=True).files))")


# ---- plan ----

def cache_catalog(ctx: Context, d: Path, profile: Path) -> float:
    """The catalog cached (`tiering plan` of one epoch, not measured), as
    tier-run's start-up case leaves it: a case that measures a cached start
    also measures it when run alone (--only).  Its seconds."""
    return monitor.run([_exe("tiering"), "plan", "--profile", str(profile), "--data", str(ctx.tree.root),
                        *SAMPLERS[0].tier_run_args(1), "--json"], d / "warm.json", ctx.s.plan_limit,
                       _cache_env(ctx.shared_cache)).seconds


def case_plan(ctx: Context) -> dict[str, Any]:
    """`tiering plan` for all epochs, per sampler, on a tier that holds the
    data set and on one that holds half of it (keys NAME and NAME-half): wall
    time, peak RSS and CPU of the process (wait4), and the prediction's shape."""
    d = ctx.run_dir("plan")
    fits, parent = fits_profile(ctx, d)
    half = half_profile(ctx, d)
    env = _cache_env(ctx.shared_cache)
    out: dict[str, Any] = {"catalog_warm_seconds": cache_catalog(ctx, d, fits)}
    for suffix, profile, sc in [("", fits, sc) for sc in SAMPLERS] + [("-half", half, sc) for sc in SAMPLERS]:
        log = d / f"{sc.name}{suffix}.json"
        fin = monitor.run([_exe("tiering"), "plan", "--profile", str(profile), "--data", str(ctx.tree.root),
                           *sc.tier_run_args(ctx.s.epochs), "--json"], log, ctx.s.plan_limit, env)
        plan = _load(log) or {}
        epochs = plan.get("epochs") or []
        out[sc.name + suffix] = {"command": fin.cmd, "status": fin.status, "killed": fin.killed, "seconds": fin.seconds,
                        "maxrss": fin.tree_maxrss or None, "peak_rss_polled": fin.peak_rss, "cpu_s": fin.tree_cpu,
                        "files": plan.get("files"), "epochs": len(epochs),
                        "accesses": sorted({e.get("accesses") for e in epochs}) if epochs else [],
                        "pfs_bytes": sum(e.get("pfs_bytes") or 0 for e in epochs)}
    shutil.rmtree(parent, ignore_errors=True)
    return out


# ---- the clairvoyant runs: RSS, daemon CPU, events, teardown ----

LEAD_BUILT_S = 5.0   # seconds of the prefetching phase left out of its steady figure


def dropped_during(series: dict[str, Any], t0: float, t1: float, final: int | None = None) -> int | None:
    """Events the ring lost between t0 and t1 (seconds since COMMAND
    started), from tier-run's time series (a sample a second): the count at
    the first sample at or after t1 (or, when the job ended before the next
    sample, its count at the end, `final`) less the count at the last sample
    at or before t0.  The second around each end counts for both sides: a
    drop is never put in the phase next to it.  None without the column (a
    tier-run before it) or without a count after t1."""
    t, col = series.get("t") or [], series.get("events_dropped")
    if not col or len(col) != len(t):
        return None
    after = [c for x, c in zip(t, col) if x >= t1] or ([] if final is None else [final])
    if not after:
        return None
    before = [c for x, c in zip(t, col) if x <= t0]
    return int(after[0] - (before[-1] if before else 0))


def case_clairvoyant(ctx: Context, sc: SamplerCase) -> dict[str, Any]:
    """tier-run --sampler for all epochs on a tier that holds the data set;
    COMMAND reads the first two epochs in the sampler's order: paced while the
    daemon prefetches, then (every copy of the two epochs made) paced again,
    then at full speed with `threads` threads."""
    d = ctx.run_dir(f"clairvoyant-{sc.name}")
    # two epochs read; with the random sampler, then the next epoch opened and closed only (its
    # files are those of the first two, in the tiers by then; a distributed rank's next epochs
    # read files its first two did not, which are copied only as the reader comes near them)
    more = 1 if sc.name == "random" and ctx.s.epochs > 2 else 0
    listing, waitlist, n, listed = order_lists(ctx.tree, sc, 2, d, more)
    opens = [f"opens,{ctx.s.threads}"] if more else []
    direct = read_direct(ctx, d, listing, ctx.tree.root, phases=[f"full,{ctx.s.threads},{n}", *opens])
    profile, parent = fits_profile(ctx, d)
    # a cold start scans and writes the catalog cache while COMMAND runs (NOTE [names first]): not this case's
    catalog_warmed = None if _has_cache(ctx.shared_cache) else cache_catalog(ctx, d, profile)
    out = d / "reader.json"
    # each paced phase reads at most a quarter of the two epochs, so that the full-speed one has its share
    pace = f"paced,{ctx.s.rate:g},{min(ctx.s.paced_seconds, n / 4 / ctx.s.rate):g}"
    cmd = reader_command(ctx, listing, out, ctx.tree.root,
                         [pace, f"wait,{waitlist},{parent},{STALL:g}", pace, f"full,{ctx.s.threads},{n}", *opens])
    fin, stats, cached = tier_run(ctx, d, profile, ctx.tree.root, ctx.shared_cache,
                                  sc.tier_run_args(ctx.s.epochs), cmd)
    shutil.rmtree(parent, ignore_errors=True)
    res = _load(out) or {}
    facts = run_facts(fin, stats, cached, res.get("start"), res.get("exit"))
    phases = res.get("phases") or []
    named = dict(zip(("prefetching", "wait", "fits", "full", "opens"), phases))
    for key in ("prefetching", "fits", "full", "opens"):
        ph = named.get(key)
        if ph:
            ph["opens_per_s"] = _per_s(ph)
            ph["daemon_core_share"] = fin.core_share(ph["start"], ph["end"])
            ph["peak_rss_at_end"] = fin.peak_rss_until(ph["end"])   # which phase the peak came in
            if key in ("full", "opens") and stats and res.get("start"):
                ph["events_dropped"] = dropped_during(stats.get("series") or {}, ph["start"] - res["start"],
                                                      ph["end"] - res["start"], stats.get("events_dropped"))
    pre = named.get("prefetching")
    if pre and pre["end"] - pre["start"] > 2 * LEAD_BUILT_S:
        # the same after the lead was built at full speed (the rate of the reader not known yet)
        pre["steady_core_share"] = fin.core_share(pre["start"] + LEAD_BUILT_S, pre["end"])
    with waitlist.open() as f:
        wait_files = sum(1 for _ in f)
    return {"sampler": sc.__dict__, "listed": listed, "read_listed": n, "wait_files": wait_files, "direct": direct,
            "catalog_warmed_seconds": catalog_warmed,
            "reader": res,
            "phases": named,
            "checksum_equal": res.get("checksum") is not None and res.get("checksum") == direct["checksum"],
            **facts}


# ---- copies ----

def settle(warm: Callable[[], object]) -> bool:
    """Before a timed copy: written data to the device, and (as root) the
    kernel's dentries and inodes dropped, then `warm` run (it reads the
    source again: the pages of an inode dropped go with it).  A copy of
    1.28 M files and its removal leave as many negative dentries in the
    dentry hash (removed names, kept on ext4), and every later lookup walks
    longer chains: without this, each copy of a case ran slower than the one
    before it (cp -r 28.8 k files/s before the staging, 8.7 k after, in one
    run on disk).  True when the caches were dropped."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
        dropped = True
    except OSError:   # not root: the copies run in whatever state the one before left
        dropped = False
    if dropped:
        warm()
    return dropped


def _copy_reference(script: str, d: Path, dst: Path, name: str, limit: float,
                    warm: Callable[[], object]) -> dict[str, Any]:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    settled = settle(warm)
    seconds, _, ok = monitor.timed_shell(script, d / f"{name}.log", limit)
    files = subprocess.run(["bash", "-c", f"find {dst} -type f | wc -l"], capture_output=True, text=True).stdout
    byte_count = subprocess.run(["du", "-sb", "--apparent-size", str(dst)], capture_output=True, text=True).stdout
    return {"script": script, "ok": ok, "seconds": seconds, "files": int(files or -1),
            "bytes_apparent": int(byte_count.split()[0]) if byte_count else None, "caches_dropped": settled}


def _copies(ctx: Context, d: Path, src: Path, files: int, data_bytes: int, listing: Path,
            rels: Path, ram: bool = False, dst: Path | None = None, rounds: int = 1) -> dict[str, Any]:
    """cp -r, tar | tar and tier-run --policy stage from src into the same file
    system (`dst`, default the work directory; with `ram`, a private directory
    in /dev/shm and a memory tier there), the page cache warm with src for all
    three.  Staging is timed from COMMAND's start until every file's copy is
    served (COMMAND asks the shim, in catalog order, the order stage copies
    in); then COMMAND reads every file through the shim.  cp -r runs again
    after each staging: a device that is faster or slower from one minute to
    the next shows as two rates of cp, which bracket the staging's.  With
    `rounds` > 1 the staging and the cp -r after it run again (keys
    `stage`, `cp_after` of the first round, `more_rounds` of the others):
    each staging is compared with the two cp -r next to it."""
    if dst is None:
        dst = Path(tempfile.mkdtemp(prefix="tiering-scale-copies-", dir="/dev/shm")) if ram else ctx.s.work / "copies"
    direct = read_direct(ctx, d, listing, src)

    def warm() -> None:   # the source read again after the caches were dropped (settle)
        monitor.run(reader_command(ctx, listing, d / "warm.json", src, [f"full,{ctx.s.threads}"]),
                    d / "warm.log", ctx.s.limit)

    refs = {
        "cp": _copy_reference(f"cp -r {src} {dst}/tree", d, dst, "cp", ctx.s.limit, warm),
        "tar": _copy_reference(f"mkdir {dst}/tree && tar -C {src} -cf - . | tar -C {dst}/tree -xf -",
                               d, dst, "tar", ctx.s.limit, warm),
    }
    shutil.rmtree(dst, ignore_errors=True)
    done: list[dict[str, Any]] = []
    for k in range(rounds):
        rd = d if k == 0 else d / f"round-{k + 1}"
        rd.mkdir(exist_ok=True)
        stage = _stage(ctx, rd, src, dst, files, data_bytes, listing, rels, ram, direct, warm)
        shutil.rmtree(dst, ignore_errors=True)
        after = _copy_reference(f"cp -r {src} {dst}/tree", rd, dst, "cp-after", ctx.s.limit, warm)
        shutil.rmtree(dst, ignore_errors=True)
        done.append({"stage": stage, "cp_after": after})
    for r, key in [*((r, "seconds") for r in [*refs.values(), *(x["cp_after"] for x in done)]),
                   *((x["stage"], "copy_seconds") for x in done)]:
        ok = r[key] is not None and r[key] > 0
        r["files_per_s"] = files / r[key] if ok else None
        r["mb_per_s"] = data_bytes / 1e6 / r[key] if ok else None
    return {"files": files, "bytes": data_bytes, "direct": direct, **refs, **done[0], "more_rounds": done[1:]}


def _stage(ctx: Context, d: Path, src: Path, dst: Path, files: int, data_bytes: int, listing: Path, rels: Path,
           ram: bool, direct: dict[str, Any], warm: Callable[[], object]) -> dict[str, Any]:
    """One tier-run --policy stage of _copies, its tier in dst/tier."""
    tier = dst / "tier"
    profile = (write_profile(d / "ram.yaml", "memory", tier, room(files, data_bytes // files)) if ram
               else disk_profile(d, tier, files, data_bytes // files))
    settled = settle(warm)
    out = d / "reader.json"
    cmd = reader_command(ctx, listing, out, src, [f"wait,{rels},{tier},{STALL:g}", f"full,{ctx.s.threads}"])
    fin, stats, cached = tier_run(ctx, d, profile, src, d / "cache", ["--policy", "stage"], cmd)
    res = _load(out) or {}
    phases = res.get("phases") or []
    wait, verify = (phases + [{}, {}])[:2]
    complete = wait.get("waited") == files
    seconds = wait["end"] - res["start"] if complete and res.get("start") else None
    return {**run_facts(fin, stats, cached, res.get("start"), res.get("exit")),
            "copy_seconds": seconds, "waited": wait.get("waited"), "verify": verify, "caches_dropped": settled,
            "checksum_equal": res.get("checksum") is not None and res.get("checksum") == direct["checksum"]}


def case_copies_small(ctx: Context) -> dict[str, Any]:
    """The small files onto a disk tier in the work directory, in
    `copy_rounds` rounds: a virtual disk's rate moves several times over
    from one minute to the next (cp -r of the same tree at 1.6 k and at
    30 k files/s in one run), so one staging between two cp -r resolves
    little; the verdict is on the rounds' median (bench/scale/report.py)."""
    d = ctx.run_dir("copies-small")
    listing, rels = catalog_lists(ctx.tree, d)
    return _copies(ctx, d, ctx.tree.root, ctx.tree.files, ctx.tree.bytes, listing, rels, rounds=ctx.s.copy_rounds)


def case_copies_small_ram(ctx: Context) -> dict[str, Any]:
    """The small files onto a memory tier in /dev/shm, cp -r and tar into /dev/shm."""
    d = ctx.run_dir("copies-small-ram")
    listing, rels = catalog_lists(ctx.tree, d)
    return _copies(ctx, d, ctx.tree.root, ctx.tree.files, ctx.tree.bytes, listing, rels, ram=True)


def case_copies_small_ext4(ctx: Context) -> dict[str, Any]:
    """The small files onto a file-system tier on ext4 in memory (a loop device
    whose image is in /dev/shm), cp -r and tar onto the same ext4: what ext4
    itself costs each way, without a device's noise (bench/ext4mem.py)."""
    d = ctx.run_dir("copies-small-ext4")
    why = ext4mem.unavailable()
    if why:
        return {"files": ctx.tree.files, "error": why}
    listing, rels = catalog_lists(ctx.tree, d)
    with ext4mem.ext4_in_memory(d / "ext4", ctx.tree.files, ctx.tree.size) as mnt:
        return _copies(ctx, d, ctx.tree.root, ctx.tree.files, ctx.tree.bytes, listing, rels, dst=mnt / "copies")


def case_copies_large(ctx: Context) -> dict[str, Any]:
    d = ctx.run_dir("copies-large")
    src = make_large(ctx.tool, ctx.s.work, ctx.s.large_count, ctx.s.large_size, seed=1)
    names = [f"big-{k}.bin" for k in range(ctx.s.large_count)]
    listing = write_lines(d / "all.txt", [str(src / n) for n in names])
    waitlist = write_lines(d / "wait.txt", names)
    return _copies(ctx, d, src, ctx.s.large_count, ctx.s.large_count * ctx.s.large_size, listing, waitlist)


CASES = {
    "startup": case_startup,
    "plan": case_plan,
    "clairvoyant-random": lambda ctx: case_clairvoyant(ctx, SAMPLERS[0]),
    "clairvoyant-distributed": lambda ctx: case_clairvoyant(ctx, SAMPLERS[1]),
    "copies-small": case_copies_small,
    "copies-small-ram": case_copies_small_ram,
    "copies-small-ext4": case_copies_small_ext4,
    "copies-large": case_copies_large,
}


def run_case(ctx: Context, name: str) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        res = CASES[name](ctx)
    except Exception as e:  # a broken case is recorded, the others still run
        res = {"error": f"{type(e).__name__}: {e}"}
    res["case_seconds"] = time.monotonic() - t0
    return res
