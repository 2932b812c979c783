"""One tier-run job: private directories, the index, the daemon, COMMAND.

Set-up errors in what the user asked for (bad profile, missing data root,
unknown command) stop before COMMAND runs, with a message that says what to
fix.  Problems of the cache itself (a tier that cannot be created, a copy that
fails) never stop the job: COMMAND then simply reads more from the PFS.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import catalog as catalog_mod
from .clairvoyant.feeds import HookFeed, HookWatch, ListFeed
from .clairvoyant.options import OrderOptions, StreamError, hook_blocker, is_python_command, list_feed
from .clairvoyant.policy import Clairvoyant
from .clairvoyant.samplers import OrderError
from .clairvoyant.warm import WarmResult, few_large_files, fits_whole, warm_up
from .cluster.identity import SINGLE, NodeIdentity
from .cluster.rendezvous import DEFAULT_RENDEZVOUS_TIMEOUT
from .command import (
    CommandError,
    SetupWatch,
    as_plain_child,
    block_signals,
    ignored_at_start,
    resolve_command,
    restore_signals,
    spawn,
    wait_forwarding,
)
from .console import say
from .fill import SizeFill
from .observe.live import Display, JobInfo, JobWatch, fits_bytes
from .placement.api import Policy, allocation, allocations
from .placement.daemon import Daemon, DaemonSnapshot
from .placement.index import Root, SharedIndex
from .placement.policies import POLICIES as SIMPLE_POLICIES
from .placement.tiers import TierState
from .profile import Network, Profile, data_root_problems
from .report import JobRecord, stats_path_problem, summary_text, to_json, write_stats
from .rundirs import (
    current_user,
    index_parent,
    make_private_dir,
    own_unheld,
    relation,
    remove_in_background,
    remove_tree,
    sweep_leftovers,
)
from .shimlib import library_path
from .units import human_bytes

if TYPE_CHECKING:   # grpc is imported only by jobs that span nodes
    from .cluster.peering import PeerTier

log = logging.getLogger("tiering")

SHIM_NAME = "libtiershim.so"
HOOK_DIR = Path(__file__).resolve().parent / "hook"
POLICY_NAMES = sorted([*SIMPLE_POLICIES, Clairvoyant.name])
ORDER_HINT = ("to prefetch in the training's order, give the order explicitly: --sampler random --seed N "
              "--epochs E (N: the seed of the DataLoader's generator; --sampler distributed for a "
              "DistributedSampler) or --order-file FILE")


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
    warm: int | None = None             # --warm PERCENT: fill the tiers before COMMAND starts
    auto_warm: bool = True              # ... and without it, a data set of a few large files (--no-warm: not)
    display: Display = field(default_factory=lambda: Display("plain", 10.0))   # progress on stderr
    node: NodeIdentity = SINGLE         # this node in its job (NOTE [node identity])
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT


@dataclass
class Job:
    opts: JobOptions
    user: str = field(default_factory=current_user)
    run_dir: Path | None = None        # private dir holding the index
    tiers: list[TierState] = field(default_factory=list)
    index: SharedIndex | None = None
    daemon: Daemon | None = None
    catalog: catalog_mod.Catalog | None = None
    policy: str = "first-touch"         # the one asked for (or chosen by default)
    hooked: bool = False                # the order hook is injected into COMMAND
    hook_watch: HookWatch | None = None
    no_order: str | None = None         # why no order can come (the hook is missing, did not start)
    timings: dict[str, float] = field(default_factory=dict)
    watch: JobWatch | None = None       # progress, status file, time series
    warm_order: np.ndarray | None = None   # the first epoch, when known before COMMAND (--warm)
    warm_percent: int | None = None     # the warm-up's: --warm's, or 100 for a few large files that fit
    few_large: bool = False             # the data set is a few large files (NOTE [few large files])
    warmed: WarmResult | None = None
    peer: PeerTier | None = None        # the peer tier of a job that spans several nodes
    cache_writer: int | None = None     # pid of the child writing the catalog cache (NOTE [cache written aside])
    # stops tier-run's threads for a block (the set-up's signal watcher, around the cache writer's fork)
    threads_paused: Callable[[], AbstractContextManager[None]] = nullcontext
    feed: ListFeed | HookFeed | None = None   # the clairvoyant policy's, known before COMMAND
    slots: np.ndarray | None = None     # each catalogued file's slot in the index
    fill: SizeFill | None = None        # the sizes of a catalog scanned names first (NOTE [names first])
    info: JobInfo | None = None         # for the watch, once the sizes are known

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


# -- set-up --------------------------------------------------------------------

CACHE_WRITER_WAIT = 10.0   # seconds the teardown waits for the catalog cache writer
CACHE_WRITER_OUTPUT = "cache-writer.out"   # in the run directory: what the writer says (said at the end)
FILL_GRACE = 2.0           # seconds the teardown lets the sizes be read (for the report; then a child does it)


MMAP_THRESHOLD = 4 << 20     # bytes: malloc serves blocks this large or larger by mmap (NOTE [malloc])
M_MMAP_THRESHOLD = -3        # glibc's malloc.h
M_TRIM_THRESHOLD = -1


def map_large_blocks() -> None:
    """glibc's malloc, in this process: every block of MMAP_THRESHOLD or
    more gets a mapping of its own, returned to the OS when freed (NOTE
    [malloc] in docs/design.md).  Without it, glibc raises its threshold
    to the size of each large block freed (up to 32 MiB), and the arrays of
    a million files made after the scan's temporaries land in malloc's heaps
    among small objects, where freed pages stay resident: a cold start-up at
    1.28 M files kept about 120 MiB more than a cached one.  The trim
    threshold is set as glibc's dynamic rule would (twice the mmap
    threshold): a fixed mmap threshold leaves it at 128 KiB, and every 1 MiB
    buffer freed at the top of a heap would shrink it, to be faulted in
    again at the next use.  Nothing happens elsewhere than glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def give_back_freed_memory() -> None:
    """Returns the free pages of malloc's heaps to the OS (glibc's
    malloc_trim), once the start-up's large temporaries are freed (the
    index's sources, the scan's and the orders' temporaries; NOTE [catalog
    arrays]).  Blocks under MMAP_THRESHOLD (the job's repeated buffers of
    1 MiB: copy and peer chunks, gRPC messages) stay in the heap, where one
    costs no mmap, page faults and munmap each.  Nothing happens elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def names_first(opts: JobOptions) -> bool:
    """Whether a cold scan may leave the stats to the time after COMMAND
    started (NOTE [names first]; why a full scan before COMMAND cannot be
    quick enough: NOTE [scan before COMMAND]): not for --warm, --policy stage
    (their copies start before COMMAND), nor a job that spans nodes."""
    return opts.warm is None and opts.policy != "stage" and not opts.node.multi_node


def setup(job: Job, names_first: bool = False) -> None:
    """Everything before COMMAND: the scan, the tiers, the index, the policy,
    the daemon (not started); with names_first, a cold scan gives names only
    and the daemon is made once the sizes are read (job.fill, started with
    COMMAND)."""
    opts = job.opts
    sweep_leftovers([index_parent()] + [t.path for t in opts.profile.tiers], job.user, opts.data)
    try:
        job.run_dir = make_private_dir(index_parent(), job.user)
    except OSError as e:
        raise JobError(f"cannot make the index directory: {e}") from None
    t0 = time.monotonic()
    watch = job.watch = JobWatch(opts.display)
    watch.scanning_in(job.run_dir, {"job": job.run_dir.name, "pid": os.getpid(), "user": job.user,
                                    "command": opts.command, "data": opts.data, "policy": opts.policy or "default"})
    def save(saves: list[catalog_mod.PendingSave]) -> None:
        assert job.run_dir is not None
        with job.threads_paused():   # COMMAND does not wait for the cache
            job.cache_writer = catalog_mod.save_in_child(saves, partial(as_plain_child, ignored_at_start()),
                                                         job.run_dir / CACHE_WRITER_OUTPUT)

    try:
        job.catalog = catalog_mod.scan(opts.data, threads=opts.scan_threads, cache_dir=opts.scan_cache,
                                       progress=watch.on_scan, save=save, names_first=names_first)
    except catalog_mod.CatalogError as e:
        raise JobError(str(e)) from None
    finally:
        watch.close_bar()     # also when a signal interrupts the scan
    job.timings["scan"] = time.monotonic() - t0
    cat = job.catalog
    watch.scan_done(len(cat.files), cat.total_bytes, len(cat.dirs), job.timings["scan"], cat.from_cache,
                    sizes_later=cat.deferred is not None)
    if not cat.files:
        log.warning("the data set is empty: no regular file under %s; nothing will be placed (check --data)",
                    ", ".join(cat.roots))
    # the index first, then the order: the catalog's columns only the index
    # needs are let go before the first epoch (and torch, if imported) take their memory
    # (NOTE [catalog arrays])
    for t in opts.profile.tiers:
        try:
            job.tiers.append(TierState(t.name, t.kind, make_private_dir(t.path, job.user), t.capacity, t.threads,
                                       chunked_bytes=t.chunked_copy_mb << 20, chunk_threads=t.threads))
        except OSError as e:
            log.warning("tier %s at %s cannot be used (%s); continuing without it", t.name, t.path, e)
    # a symlinked root is matched by its real path too (same id)
    roots = [Root(prefix, i, cat.dir_links[i]) for prefix, i in catalog_mod.RootMap(cat.roots).prefixes]
    job.index, job.slots = SharedIndex.for_catalog(job.run_dir / "index", roots, [str(t.data) for t in job.tiers],
                                                   cat, cat.deferred.pending if cat.deferred is not None else None)
    if cat.deferred is None:
        cat.files.release_indexed()   # the index holds the identities and stat
        give_back_freed_memory()      # before the order and torch take theirs
    job.feed = feed = _choose_policy(job)
    if isinstance(feed, ListFeed):
        job.warm_order = feed.first
    if job.hooked:
        (job.run_dir / "orders").mkdir(mode=0o700)
        job.feed = HookFeed(job.run_dir / "orders", cat)
        job.hook_watch = HookWatch(job.run_dir / "orders")
    if opts.node.multi_node:
        from .cluster.peering import PeerTier, index_lookup
        job.peer = PeerTier(opts.node, opts.profile.network or Network(), index_lookup(job.index, cat, job.tiers),
                            opts.rendezvous_timeout)
        _plan_peers(job, cat)
    if cat.deferred is None:
        _make_daemon(job)
        assert job.info is not None
        watch.attach(job.info, _Probe(job), lambda: job.no_order)
    else:
        job.fill = SizeFill(cat, job.index, job.slots, opts.scan_threads, lambda place: _sizes_known(job, place),
                            watch.sizing)


def _make_daemon(job: Job) -> None:
    """The daemon (not started) and what the watch shows: once every size is known."""
    opts, cat = job.opts, job.catalog
    assert cat is not None and job.index is not None and job.slots is not None and job.run_dir is not None
    feed = job.feed

    def make_policy(d: Daemon) -> Policy:
        if job.policy == Clairvoyant.name:   # the home files are pinned once the nodes met (Daemon._take_homes)
            return Clairvoyant(d, feed, window=opts.window)
        return SIMPLE_POLICIES[job.policy](d)

    job.daemon = Daemon(job.index, cat, job.slots, job.tiers, opts.profile.pfs.read_threads, make_policy,
                        peers=job.peer.links if job.peer is not None else None)
    sizes = cat.files.size
    job.info = JobInfo(job.run_dir.name, os.getpid(), job.user, opts.command, cat.roots, opts.profile.name,
                       job.policy, len(cat.files), cat.total_bytes,
                       fits_bytes(sizes, sum(t.capacity for t in job.tiers), allocation),
                       [(t.name, t.capacity) for t in job.tiers], job.run_dir)
    give_back_freed_memory()


def _sizes_known(job: Job, place: bool) -> None:
    """On the fill's thread, once every size is known and the index is
    whole (NOTE [names first]): the cache is written (a child forked before
    any thread of the daemon runs), the columns only the index needs go;
    with place (COMMAND still runs), the daemon is made and started and the
    watch takes it on its next tick."""
    cat = job.catalog
    assert cat is not None
    fill = job.fill
    assert fill is not None
    saves, fill.saves = fill.saves, []
    if saves and fill.gone:    # as SizeFill.cache_aside: no cache that records files gone at their stat
        log.info("%d files were gone when their sizes were read: the catalog cache is not written", fill.gone)
        saves = []
    if saves:
        assert job.run_dir is not None
        job.cache_writer = catalog_mod.save_in_child(saves, fill.writer_prepare, job.run_dir / CACHE_WRITER_OUTPUT)
    del saves     # the scan's RootScan shares the columns released next: they go only without it
    cat.files.release_indexed()
    give_back_freed_memory()
    if few_large_files(cat.files.size):    # known only now: too late to warm (NOTE [few large files])
        job.few_large = True
        if job.opts.warm is None:
            log.warning("the data set is %s large files (%s): %s", f"{len(cat.files):,}",
                        human_bytes(cat.total_bytes), MAPPED_HINT)
    if place:
        _make_daemon(job)
        start_service(job)


class _Probe:
    """The job's numbers, for the watch (observe/live.py)."""

    def __init__(self, job: Job):
        self.job = job

    def counters(self) -> dict[str, Any]:
        """Each second: the opens from the events while none was lost (the
        sum of the entries' counters reads the whole entry table: ~5 ms at
        1.28 M files on an idle machine, more beside a fast reader), NOTE
        [open counters]."""
        job = self.job
        if job.index is None:
            return {}
        return job.index.counters(job.daemon.opens_seen() if job.daemon is not None else None)

    def snapshot(self) -> DaemonSnapshot | None:
        return self.job.daemon.snapshot() if self.job.daemon is not None else None

    def report(self) -> dict[str, Any]:
        return self.job.daemon.policy.report() if self.job.daemon is not None else {}


