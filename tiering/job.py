"""One tier-run job: private directories, the index, the daemon, COMMAND.

Set-up errors in what the user asked for (bad profile, missing data root,
unknown command) stop before COMMAND runs, with a message that says what to
fix.  Problems of the cache itself (a tier that cannot be created, a copy that
fails) never stop the job: COMMAND then simply reads more from the PFS.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import catalog as catalog_mod
from .clairvoyant.feeds import HookFeed, ListFeed
from .clairvoyant.options import OrderOptions, StreamError, is_python_command, list_feed
from .clairvoyant.policy import Clairvoyant
from .clairvoyant.samplers import OrderError
from .placement.api import Policy
from .placement.daemon import Daemon
from .placement.index import Root, SharedIndex, library_path
from .placement.policies import POLICIES as SIMPLE_POLICIES
from .placement.tiers import TierState
from .profile import Profile
from .report import JobRecord, summary_text, to_json
from .rundirs import current_user, index_parent, make_private_dir, remove_tree, sweep_leftovers
from .units import human_bytes

log = logging.getLogger("tiering")

SHIM_NAME = "libtiershim.so"
HOOK_DIR = Path(__file__).resolve().parent / "hook"
POLICY_NAMES = sorted([*SIMPLE_POLICIES, Clairvoyant.name])
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)


class JobError(Exception):
    """A problem with what the user asked for; the message says what to do."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class JobOptions:
    data: list[str]
    command: list[str]
    profile: Profile
    policy: str | None = None           # None: clairvoyant when the order is known or hooked, else first-touch
    order: OrderOptions = field(default_factory=OrderOptions)
    hook: bool | None = None            # None: on for Python commands
    window: int = 64                    # clairvoyant: positions fetched ahead of the reader
    scan_cache: Path | None = field(default_factory=catalog_mod.default_cache_dir)
    stats_json: Path | None = None
    keep: bool = False
    verbose: int = 0
    scan_threads: int = 16


@dataclass
class Job:
    opts: JobOptions
    user: str = field(default_factory=current_user)
    run_dir: Path | None = None        # private dir holding the index
    tiers: list[TierState] = field(default_factory=list)
    index: SharedIndex | None = None
    daemon: Daemon | None = None
    catalog: catalog_mod.Catalog | None = None
    policy: str = "first-touch"         # the one in force
    hooked: bool = False                # the order hook is injected into COMMAND
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def order_dir(self) -> Path | None:
        return self.run_dir / "orders" if self.run_dir is not None and self.hooked else None


# -- environment of COMMAND ------------------------------------------------------

