"""`tiering simulate`: rank the I/O policies for a cluster before running a job.

The command is registered by tiering/cli.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..cliopts import order_from as _order
from ..cliopts import order_options as _order_options
from ._deps import CatalogError, OrderError, ProfileError, ScanError, StreamError, human_bytes, load_profile, scan
from .config import ConfigError, SimConfig, load_config
from .fromprofile import Workload, config_from_profile, node_streams
from .runner import POLICIES, simulate
from .sweep import Sweep, format_sweep, run_sweep

EXAMPLE = """\b
  tiering simulate --config cluster.yaml
  tiering simulate --config cluster.yaml --policy hdmlp --policy clairvoyant --json
  tiering simulate --config cluster.yaml --sweep storage[1].capacity_mb=25600,51200,102400
  tiering simulate --profile frontera --data /scratch/ds --sampler distributed --seed 0 --epochs 5 --nodes 8

The config is YAML (see README, "Simulator"): nodes, epochs, batch_size,
files, compute_mb_s, preprocess_mb_s, network_mb_s, pfs_link_mb_s, pfs_mb_s,
storage (fastest first; the first class is the staging buffer)."""


def _from_profile(profile: str, data: tuple[str, ...], nodes: int, w: Workload, kw: dict[str, Any]) -> SimConfig:
    order = _order(kw)
    if not order.given:
        raise click.UsageError("with --profile give the order: --sampler ... (with --seed and --epochs) "
                               "or --order-file")
    prof = load_profile(profile)
    cat = scan(list(data))
    streams = node_streams(order, cat, nodes)
    return config_from_profile(prof, cat.files.size.tolist(), streams, order.batch_size or 32, w)


@click.command("simulate", help="Simulate the I/O policies of a training job on a cluster.\n\n" + EXAMPLE)
@click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The cluster, data set and training loop as YAML.")
@click.option("--profile", "profile_name", metavar="NAME|FILE", help="Build the config from a cluster profile ...")
@click.option("--data", multiple=True, metavar="DIR", type=click.Path(file_okay=False, exists=True),
              help="... a data set (its real file sizes) ...")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="... and this many nodes (a distributed sampler's --world-size decides instead).")
@click.option("--compute-mb-s", type=click.FloatRange(min=0, min_open=True), default=100.0, show_default=True,
              help="With --profile: the training's compute throughput per node.")
@click.option("--staging-mb", type=click.FloatRange(min=0), default=1024.0, show_default=True,
              help="With --profile: the loader's read-ahead buffer.")
@click.option("--loader-threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="With --profile: the loader's reader threads.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES),
              help="Policies to run (default: all).")
@click.option("--sweep", "sweep_text", metavar="SETTING=V1,V2,...",
              help="Run once per value, e.g. storage[1].capacity_mb=25600,51200 or nodes=1,2,4.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_order_options
def simulate_cmd(config_file: Path | None, profile_name: str | None, data: tuple[str, ...], nodes: int,
                 compute_mb_s: float, staging_mb: float, loader_threads: int, policies: tuple[str, ...],
                 sweep_text: str | None, as_json: bool, **kw: Any) -> None:
    if (config_file is None) == (profile_name is None):
        raise click.UsageError("give either --config FILE or --profile NAME with --data DIR and the order options")
    if profile_name is not None and not data:
        raise click.UsageError("--profile needs --data DIR (the data set whose sizes and order are simulated)")
    chosen = list(policies) or POLICIES
    progress = None if as_json else (lambda name: click.echo(f"simulating {name} ...", err=True))
    try:
        if config_file is not None:
            cfg = load_config(config_file)
        else:
            cfg = _from_profile(profile_name, data, nodes,  # type: ignore[arg-type]
                                Workload(compute_mb_s=compute_mb_s, staging_mb=staging_mb,
                                         loader_threads=loader_threads), kw)
        if sweep_text:
            sweep = Sweep.parse(sweep_text)
            runs = run_sweep(cfg, sweep, chosen, progress)
            if as_json:
                click.echo(json.dumps({"sweep": {"setting": sweep.path, "runs": [
                    {"value": v, **r.as_dict()} for v, r in runs]}}, indent=2))
            else:
                click.echo(format_sweep(sweep, runs))
            return
        report = simulate(cfg, chosen, progress=progress)
    except (ConfigError, ProfileError, ScanError, CatalogError, OrderError, StreamError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(report.format(human_bytes))
    sys.stdout.flush()
