"""Command line: `tier-run` wraps a command; `tiering` holds the other tools."""
from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__
from .cliopts import apply_options as _apply
from .cliopts import order_from as _order
from .cliopts import order_options as _order_options
from .cluster.identity import Explicit, IdentityError, node_identity
from .cluster.rendezvous import DEFAULT_RENDEZVOUS_TIMEOUT
from .console import flush_quietly, reserve_standard_fds, say, setup_logging
from .job import POLICY_NAMES, Job, JobError, JobOptions, map_large_blocks, run
from .observe.live import choose_display
from .profile import (
    NoUsableTier,
    ProfileError,
    check_profile,
    data_root_problems,
    format_profile,
    list_profiles,
    load_profile,
)
from .units import human_bytes

RUN_HELP = """Run COMMAND with the data set under each --data DIR served from local tiers.

\b
  tier-run --data /pfs/imagenet/train -- python train.py --epochs 90
  tier-run --profile frontera --data /scratch/ds --stats-json s.json -- ./train.sh

COMMAND's exit status is tier-run's.  Files are copied to the tiers of the
profile (default: auto, which finds RAM and a local disk) while COMMAND runs;
every copy is removed when it ends."""


def _run_options(f):  # type: ignore[no-untyped-def]
    opts = [
        click.option("--profile", "profile", default="auto", show_default=True, metavar="NAME|FILE",
                     help="Cluster profile: a shipped name (see `tiering profile list`) or a YAML file."),
        click.option("--data", "data", multiple=True, required=True, metavar="DIR",
                     type=click.Path(file_okay=False, dir_okay=True, exists=True),
                     help="A data-set directory on the PFS (repeatable)."),
        click.option("--policy", type=click.Choice(POLICY_NAMES), default=None,
                     help="Placement policy [default: clairvoyant when the order is known (--sampler, "
                          "--order-file, or the hook of a Python command), else first-touch]."),
        click.option("--hook/--no-hook", default=None,
                     help="Take the order from the DataLoader inside a Python COMMAND [default: on for "
                          "python, torchrun and python scripts]."),
        click.option("--window", type=click.IntRange(min=1), default=64, show_default=True,
                     help="Clairvoyant: files fetched ahead of the reader."),
        click.option("--warm", type=click.IntRange(1, 100), is_flag=False, flag_value=100, default=None,
                     metavar="[PERCENT]",
                     help="Before COMMAND starts, fill the tiers with the first PERCENT (default 100) of what "
                          "fits, in the known order (--sampler/--order-file) or in catalog order; for data sets "
                          "read as a few large memory-mapped files (HF datasets, HDF5, LMDB, .npy)."),
        click.option("--no-warm", is_flag=True,
                     help="Do not warm a data set of a few large files before COMMAND starts (done by default "
                          "where it fits the tiers)."),
        click.option("--stats-json", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write the job's statistics to this JSON file."),
        click.option("--keep", is_flag=True, help="Keep the index and the tier copies after exit."),
        click.option("-v", "--verbose", count=True,
                     help="-v: placement log and a status line every 5 s; -vv: also the shim's log."),
        click.option("-q", "--quiet", is_flag=True,
                     help="No progress and no summary on stderr; warnings and errors only (--stats-json still "
                          "has everything)."),
        click.option("--progress", type=click.Choice(["auto", "bar", "plain", "off"]), default="auto",
                     show_default=True,
                     help="Progress on stderr: a bar while the data set is scanned and a status line now and "
                          "then while COMMAND runs (auto: bar on a terminal, plain lines in a log)."),
        click.option("--progress-every", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                     help="Seconds between status lines while COMMAND runs [default: 30 on a terminal, 10 in "
                          "a log, 5 with -v; 0: none]."),
        click.option("--nodes", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Nodes in the job, each running one tier-run [default: from Slurm, torchrun or MPI; "
                          "else 1]."),
        click.option("--node-rank", type=click.IntRange(min=0), default=None, metavar="R",
                     help="This node's rank, 0..N-1 (with --nodes)."),
        click.option("--rendezvous", type=click.Path(file_okay=False, path_type=str), default=None, metavar="DIR",
                     help="Where the nodes of the job meet: a directory of yours on a file system every node "
                          "shares [default: ~/.cache/tiering/rendezvous]."),
        click.option("--job-id", default=None, metavar="ID",
                     help="The job's id, the same on every node [default: the launcher's]."),
        click.option("--rendezvous-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_RENDEZVOUS_TIMEOUT, show_default=True, metavar="SECONDS",
                     help="Seconds the nodes have to meet; the job runs meanwhile, and without peers after."),
        click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED),
    ]
    return _order_options(_apply(f, opts))


def _do_run(profile: str, data: tuple[str, ...], policy: str | None, hook: bool | None, window: int,
            warm: int | None, no_warm: bool, stats_json: Path | None, keep: bool, verbose: int, quiet: bool,
            progress: str,
            progress_every: float | None, nodes: int | None, node_rank: int | None, rendezvous: str | None,
            job_id: str | None, rendezvous_timeout: float, command: tuple[str, ...], **kw: Any) -> None:
    reserve_standard_fds()
    order = _order(kw)
    setup_logging(0 if quiet else verbose)
    if warm is not None and no_warm:
        _leave(2, "tier-run: --warm and --no-warm contradict each other; give one of them")
    display = choose_display(progress, quiet, verbose, progress_every)
    try:
        node = node_identity(os.environ, Explicit(nodes, node_rank, rendezvous, job_id))
    except IdentityError as e:
        _leave(2, f"tier-run: {e}")
    try:
        prof = load_profile(profile)
        job = Job(JobOptions(list(data), list(command), prof, policy=policy, order=order, hook=hook, window=window,
                             warm=warm, auto_warm=not no_warm, stats_json=stats_json, keep=keep, verbose=verbose,
                             display=display, node=node,
                             rendezvous_timeout=rendezvous_timeout))
        if node.shared_node:   # launch form 2: one service for the tier-runs of this node
            from .cluster.member import run_member
            from .cluster.service import form2_refusal
            if refused := form2_refusal(job.opts):
                _leave(2, f"tier-run: {refused}")
            code = run_member(job)
        else:
            code = run(job)
    except NoUsableTier as e:
        _without_tiers(list(command), e, stats_json)
    except ProfileError as e:
        _leave(2, f"tier-run: profile error: {e}")
    except JobError as e:
        _leave(e.exit_code, f"tier-run: {e}")
    except KeyboardInterrupt as e:   # Interrupted: a signal during set-up
        sig = getattr(e, "signum", signal.SIGINT)
        _leave(128 + sig, f"tier-run: interrupted by {signal.Signals(sig).name} before COMMAND started")
    flush_quietly()
    if job.daemon is not None and job.daemon.stuck:
        # copies blocked in a read of a hung PFS: the interpreter would wait
        # for their threads at exit; COMMAND is done and cleaned up, so leave
        os._exit(code)
    sys.exit(code)


def _without_tiers(command: list[str], e: NoUsableTier, stats_json: Path | None) -> None:
    """No tier of the profile can be used here: COMMAND runs as it would
    without tier-run (exec'ed, its status its own), after one line that says
    why and how to fix it (NOTE [no usable tier])."""
    from .command import CommandError, exec_plain, ignored_at_start, resolve_command
    try:
        exe = resolve_command(command)
    except CommandError as err:
        _leave(err.exit_code, f"tier-run: {err}")
    no_json = f"; no {stats_json} is written" if stats_json is not None else ""
    say(f"tier-run: running COMMAND without tiering{no_json}: {e}")
    flush_quietly()
    try:
        exec_plain(command, exe, ignored_at_start())
    except CommandError as err:
        _leave(err.exit_code, f"tier-run: {err}")


def _leave(code: int, message: str) -> None:
    say(message)
    flush_quietly()
    sys.exit(code)


@click.command(help=RUN_HELP, context_settings={"allow_interspersed_args": False,
                                                "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiering")
@_run_options
def tier_run(**kw):  # type: ignore[no-untyped-def]
    _do_run(**kw)


class InputError(click.ClickException):
    """A file or option the user gave cannot be used (a profile, an order
    file, a --stats-json to draw): the message says why; exit status 2, as
    for tier-run's own usage errors."""

    exit_code = 2


class _Tools(click.Group):
    """Loads `tiering simulate` (numpy and the model) only when it is asked
    for: tier-run itself imports no library that starts threads of its own
    (NOTE [signals and COMMAND])."""

    lazy = {"simulate": ("tiering.simulate.cli", "simulate_cmd")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attr = self.lazy[name]
            cmd: click.Command = getattr(importlib.import_module(module), attr)
            return cmd
        return super().get_command(ctx, name)


@click.group(cls=_Tools, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiering")
def main() -> None:
    """tiering: transparent storage tiering for training jobs."""


@main.command("run", help=RUN_HELP, context_settings={"allow_interspersed_args": False})
@_run_options
def run_cmd(**kw):  # type: ignore[no-untyped-def]
    _do_run(**kw)


PREDICTED_EPOCHS = 2          # epochs the performance model runs for `plan`; later ones repeat the last
PREDICTED_ACCESSES = 500_000  # ... and at most this many accesses (the model costs about 10 us each)


@main.command("plan")
@click.option("--profile", "profile_name", default="auto", show_default=True, metavar="NAME|FILE")
@click.option("--data", multiple=True, required=True, metavar="DIR",
              type=click.Path(file_okay=False, dir_okay=True, exists=True))
@click.option("--window", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON.")
@_order_options
def plan_cmd(profile_name: str, data: tuple[str, ...], window: int, as_json: bool, **kw) -> None:  # type: ignore[no-untyped-def]
    """Predict, without running anything, the hits per tier and the PFS bytes
    per epoch of the clairvoyant policy for a given order."""
    import json as json_mod

    import numpy as np

    from .catalog import CatalogError, ScanError, default_cache_dir, scan
    from .clairvoyant.options import StreamError, epoch_arrays_from_options
    from .clairvoyant.planner import simulate
    from .clairvoyant.samplers import OrderError
    map_large_blocks()
    order = _order(kw)
    if not order.given:
        raise click.UsageError("give the order: --sampler ... (with --seed and --epochs) or --order-file FILE")
    first: list[np.ndarray] = []

    def epochs():  # type: ignore[no-untyped-def]
        """Each epoch computed when the planner needs it; the first few kept for the model."""
        for e in epoch_arrays_from_options(order, cat):
            if len(first) < PREDICTED_EPOCHS:
                first.append(e)
            yield e

    try:
        prof = load_profile(profile_name)
        cat = scan(list(data), cache_dir=default_cache_dir())   # the catalog tier-run caches
        sizes = np.asarray(cat.files.size, np.int64)
        caps = [t.capacity for t in prof.tiers]
        reports, _ = simulate(epochs(), sizes, caps, window=window, schedule=False)
    except (ProfileError, ScanError, CatalogError, OrderError, StreamError) as e:
        raise InputError(str(e)) from None
    # the seconds need the PFS's speed: a default would predict the same time with and without tiering
    no_speed = not prof.pfs.bandwidth
    predicted = None if no_speed else _predict(prof, sizes, first, order.batch_size, len(reports))
    if no_speed:
        why = (f"the profile {prof.name} gives no PFS speed (pfs.bandwidth: MB/s by reader threads; README, "
               "\"Writing a profile for a new cluster\", says how to measure it)")
    else:
        why = f"more than {PREDICTED_ACCESSES:,} accesses in an epoch (`tiering simulate` models any size, given time)"
    if as_json:
        click.echo(json_mod.dumps({"files": len(cat.files), "bytes": cat.total_bytes,
                                   "tiers": [{"name": t.name, "capacity": t.capacity} for t in prof.tiers],
                                   "epochs": [r.as_dict() for r in reports], "predicted": predicted,
                                   **({"not_modelled": why} if predicted is None else {})}, indent=2))
        return
    click.echo(f"{len(cat.files)} files, {human_bytes(cat.total_bytes)}; tiers: " +
               ", ".join(f"{t.name} {human_bytes(t.capacity)}" for t in prof.tiers))
    header = "epoch  accesses  " + "  ".join(f"{t.name + ' hits':>12}" for t in prof.tiers) + "   PFS reads   PFS bytes"
    click.echo(header)
    for k, r in enumerate(reports, 1):
        click.echo(f"{k:>5}  {r.accesses:>8}  " + "  ".join(f"{h:>12}" for h in r.hits) +
                   f"  {r.pfs_reads:>10}  {human_bytes(r.pfs_bytes):>10}")
    if predicted is None:
        click.echo(f"predicted seconds per epoch: not modelled: {why}")
        return
    from .simulate.fromprofile import format_prediction
    click.echo(format_prediction(predicted))
    if predicted["modelled_epochs"] < len(reports):
        click.echo(f"(the model ran epochs 1-{predicted['modelled_epochs']}; later epochs are taken as the last)")


def _predict(prof: Any, sizes: Any, first: list[Any], batch_size: int | None,
             epochs: int) -> dict[str, Any] | None:
    """The performance model's seconds per epoch over the first epochs, later
    epochs repeating the last; None when even one epoch is too long to model
    quickly (the model simulates every access in Python).  The model is given
    only the files these epochs read, renumbered in catalog order: a file
    never read is never copied nor evicted, so the prediction is the same,
    and a distributed sampler's share of a large catalog costs a quarter of
    the memory (docs/design.md, NOTE [plan prediction])."""
    import numpy as np

    from .simulate.fromprofile import plan_prediction
    total = 0
    modelled: list[Any] = []
    for e in first:
        if modelled and total + len(e) > PREDICTED_ACCESSES:
            break
        total += len(e)
        modelled.append(e)
    if not modelled or total > PREDICTED_ACCESSES:
        return None
    read = np.unique(np.concatenate(modelled))
    orders = [np.searchsorted(read, e).tolist() for e in modelled]
    p: dict[str, Any] = plan_prediction(prof, sizes[read].tolist(), orders, batch_size)
    p["modelled_epochs"] = len(modelled)
    for key, sum_key in (("clairvoyant_epochs", "clairvoyant_seconds"), ("pfs_epochs", "pfs_seconds")):
        per = list(p[key])
        per += per[-1:] * (epochs - len(per))
        p[key], p[sum_key] = per, sum(per)
    p["gain"] = p["pfs_seconds"] / p["clairvoyant_seconds"] if p["clairvoyant_seconds"] > 0 else None
    return p


@main.command("status")
@click.argument("job", required=False)
@click.option("--watch", is_flag=True, help="Refresh until the job ends (Ctrl-C stops watching).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between refreshes with --watch.")
@click.option("--window", type=click.FloatRange(min=1, max=60), default=10.0, show_default=True, metavar="SECONDS",
              help="Hit ratio and rates over the last SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="The status as JSON (one object per line with --watch).")
def status_cmd(job: str | None, watch: bool, interval: float, window: float, as_json: bool) -> None:
    """The live view of a running tier-run job of yours on this node: JOB is
    a PID (tier-run's or COMMAND's) or a job id; without it, the only job
    running.  Read-only: attaching changes nothing in the job."""
    import json as json_mod
    import time

    from .observe.status import StatusError, find_job, fresh, read_status
    from .observe.view import status_view
    try:
        d, st = find_job(job)
    except StatusError as e:
        raise click.ClickException(str(e)) from None
    terminal = sys.stdout.isatty()
    try:
        while True:
            view = fresh(d, st, window)
            if as_json:
                click.echo(json_mod.dumps(view, indent=None if watch else 2))
            else:
                click.echo(("\x1b[H\x1b[2J" if watch and terminal else "") + status_view(view))
            if not watch:
                return
            time.sleep(interval)
            latest = read_status(d)
            if latest is None or not d.path.exists():
                if not as_json:
                    click.echo(f"job {d.name} has ended")
                return
            st = latest
    except KeyboardInterrupt:
        return


def _epoch_seconds(text: str) -> list[float]:
    """--direct's seconds per epoch: numbers separated by commas, each finite and >= 0."""
    import math
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(x) and x >= 0 for x in out):
        raise click.BadParameter(f"{text!r}: give the direct run's seconds per epoch, e.g. 9.6,9.4,9.8",
                                 param_hint="--direct")
    return out


@main.command("report")
@click.argument("stats", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="The picture: a .png, .svg or .pdf, or a .html page with the picture and the summary "
                   "[default: STATS with .png].")
@click.option("--direct", metavar="S,S,...",
              help="Seconds per epoch of the same training run without tier-run (reading the PFS directly), "
                   "drawn beside tier-run's epoch times.")
def report_cmd(stats: Path, output: Path | None, direct: str | None) -> None:
    """Draw what a tier-run job did, from its --stats-json file: the tiers
    filling over time, the hit ratio per epoch, the PFS traffic over time
    with the reader's epochs marked, and the epoch times (with --direct,
    beside the direct run's)."""
    from .observe.plot import PlotError, write_report
    from .report import summary_text
    out = output or stats.with_suffix(".png")
    try:
        write_report(stats, out, _epoch_seconds(direct) if direct is not None else None, summary_text)
    except PlotError as e:
        raise InputError(str(e)) from None
    click.echo(f"tiering report: {out}")


@main.group()
def profile() -> None:
    """Show, list and check cluster profiles."""


@profile.command("list")
def profile_list() -> None:
    """Names of the shipped profiles."""
    for name in list_profiles():
        click.echo(name)


@profile.command("show")
@click.argument("name", default="auto")
def profile_show(name: str) -> None:
    """Print the resolved profile NAME (a shipped name or a YAML file)."""
    try:
        click.echo(format_profile(load_profile(name)))
    except ProfileError as e:
        raise InputError(str(e)) from None


@profile.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--data", "data", multiple=True, metavar="DIR", type=click.Path(file_okay=False, exists=True),
              help="A data-set directory tier-run will be given (repeatable): no tier path may be it or be "
                   "inside it.")
def profile_check(file: str, data: tuple[str, ...]) -> None:
    """Validate a profile FILE; exit status 0 when it can be used here (with
    the data sets of --data)."""
    try:
        p = check_profile(file)
    except ProfileError as e:
        raise InputError(str(e)) from None
    if problems := data_root_problems(p, data):
        raise InputError("\n".join(problems))
    click.echo(format_profile(p))
    click.echo(f"{file}: OK")


if __name__ == "__main__":
    main()