def _choose_policy(job: Job) -> ListFeed | HookFeed | None:
    """The policy in force and, for clairvoyant, a feed known before COMMAND runs."""
    opts = job.opts
    assert job.catalog is not None
    job.hooked = (opts.hook if opts.hook is not None else is_python_command(opts.command)) \
        and not opts.order.given and opts.policy in (None, "clairvoyant")
    if job.hooked and not (HOOK_DIR / "sitecustomize.py").is_file():
        job.hooked = False
        job.policy = "clairvoyant"
        job.no_order = "the order hook is missing from this installation"
        log.warning("the order hook is missing from this installation of tiering (no %s): placement follows "
                    "first touch (each file is copied to a tier when it is first read); reinstall tiering "
                    "(pip install --force-reinstall tiering), or %s", HOOK_DIR / "sitecustomize.py", ORDER_HINT)
        return None
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


def _check_hook(job: Job, command_done: bool) -> None:
    """Says once, by COMMAND's first data-set open (a Python COMMAND) or its
    exit, that the order hook did not start in it: no hello came."""
    watch = job.hook_watch
    if watch is None or job.no_order is not None or job.index is None:
        return
    # opens first: a process says hello before its first open, so a hello
    # that is not there now was never said before that open
    opened = job.index.counters()["opens"] > 0
    if not (command_done or (opened and is_python_command(job.opts.command))):
        return
    job.hook_watch = None   # decided
    if watch.started():
        return
    cause = hook_blocker(job.opts.command) or (
        "no Python process of COMMAND loaded it: Python run with -I, -E or -S, PYTHONPATH replaced "
        "before Python started, or the order directory not writable from COMMAND")
    job.no_order = "the order hook did not start in COMMAND"
    when = "by its first read of the data set" if opened and not command_done else "before it exited"
    log.warning("the order hook did not start in COMMAND %s (%s): placement follows first touch (each file "
                "is copied to a tier when it is first read); %s", when, cause, ORDER_HINT)


