"""`--sweep PATH=V1,V2,...`: the same simulation with one setting varied, e.g.
`storage[1].capacity_mb=25600,51200,102400` ("what does more RAM buy") or
`nodes=1,2,4,8`."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml

from .config import ConfigError, SimConfig
from .result import Report
from .runner import simulate


@dataclass(frozen=True)
class Sweep:
    path: str
    values: tuple[object, ...]

    @staticmethod
    def parse(text: str) -> Sweep:
        path, sep, rest = text.partition("=")
        values = [v.strip() for v in rest.split(",") if v.strip()]
        if not sep or not path.strip() or not values:
            raise ConfigError(f"--sweep {text!r}: write SETTING=V1,V2,... e.g. storage[1].capacity_mb=25600,51200")
        return Sweep(path.strip(), tuple(yaml.safe_load(v) for v in values))


def run_sweep(cfg: SimConfig, sweep: Sweep, policies: Iterable[str],
              progress: Callable[[str], None] | None = None) -> list[tuple[object, Report]]:
    configs = [(v, cfg.with_value(sweep.path, v)) for v in sweep.values]   # bad paths fail before any run
    policies = list(policies)
    return [(v, simulate(c, policies, progress=progress)) for v, c in configs]


def format_sweep(sweep: Sweep, runs: list[tuple[object, Report]]) -> str:
    names = list(runs[0][1].policies) if runs else []
    width = max([len(sweep.path)] + [len(str(v)) for v, _ in runs])
    lines = [f"{sweep.path:<{width}}  " + "  ".join(f"{n:>14}" for n in names) + "   (seconds)"]
    for v, rep in runs:
        cells = [f"{rep.policies[n].seconds:>14.2f}" if n in rep.policies else f"{'-':>14}" for n in names]
        lines.append(f"{str(v):<{width}}  " + "  ".join(cells))
    return "\n".join(lines)