def child_environment(env: dict[str, str], index_path: Path | None, lib: Path,
                      shim_debug: bool, order_dir: Path | None = None) -> dict[str, str]:
    """COMMAND's environment: our shim appended to LD_PRELOAD (replacing the
    shim of an outer tier-run, so nothing is interposed twice)."""
    out = dict(env)
    kept = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split()
            if os.path.basename(p) != SHIM_NAME]
    if index_path is None:
        out["LD_PRELOAD"] = " ".join(kept)
        out.pop("TIERING_INDEX", None)
        if not kept:
            out.pop("LD_PRELOAD")
        return out
    out["LD_PRELOAD"] = " ".join(kept + [str(lib)])
    out["TIERING_INDEX"] = str(index_path)
    if shim_debug:
        out["TIERING_DEBUG"] = "1"
    if order_dir is not None:
        # the hook's sitecustomize goes first; it runs the one it shadows
        paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HOOK_DIR)]
        out["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR)] + paths)
        out["TIERING_ORDER_DIR"] = str(order_dir)
    else:
        out.pop("TIERING_ORDER_DIR", None)
    return out


def resolve_command(command: list[str]) -> str:
    if not command:
        raise JobError("no COMMAND given; usage: tier-run --data DIR -- COMMAND [ARGS...]")
    exe = shutil.which(command[0])
    if exe is None:
        if os.sep in command[0] and os.path.exists(command[0]):
            raise JobError(f"COMMAND {command[0]!r} is not executable (chmod +x it, or run it "
                           f"through its interpreter, e.g. `python {command[0]}`)", 126)
        raise JobError(f"COMMAND {command[0]!r} not found on PATH; check the spelling or give its full path", 127)
    return exe


# -- set-up --------------------------------------------------------------------

def setup(job: Job) -> None:
    opts = job.opts
    sweep_leftovers([index_parent()] + [t.path for t in opts.profile.tiers], job.user)
    t0 = time.monotonic()
    try:
        job.catalog = catalog_mod.scan(opts.data, threads=opts.scan_threads, cache_dir=opts.scan_cache)
    except catalog_mod.CatalogError as e:
        raise JobError(str(e)) from None
    job.timings["scan"] = time.monotonic() - t0
    feed = _choose_policy(job)
    for t in opts.profile.tiers:
        try:
            job.tiers.append(TierState(t.name, t.kind, make_private_dir(t.path, job.user), t.capacity, t.threads))
        except OSError as e:
            log.warning("tier %s at %s cannot be used (%s); continuing without it", t.name, t.path, e)
    cat = job.catalog
    # a symlinked root is matched by its real path too (same id)
    roots = [Root(prefix, i, cat.dir_links[i]) for prefix, i in catalog_mod.RootMap(cat.roots).prefixes]
    try:
        job.run_dir = make_private_dir(index_parent(), job.user)
    except OSError as e:
        raise JobError(f"cannot make the index directory: {e}") from None
    job.index, slots = SharedIndex.for_catalog(job.run_dir / "index", roots, [str(t.data) for t in job.tiers], cat)
    if job.hooked:
        (job.run_dir / "orders").mkdir(mode=0o700)
        feed = HookFeed(job.run_dir / "orders", cat)

    def make_policy(d: Daemon) -> Policy:
        if job.policy == Clairvoyant.name:
            return Clairvoyant(d, feed, window=opts.window)
        return SIMPLE_POLICIES[job.policy](d)

    job.daemon = Daemon(job.index, cat, slots, job.tiers, opts.profile.pfs.read_threads, make_policy)


def _choose_policy(job: Job) -> ListFeed | HookFeed | None:
    """The policy in force and, for clairvoyant, a feed known before COMMAND runs."""
    opts = job.opts
    assert job.catalog is not None
    job.hooked = (opts.hook if opts.hook is not None else is_python_command(opts.command)) \
        and not opts.order.given and opts.policy in (None, "clairvoyant")
    if opts.policy is not None and opts.policy != "clairvoyant" and opts.order.given:
        raise JobError(f"--policy {opts.policy} does not use an order; drop --sampler/--order-file "
                       "or use --policy clairvoyant")
    if opts.order.given:
        job.policy = "clairvoyant"
        try:
            return list_feed(opts.order, job.catalog)
        except (StreamError, catalog_mod.CatalogError, OrderError) as e:
            raise JobError(str(e)) from None
    if opts.policy == "clairvoyant" and not job.hooked:
        raise JobError("--policy clairvoyant needs the order the training reads in: give --sampler "
                       "(with --seed, --epochs) or --order-file, or run a Python command so that "
                       "the order hook can take it from the DataLoader (--hook)")
    job.policy = "clairvoyant" if job.hooked else (opts.policy or "first-touch")
    return None


def cleanup(job: Job) -> None:
    if job.index is not None:
        job.index.set_disabled(True)  # processes COMMAND left behind stop using the tiers
    d, cat = job.daemon, job.catalog
    if d is not None and cat is not None and cat.from_cache and d.stats.changed_sources and job.opts.scan_cache:
        catalog_mod.drop_cache(job.opts.scan_cache, cat.roots)  # rescan next time
    if job.opts.keep:
        return
    if job.index is not None:
        job.index.close()
        job.index = None
    for t in job.tiers:
        remove_tree(t.root)
    if job.run_dir is not None:
        remove_tree(job.run_dir)


# -- running COMMAND -----------------------------------------------------------

def _ignored() -> set[int]:
    """Signals tier-run was started with set to ignore (nohup...): COMMAND
    inherits that, and they are not forwarded."""
    return {s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN}


def _wait(child: int, status_every: float, on_status: Any, ignored: set[int]) -> int:
    """Waits for COMMAND, forwarding signals that were not also sent to it by
    the terminal (those arrive from the kernel, si_pid 0) or by itself."""
    watched = set(FORWARDED) | {signal.SIGCHLD}
    last = time.monotonic()
    while True:
        info = signal.sigtimedwait(watched, 1.0)
        if info is not None and info.si_signo != signal.SIGCHLD:
            if info.si_pid not in (0, child) and info.si_signo not in ignored:
                try:
                    os.kill(child, info.si_signo)
                except ProcessLookupError:
                    pass
            continue
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return os.waitstatus_to_exitcode(status)
        if status_every and time.monotonic() - last >= status_every:
            last = time.monotonic()
            on_status()


def run(job: Job) -> int:
    """Runs the whole job; returns COMMAND's exit status (128+N for signal N)."""
    opts = job.opts
    resolve_command(opts.command)
    t_start = time.monotonic()
    old_mask: set[int] | None = None
    try:
        setup(job)
        # from here on signals are taken with sigtimedwait and forwarded
        ignored = _ignored()
        old_mask = set(signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED) | {signal.SIGCHLD}))
        if job.daemon is not None:
            job.daemon.start()  # its threads inherit the blocked signal mask
        env = child_environment(dict(os.environ), job.index.path if job.index else None,
                                library_path(), opts.verbose >= 2, job.order_dir)
        t0 = time.monotonic()
        try:
            child = os.posix_spawnp(opts.command[0], opts.command, env,
                                    setsigmask=set(),
                                    # Python ignores SIGPIPE and SIGXFSZ; COMMAND gets the defaults
                                    setsigdef=(set(FORWARDED) - ignored) | {signal.SIGCHLD, signal.SIGPIPE,
                                                                            signal.SIGXFSZ})
        except OSError as e:
            raise JobError(f"cannot start COMMAND {opts.command[0]!r}: {e.strerror}",
                           126 if e.errno in (13, 8) else 127) from None
        exit_code = _wait(child, 5.0 if opts.verbose else 0.0, lambda: _print_status(job), ignored)
        exit_code = exit_code if exit_code >= 0 else 128 - exit_code
        job.timings["command"] = time.monotonic() - t0
        if job.daemon is not None:
            job.daemon.stop()
        job.timings["total"] = time.monotonic() - t_start
        stats = to_json(_record(job, exit_code))
        print(summary_text(stats), file=sys.stderr)
        if opts.stats_json:
            opts.stats_json.write_text(json.dumps(stats, indent=2) + "\n")
        if opts.keep and job.run_dir:
            print(f"tiering: --keep: index {job.run_dir}, tiers "
                  + ", ".join(str(t.root) for t in job.tiers), file=sys.stderr)
        return exit_code
    finally:
        if job.daemon is not None and not job.daemon.stopping:
            job.daemon.stop()
        cleanup(job)
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _record(job: Job, exit_code: int) -> JobRecord:
    cat, d = job.catalog, job.daemon
    assert cat is not None
    r = JobRecord(job.policy, exit_code, job.opts.command, job.opts.profile.name, cat.roots, len(cat.files),
                  cat.total_bytes, seconds=job.timings)
    if job.index is not None:
        r.counters = job.index.counters()
    if d is not None:
        r.tiers, r.daemon, r.abandoned, r.order = d.tier_summary(), d.stats, d.stuck, d.policy.report()
    return r


def _print_status(job: Job) -> None:
    if job.index is None or job.daemon is None:
        return
    c = job.index.counters()
    placed = sum(t.files for t in job.tiers)
    placed_bytes = sum(t.placed_bytes for t in job.tiers)
    print(f"tiering: {placed} files ({human_bytes(placed_bytes)}) placed; "
          f"{c['opens']} opens, {c['opens'] - c['opens_pfs']} from tiers", file=sys.stderr)