def cleanup(job: Job) -> None:
    if job.index is not None:
        job.index.set_disabled(True)  # processes COMMAND left behind stop using the tiers
    if job.cache_writer is not None:     # the next run finds the cache (a writer that hangs is left to end alone)
        if catalog_mod.wait_writer(job.cache_writer, CACHE_WRITER_WAIT) and job.run_dir is not None:
            _say_writer_output(job.run_dir / CACHE_WRITER_OUTPUT)
        job.cache_writer = None
    d, cat = job.daemon, job.catalog
    if d is not None and cat is not None and cat.from_cache and d.stats.changed_sources and job.opts.scan_cache:
        catalog_mod.drop_cache(job.opts.scan_cache, cat.roots)  # rescan next time
    if job.opts.keep:
        return
    if job.index is not None:
        job.index.close()
        job.index = None
    held = [t.root for t in job.tiers] + ([job.run_dir] if job.run_dir is not None else [])
    for p in own_unheld([index_parent()] + [t.path for t in job.opts.profile.tiers], job.user, held):
        remove_tree(p)     # made by a set-up a signal cut short before it was recorded
    # the copies go in the background (NOTE [background teardown]): the job ends now
    tiers = [t.root for t in job.tiers]
    if remove_in_background(tiers) is None:
        for t in tiers:
            remove_tree(t)
    if job.run_dir is not None:
        remove_tree(job.run_dir)


