"""${VAR} and ${VAR:-default} expansion of profile values, with the built-in
JOB_ID, TMPDIR and USER."""
from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping

_VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _ExpansionError(ValueError):
    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def job_id(env: Mapping[str, str]) -> str | None:
    """The batch job id: SLURM_JOB_ID, PBS_JOBID, LSB_JOBID or JOB_ID (SGE), else None."""
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID"):
        if env.get(var):
            return env[var]
    return None


def _lookup(name: str, env: Mapping[str, str], has_default: bool) -> str | None:
    """Value of a variable; built-in fallbacks apply only when no ${VAR:-default} is given."""
    if name == "JOB_ID":
        value = job_id(env)
        return value if value is not None or has_default else str(os.getpid())
    value = env.get(name)
    if value:
        return value
    if has_default:
        return None
    if name == "TMPDIR":
        return "/tmp"
    if name == "USER":
        return env.get("LOGNAME") or pwd.getpwuid(os.getuid()).pw_name
    return value  # "" stays "", unset stays None


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def expand_vars(text: str, env: Mapping[str, str] | None = None) -> str:
    """Expand ${VAR} and ${VAR:-default} (defaults may nest: ${A:-${B:-/tmp}}).

    Built-ins: ${JOB_ID} (SLURM_JOB_ID, PBS_JOBID, LSB_JOBID, JOB_ID, else this
    process id), ${TMPDIR} (else /tmp), ${USER} (else the account name).  As in the
    shell, a default is used when the variable is unset or empty.  A bare ``$VAR``
    is not expanded.
    """
    env = os.environ if env is None else env
    out: list[str] = []
    i = 0
    while True:
        j = text.find("${", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        end = _closing_brace(text, j + 2)
        if end < 0:
            raise _ExpansionError(f"unterminated '${{' in {text!r}", "close it with '}'")
        name, sep, default = text[j + 2 : end].partition(":-")
        if not _VAR_NAME_RE.match(name):
            raise _ExpansionError(
                f"bad variable reference '{text[j:end + 1]}' in {text!r}",
                "write ${NAME} or ${NAME:-default}",
            )
        value = _lookup(name, env, has_default=bool(sep))
        if value is None or (sep and value == ""):
            if not sep:
                raise _ExpansionError(
                    f"variable ${{{name}}} is not set",
                    f"set {name} in the environment or give a default, e.g. ${{{name}:-/tmp}}",
                )
            value = expand_vars(default, env)
        out.append(value)
        i = end + 1
