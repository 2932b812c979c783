"""Command line: `tier-run` wraps a command; `tiering` holds the other tools."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from . import __version__
from .job import Job, JobError, JobOptions, run
from .policy import POLICIES
from .profile import ProfileError, check_profile, format_profile, list_profiles, load_profile

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
        click.option("--policy", type=click.Choice(sorted(POLICIES)), default="first-touch",
                     show_default=True, help="Placement policy."),
        click.option("--stats-json", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write the job's statistics to this JSON file."),
        click.option("--keep", is_flag=True, help="Keep the index and the tier copies after exit."),
        click.option("-v", "--verbose", count=True,
                     help="-v: placement log and a status line every 5 s; -vv: also the shim's log."),
        click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _do_run(profile: str, data: tuple[str, ...], policy: str, stats_json: Path | None,
            keep: bool, verbose: int, command: tuple[str, ...]) -> None:
    logging.basicConfig(level=logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG,
                        format="tiering: %(message)s", stream=sys.stderr)
    try:
        prof = load_profile(profile)
        job = Job(JobOptions(list(data), list(command), prof, policy, stats_json, keep, verbose))
        code = run(job)
    except ProfileError as e:
        click.echo(f"tier-run: profile error: {e}", err=True)
        sys.exit(2)
    except JobError as e:
        click.echo(f"tier-run: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("tier-run: interrupted before COMMAND started", err=True)
        sys.exit(130)
    sys.exit(code)


@click.command(help=RUN_HELP, context_settings={"allow_interspersed_args": False,
                                                "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiering")
@_run_options
def tier_run(**kw):  # type: ignore[no-untyped-def]
    _do_run(**kw)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiering")
def main() -> None:
    """tiering: transparent storage tiering for training jobs."""


@main.command("run", help=RUN_HELP, context_settings={"allow_interspersed_args": False})
@_run_options
def run_cmd(**kw):  # type: ignore[no-untyped-def]
    _do_run(**kw)


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
        raise click.ClickException(str(e)) from None


@profile.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
def profile_check(file: str) -> None:
    """Validate a profile FILE; exit status 0 when it can be used here."""
    try:
        p = check_profile(file)
    except ProfileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(format_profile(p))
    click.echo(f"{file}: OK")


if __name__ == "__main__":
    main()