def _say_writer_output(path: Path) -> None:
    """What the catalog cache writer said (a cache it could not write), on
    tier-run's stderr once COMMAND is done with the terminal."""
    try:
        text = path.read_text(errors="replace").rstrip("\n")
    except OSError:
        return
    if text:
        say(text)


# -- running COMMAND -----------------------------------------------------------

def check_command(opts: JobOptions) -> str:
    """COMMAND's executable, the --stats-json path and the private
    directories' parents against the data roots checked: all before anything
    is set up (a typo costs no scan)."""
    try:
        exe = resolve_command(opts.command)
    except CommandError as e:
        raise JobError(str(e), e.exit_code) from None
    if opts.stats_json is not None and (problem := stats_path_problem(opts.stats_json)):
        raise JobError(problem)
    if problems := in_data_problems(opts):
        raise JobError("\n".join(problems))
    return exe


def in_data_problems(opts: JobOptions) -> list[str]:
    """Where a private directory of the job would be inside a data root
    (NOTE [tier directories]): a tier's path, or the index's parent, that is
    a data root or inside one."""
    problems = data_root_problems(opts.profile, opts.data)
    parent = index_parent()
    for root in opts.data:
        if (how := relation(parent, root)) in ("is", "is inside"):
            problems.append(f"the index's directory goes to {parent}, which {how} the data root {root}: it would "
                            f"be part of the data set (COMMAND would list it); stage the data set in a directory "
                            f"of its own (e.g. {os.path.join(parent, 'mydata')}) and give that as --data")
            break
    return problems


def run_command(command: list[str], exe: str, env: dict[str, str], ignored: set[int],
                started: Callable[[int], None], tick: Callable[[], None]) -> int:
    """The member part: starts COMMAND, calls started(pid) (threads may start
    from then on: COMMAND is forked already), forwards signals until it exits
    and returns its exit status (128+N for signal N)."""
    try:
        proc = spawn(command, exe, env, ignored)
    except CommandError as e:
        raise JobError(str(e), e.exit_code) from None
    started(proc.pid)
    code = wait_forwarding(proc.pid, ignored, tick)
    proc.returncode = code   # reaped here, not by Popen
    return code


def run(job: Job) -> int:
    """Runs the whole job in this process, the service part and the member
    part (launch forms 1 and 3; form 2 is cluster/member.py); returns
    COMMAND's exit status (128+N for signal N).  Nothing after COMMAND
    started changes that: a report that cannot be written is said on stderr
    (or dropped with it), NOTE [exit status]."""
    opts = job.opts
    exe = check_command(opts)
    t_start = time.monotonic()
    ignored = ignored_at_start()
    map_large_blocks()
    # before anything starts a thread (NOTE [signals and COMMAND])
    old_mask = block_signals()
    exit_code: int | None = None
    try:
        with SetupWatch(ignored) as setup_watch:
            job.threads_paused = setup_watch.paused
            setup(job, names_first(opts))
            few_large_files_first(job)
            warm(job)
        job.threads_paused = nullcontext
        env = child_environment(dict(os.environ), job.index.path if job.index else None,
                                library_path(), opts.verbose >= 2, job.order_dir)
        t0 = time.monotonic()

        def started(pid: int) -> None:
            # after the fork: COMMAND never inherits a thread
            if job.fill is not None:
                job.fill.start()     # the sizes, then the daemon (NOTE [names first])
            else:
                start_service(job)
            if job.watch is not None:
                job.watch.command_started(pid)

        if job.watch is not None:
            job.watch.command_starting()   # before the fork: COMMAND's first lines come after it
        exit_code = run_command(opts.command, exe, env, ignored, started, _ticker(job))
        job.timings["command"] = time.monotonic() - t0
        _finish(job, exit_code, t_start)
        return exit_code
    finally:
        _teardown(job, reporting=exit_code is not None)
        restore_signals(old_mask)


# NOTE [few large files]: what the lines about a few large files not warmed say
MAPPED_HINT = ("a file opened once and memory-mapped is served from the tiers only when its copy is made before "
               "the open; --warm copies them before COMMAND starts")


def few_large_files_first(job: Job) -> None:
    """NOTE [few large files]: a data set of a few large files whose sizes
    are known before COMMAND (a cached or a small catalog) is warmed before
    COMMAND starts where it fits and --warm was not given, and said so in one
    line; where it does not fit, the line says what --warm would do."""
    opts, cat = job.opts, job.catalog
    job.warm_percent = opts.warm
    if cat is None or cat.deferred is not None or not job.tiers or not few_large_files(cat.files.size):
        return
    job.few_large = True
    if opts.warm is not None:
        return
    sizes = cat.files.size
    what = f"the data set is {len(sizes):,} large files ({human_bytes(cat.total_bytes)})"
    if not fits_whole(sizes, [t.capacity for t in job.tiers]):
        log.warning("%s, more than a warm-up can copy (each file into one tier, to %d%% of its capacity): a "
                    "file opened once and memory-mapped is served from the tiers only when its copy is made "
                    "before the open; --warm copies what fits before COMMAND starts", what,
                    round(Clairvoyant.margin * 100))
    elif not opts.auto_warm or opts.node.multi_node or job.daemon is None:
        log.warning("%s: %s", what, MAPPED_HINT)
    else:
        job.warm_percent = 100
        if job.watch is not None:
            job.watch.note(f"{what}: copied before COMMAND starts, as --warm would (a file opened once and "
                           "memory-mapped is served from where it was when opened); --no-warm starts COMMAND at once")


def warm(job: Job) -> None:
    """--warm (or a few large files: few_large_files_first): copies before
    COMMAND starts (NOTE [warm-up]); a failure here only means COMMAND
    starts with colder tiers."""
    if job.warm_percent is None or job.daemon is None or not job.tiers:
        return
    watch = job.watch
    try:
        job.warmed = warm_up(job.daemon, job.warm_order, job.warm_percent,
                             watch.warming if watch is not None else lambda p: None)
        job.warmed.auto = job.opts.warm is None
    except Exception as e:
        log.warning("the warm-up failed (%r): COMMAND starts with what is in the tiers", e)
        return
    finally:
        if watch is not None:
            watch.close_bar()
    if watch is not None:
        watch.warm_done(job.warmed)


def _plan_peers(job: Job, cat: catalog_mod.Catalog) -> None:
    """What the daemon needs to ask a peer (NOTE [node-aware plan]): the
    inputs of the homes when the sampler is given (None: no peer fetch) and
    this node's budget for them, which the rendezvous publishes (NOTE [home
    nodes]); the PFS's rate per stream to compare with the network's."""
    from .clairvoyant.nodes import home_budget, planning_from_options
    from .cluster.links import pfs_stream_rate
    assert job.peer is not None
    opts, links = job.opts, job.peer.links
    links.pfs_bandwidth = pfs_stream_rate(opts.profile.pfs.bandwidth)
    links.pfs_latency_ms = opts.profile.pfs.latency_ms or 0.0
    if job.policy != "clairvoyant":
        return
    sizes = np.asarray(cat.files.size)   # known: a job that spans nodes does not scan names first
    mean = int(allocations(sizes).mean()) if len(sizes) else 0
    links.budget = home_budget([t.capacity for t in job.tiers], mean)
    try:
        links.planning = planning_from_options(opts.order, cat, opts.node.node_count, opts.node.node_rank)
    except Exception as e:   # no peer fetch: this node reads the PFS
        log.warning("the other nodes' plans cannot be computed (%r): no copies from peers", e)


def start_service(job: Job) -> None:
    """The threads of the service part: the daemon, and the peer tier of a
    job that spans nodes.  Neither may fail the job: a daemon that cannot
    start leaves COMMAND reading the PFS, a peer tier that cannot start is a
    warning."""
    if job.daemon is not None:
        try:
            job.daemon.start()
        except Exception as e:
            log.warning("placement cannot start (%r): COMMAND reads everything from the PFS", e)
            if job.index is not None:
                job.index.set_disabled(True)
    if job.peer is not None:
        try:
            job.peer.start()
        except Exception as e:
            log.warning("the peer tier cannot start (%r): this node reads the PFS only", e)


def _ticker(job: Job) -> Callable[[], None]:
    def tick() -> None:   # never ends the wait for COMMAND
        try:
            _attach_when_filled(job)
            _check_hook(job, command_done=False)
            if job.watch is not None:
                job.watch.tick()
        except Exception:
            log.debug("status failed", exc_info=True)

    return tick


def _attach_when_filled(job: Job) -> None:
    """The watch takes the daemon of a names-first start-up once the fill
    made it (on the main thread, as every tick of the watch)."""
    fill, watch = job.fill, job.watch
    if fill is None or watch is None or watch.info is not None or not fill.done.is_set() or job.info is None:
        return
    watch.attach(job.info, _Probe(job), lambda: job.no_order)
    watch.sizes_read(fill.seconds)


def _finish(job: Job, exit_code: int, t_start: float) -> None:
    """Stops placing, then the summary and the JSON; a failure here is said,
    never raised (COMMAND's status is the job's)."""
    opts = job.opts
    try:
        _check_hook(job, command_done=True)
        stop_service(job)
        job.timings["total"] = time.monotonic() - t_start
        stats = job_stats(job, exit_code, final=True)
        if opts.display.summary:
            say(job_summary(stats))
        if opts.stats_json and (problem := write_stats(opts.stats_json, stats)):
            say(f"tier-run: {problem} (COMMAND exited {exit_code})")
        if opts.keep and job.run_dir:
            say(f"tiering: --keep: index {job.run_dir}, tiers " + ", ".join(str(t.root) for t in job.tiers))
    except Exception as e:   # a bug in reporting must not cost the job its status
        log.debug("reporting failed", exc_info=True)
        say(f"tier-run: the summary failed ({e!r}); COMMAND exited {exit_code}")


def stop_service(job: Job) -> None:
    """Stops reading the sizes (NOTE [names first]), placing, then serving
    the other nodes (idempotent); all before the tiers are removed."""
    if job.fill is not None:
        job.fill.stop(FILL_GRACE)
        job.fill.cache_aside()     # the sizes not read yet, and the cache, in a child nobody waits for
        _attach_when_filled(job)
    if job.daemon is not None and not job.daemon.stopping:
        job.daemon.stop()
    if job.peer is not None:
        job.peer.close()


def job_stats(job: Job, exit_code: int, final: bool) -> dict[str, Any]:
    """The job's statistics (the --stats-json object); final: after the
    daemon stopped (the last sample of the time series), else a snapshot
    (the node service's, exit_code -1: each member puts its COMMAND's)."""
    record = _record(job, exit_code)
    if job.watch is not None:
        record.observed = job.watch.finish() if final else job.watch.observed()
    stats = to_json(record)
    if job.peer is not None:   # the peer tier's report and the daemon's fetches: at its stop, else now
        mine = stats.get("peer") or (job.daemon.peer_report() if job.daemon is not None else None)
        stats["peer"] = {**(mine or {}), **job.peer.report()}
    return stats


def job_summary(stats: dict[str, Any]) -> str:
    """summary_text, with the peer tier's line for a job that spans nodes."""
    text = summary_text(stats)
    if "peer" in stats:
        from .cluster.peering import peer_summary
        text += "\n" + peer_summary(stats["peer"])
    return text


def _teardown(job: Job, reporting: bool) -> None:
    """Stops the daemon and removes what the job made.  After COMMAND ran
    (reporting), a failure here is said, not raised."""
    try:
        stop_service(job)
        cleanup(job)
    except Exception as e:
        if not reporting:
            raise
        log.debug("clean-up failed", exc_info=True)
        say(f"tier-run: clean-up failed ({e!r}); the next tier-run removes what is left")


def _record(job: Job, exit_code: int) -> JobRecord:
    cat, d = job.catalog, job.daemon
    assert cat is not None
    r = JobRecord(job.policy, exit_code, job.opts.command, job.opts.profile.name, cat.roots, len(cat.files),
                  cat.total_bytes, seconds=job.timings, no_order=job.no_order,
                  warm=job.warmed.to_json() if job.warmed is not None else None,
                  unsized=int(cat.deferred.pending.sum()) if cat.deferred is not None else 0,
                  few_large=job.few_large)
    if job.index is not None:
        r.counters = job.index.counters()
    if d is not None:
        r.tiers, r.daemon, r.abandoned, r.order = d.tier_summary(), d.stats, d.stuck, d.policy.report()
    return r

