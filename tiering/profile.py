"""Per-cluster storage profiles: YAML files that say which local tiers exist.

A profile lists the node-local tiers (fastest first) that `tier-run` may use to
cache a data set, and a few facts about the parallel file system (PFS).  The
loader expands ``${VAR}`` references, resolves every capacity to bytes *on the
machine it runs on*, drops optional tiers that cannot be used here, and raises
:class:`ProfileError` with a message naming the file, the key and the fix.

Public API (used by the CLI and tier-run): :class:`Tier`, :class:`Pfs`,
:class:`Profile`, :class:`ProfileError`, :func:`list_profiles`,
:func:`load_profile`, :func:`check_profile`, :func:`format_profile`,
:func:`parse_size`, :func:`human_bytes`.
"""

from __future__ import annotations

import difflib
import importlib.resources
import os
import pwd
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

__all__ = [
    "ProfileError",
    "Tier",
    "Pfs",
    "Profile",
    "list_profiles",
    "load_profile",
    "check_profile",
    "format_profile",
    "parse_size",
    "human_bytes",
]

# --------------------------------------------------------------------------- constants

MAX_TIERS = 4  # the shared index (see DESIGN.md) has room for at most 4 tier roots
DEFAULT_TIER_THREADS = 4
DEFAULT_PFS_READ_THREADS = 8
TIER_KINDS = ("memory", "filesystem")

# Where the cgroup file systems are mounted and where the kernel says which cgroup
# this process is in.  Module-level so that tests can point them at a fake tree.
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 reports "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000).
_CGROUP_V1_UNLIMITED = 1 << 62

# File system types that are not a node-local disk: network/parallel file systems and
# memory-backed ones.  A tier marked `local_only: true` must not live on these.
NON_LOCAL_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph",
        "glusterfs", "panfs", "pvfs2", "orangefs", "wekafs", "afs", "9p", "davfs",
        "tmpfs", "ramfs", "devtmpfs",
    }
)
NON_LOCAL_FSTYPE_PREFIXES = ("fuse",)  # "fuse", "fuse.sshfs", "fuse.gcsfuse", ...

_TOP_KEYS = ("name", "description", "tiers", "pfs")
_TOP_REQUIRED = ("name", "tiers")
_TIER_KEYS = ("name", "kind", "path", "capacity", "threads", "bandwidth", "optional", "local_only")
_TIER_REQUIRED = ("name", "kind", "path", "capacity")
_PFS_KEYS = ("read_threads", "bandwidth", "latency_ms")

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z%]*)\s*$")
_VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --------------------------------------------------------------------------- data model


class ProfileError(Exception):
    """A profile cannot be used.  The message names the file, the key and the fix."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        super().__init__(message)
        self.source = source
        self.key = key


@dataclass(frozen=True)
class Tier:
    name: str  # unique within the profile
    kind: str  # "memory" | "filesystem"
    path: str  # expanded absolute parent directory; tier-run creates a private subdirectory in it
    capacity: int  # bytes, resolved now
    capacity_spec: str  # as written in the YAML, e.g. "64GiB", "25%", "auto"
    threads: int  # copy threads for this tier
    bandwidth: dict[int, float]  # MB/s by thread count, {} when not given


@dataclass(frozen=True)
class Pfs:
    read_threads: int  # PFS read concurrency
    bandwidth: dict[int, float]  # MB/s by thread count, {} when not given
    latency_ms: float | None


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # file it came from
    description: str
    tiers: tuple[Tier, ...]  # fastest first, at least one
    pfs: Pfs
    # What the loader decided on this machine: dropped optional tiers, clamped
    # capacities, tiers sharing a file system.  Shown by format_profile.
    notes: tuple[str, ...] = ()


def _error(source: str, key: str, problem: str, fix: str) -> ProfileError:
    return ProfileError(f"{source}: {key}: {problem}; {fix}", source=source, key=key)


# --------------------------------------------------------------------------- sizes


def human_bytes(n: int) -> str:
    """Format a byte count with binary units: 1536 -> "1.5 KiB", 64 << 30 -> "64 GiB"."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return f"{sign}{text} {unit}"


def _split_size(text: str) -> tuple[float, str]:
    """Split "1.5 TiB" into (1.5, "tib"); "25%" into (25.0, "%").  ValueError if malformed."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(
            f"cannot read size {text!r}: write a number and a unit, e.g. 64GiB, 500MB, 25% "
            f"or a bare number of bytes (units: {_UNIT_NAMES})"
        )
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("", "%") or unit in _UNITS:
        return number, unit
    if unit in ("k", "m", "g", "t", "p"):
        raise ValueError(
            f"unit {match.group(2)!r} in {text!r} is ambiguous: write {unit.upper()}iB "
            f"(powers of 1024) or {unit.upper()}B (powers of 1000)"
        )
    close = difflib.get_close_matches(unit, list(_UNITS), n=1)
    hint = f" (did you mean {_canonical_unit(close[0])}?)" if close else ""
    raise ValueError(f"unknown unit {match.group(2)!r} in {text!r}{hint}: use one of {_UNIT_NAMES}")


def _canonical_unit(unit: str) -> str:
    return unit.upper() if not unit.endswith("ib") else unit[0].upper() + "iB"


def parse_size(text: str, *, free: int | None = None) -> int:
    """Parse a size into bytes.

    "64GiB", "500MB", "1.5 TiB", "4096" (bytes) or "25%" (of ``free`` bytes).
    Decimal units (KB, MB, ...) are powers of 1000, binary ones (KiB, MiB, ...)
    powers of 1024; units are case-insensitive.  Raises ValueError with a hint.
    """
    if isinstance(text, bool):
        raise ValueError(f"cannot read size {text!r}: write e.g. 64GiB or 25%")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"size {text!r} is negative")
        return int(text)
    number, unit = _split_size(str(text))
    if unit == "%":
        if number > 100:
            raise ValueError(f"percentage {text!r} is above 100%")
        if free is None:
            raise ValueError(f"percentage {text!r} needs the free space it is a share of")
        return int(free * number / 100)
    return int(number * _UNITS.get(unit, 1))


# --------------------------------------------------------------------------- ${VAR} expansion


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


# --------------------------------------------------------------------------- machine facts


def available_memory() -> int:
    """Bytes of RAM the kernel could give to new allocations (psutil 'available')."""
    return int(psutil.virtual_memory().available)


def _cgroup_relpaths(proc_file: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process's cgroup, from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_file.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2 no limit) -> None


def _headroom_along(
    base: Path, rel: str | None, limit_file: str, usage_file: str, unlimited: int | None
) -> int | None:
    """Smallest (limit - usage) over the cgroup at base/rel and its ancestors up to base."""
    dirs = [base]
    if rel:
        current = base
        for part in [p for p in rel.split("/") if p]:
            current = current / part
            dirs.append(current)
    best: int | None = None
    for directory in dirs:
        limit = _read_int(directory / limit_file)
        if limit is None or (unlimited is not None and limit >= unlimited):
            continue
        usage = _read_int(directory / usage_file) or 0
        room = max(0, limit - usage)
        best = room if best is None else min(best, room)
    return best


def cgroup_memory_headroom(root: Path | None = None, proc_file: Path | None = None) -> int | None:
    """Bytes this process's memory cgroup still allows (limit minus usage), None if unlimited.

    cgroup v2: memory.max - memory.current, for the process's cgroup (from
    /proc/self/cgroup; inside a container it is the root) and every ancestor,
    smallest wins.  cgroup v1 (memory controller under ROOT/memory) is read the
    same way with memory.limit_in_bytes - memory.usage_in_bytes, since many HPC
    nodes still run v1.  tmpfs pages count against these limits.
    """
    root = CGROUP_ROOT if root is None else Path(root)
    proc_file = PROC_SELF_CGROUP if proc_file is None else Path(proc_file)
    v2_rel, v1_rel = _cgroup_relpaths(proc_file)
    rooms = [
        _headroom_along(root, v2_rel, "memory.max", "memory.current", None),
        _headroom_along(
            root / "memory", v1_rel, "memory.limit_in_bytes", "memory.usage_in_bytes", _CGROUP_V1_UNLIMITED
        ),
    ]
    known = [r for r in rooms if r is not None]
    return min(known) if known else None


def memory_tier_bound() -> int:
    """Upper bound for memory-tier capacities given as "auto" or "N%".

    Half of the available RAM and, under a cgroup memory limit, half of what that
    limit still leaves (tmpfs pages are charged to the cgroup, so a full RAM tier
    plus the training process must stay under the limit).
    """
    bound = available_memory() // 2
    room = cgroup_memory_headroom()
    if room is not None:
        bound = min(bound, room // 2)
    return bound


SHM_RESERVE_MIN = 1 << 30


def shm_reserve(path: str) -> int:
    """Room "auto" leaves free on a memory tier's file system for the job's own
    shared memory (PyTorch DataLoader workers hand every batch over through
    /dev/shm): a quarter of the file system's size, at least 1 GiB.  On a small
    /dev/shm (64 MiB in a default Docker container) nothing is left for a tier."""
    return max(SHM_RESERVE_MIN, int(shutil.disk_usage(path).total) // 4)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged user may still write on the file system holding path."""
    return int(shutil.disk_usage(path).free)


def filesystem_type(path: str) -> str:
    """Type of the file system holding path ("ext4", "tmpfs", "lustre", ...), "" if unknown."""
    real = os.path.realpath(path)
    best, best_len = "", -1
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        inside = real == mount or mount == "/" or real.startswith(mount + "/")
        if inside and len(mount) >= best_len:  # later mounts shadow earlier ones
            best, best_len = part.fstype, len(mount)
    return best


def is_local_fstype(fstype: str) -> bool:
    fstype = fstype.lower()
    if fstype in NON_LOCAL_FSTYPES:
        return False
    return not any(fstype == p or fstype.startswith(p + ".") for p in NON_LOCAL_FSTYPE_PREFIXES)


# --------------------------------------------------------------------------- YAML reading


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable key: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _parse_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc)
        if problem.startswith("duplicate key"):
            fix = "keep only one of them"
        else:
            fix = (
                "check the indentation there and quote values that contain ': ' or ' #' "
                '(e.g. description: "node: 192 GB")'
            )
        raise ProfileError(
            f"{source}: {where}: YAML error: {problem}; {fix}",
            source=source,
            key=where,
        ) from None
    if data is None:
        raise ProfileError(
            f"{source}: the file is empty; start from a shipped profile, e.g. "
            f"`tiering profile show auto` and profiles/auto.yaml",
            source=source,
        )
    if not isinstance(data, dict):
        raise ProfileError(
            f"{source}: top level: expected a mapping with keys {', '.join(_TOP_KEYS)}, "
            f"got {type(data).__name__}; see profiles/auto.yaml for the layout",
            source=source,
        )
    return data


# --------------------------------------------------------------------------- validation helpers


def _check_keys(
    data: Mapping, allowed: tuple[str, ...], required: tuple[str, ...], source: str, where: str
) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"valid keys are {', '.join(allowed)}"
            raise _error(source, f"{where}{key}", "unknown key", fix)
    for key in required:
        if key not in data or data[key] is None:
            fix = f"add '{key}:' ({', '.join(required)} are required)"
            raise _error(source, f"{where}{key}", "required key is missing", fix)


def _positive_int(value: Any, default: int, source: str, key: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = f"e.g. {key.rsplit('.', 1)[-1]}: {default}"
        raise _error(source, key, f"must be a whole number of at least 1, got {value!r}", fix)
    return value


def _flag(value: Any, source: str, key: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        fix = f"write {key.rsplit('.', 1)[-1]}: true"
        raise _error(source, key, f"must be true or false, got {value!r}", fix)
    return value


def _bandwidth(value: Any, source: str, key: str) -> dict[int, float]:
    if value is None:
        return {}
    example = "e.g. bandwidth: {1: 200, 16: 1500} (MB/s by thread count)"
    if not isinstance(value, dict):
        raise _error(source, key, f"must map thread counts to MB/s, got {value!r}", example)
    table: dict[int, float] = {}
    for threads, mbps in value.items():
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise _error(source, f"{key}[{threads!r}]", "thread count must be a whole number >= 1", example)
        if isinstance(mbps, bool) or not isinstance(mbps, (int, float)) or mbps <= 0:
            problem = f"bandwidth must be a positive number of MB/s, got {mbps!r}"
            raise _error(source, f"{key}[{threads}]", problem, example)
        table[threads] = float(mbps)
    return dict(sorted(table.items()))


def _usable_dir_problem(path: str) -> str | None:
    """Why tier-run could not create its private directory in path, or None if it can."""
    if not os.path.exists(path):
        return f"path {path} does not exist"
    if not os.path.isdir(path):
        return f"path {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"path {path} is not writable by this user"
    return None


# --------------------------------------------------------------------------- tier resolution


@dataclass
class _Context:
    source: str
    env: Mapping[str, str]
    notes: list[str]
    kept: list[tuple[Tier, int]]  # resolved tiers so far, with their st_dev


def _capacity_spec(raw: Any, kind: str, source: str, key: str) -> str:
    """Validate the syntax of a capacity (independent of this machine); return it as text."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise _error(source, key, f"cannot read capacity {raw!r}", "write e.g. 64GiB, 25% or auto")
    if isinstance(raw, (int, float)):  # a bare YAML number is bytes
        if raw < 0:
            raise _error(source, key, f"capacity {raw!r} is negative", "write e.g. 64GiB, 25% or auto")
        return str(int(raw))
    spec = raw.strip()
    if spec.lower() == "auto":
        if kind != "memory":
            raise _error(
                source, key, "'auto' is only for memory tiers",
                "give a filesystem tier a size (e.g. 100GiB) or a share of its free space (e.g. 50%)",
            )
        return "auto"
    try:
        parse_size(spec, free=0)
    except ValueError as exc:
        fix = "N% (of the free space) and auto (memory tiers) are also accepted"
        raise _error(source, key, str(exc), fix) from None
    return spec


def _spec_and_size(spec: str, size: int) -> str:
    human = human_bytes(size)
    return spec if human.replace(" ", "") == spec.replace(" ", "") else f"{spec} ({human})"


def _resolve_capacity(
    spec: str, kind: str, path: str, optional: bool, name: str, ctx: _Context, key: str
) -> int:
    free = free_bytes(path)
    # Memory tiers: "auto" and "N%" are also capped by memory_tier_bound(), i.e. half of
    # the available RAM and half of what a cgroup memory limit still leaves, because
    # tmpfs pages are charged to the job's memory cgroup (see DESIGN.md, rule 2).
    if spec == "auto":
        return max(0, min(free - shm_reserve(path), memory_tier_bound()))
    if spec.endswith("%"):
        capacity = parse_size(spec, free=free)
        if kind == "memory" and capacity > (bound := memory_tier_bound()):
            ctx.notes.append(
                f"tier '{name}': {spec} of {path} capped at {human_bytes(bound)} "
                f"(half of the available RAM / of the cgroup memory headroom)"
            )
            return bound
        return capacity
    capacity = parse_size(spec)
    limit, what = free, f"free at {path}"
    if kind == "memory":
        room = cgroup_memory_headroom()
        if room is not None and room < limit:
            limit, what = room, "left under this job's cgroup memory limit"
    if capacity <= limit:
        return capacity
    if optional:
        ctx.notes.append(f"tier '{name}': capacity {spec} reduced to the {human_bytes(limit)} {what}")
        return limit
    raise _error(
        ctx.source, key,
        f"{_spec_and_size(spec, capacity)} is more than the {human_bytes(limit)} {what}",
        "use a smaller size, a percentage (e.g. 50%)" + (", auto" if kind == "memory" else "")
        + " or mark the tier optional: true to use what is free",
    )


def _tier_path(raw: dict, name: str, optional: bool, local_only: bool, ctx: _Context, key: str) -> str | None:
    """Expanded absolute path of a tier; None when an optional tier cannot use it (noted)."""
    path = os.path.expanduser(_expand(raw["path"], ctx, key))
    if not os.path.isabs(path):
        fix = "write a full path such as /dev/shm or ${TMPDIR}/tiering"
        raise _error(ctx.source, key, f"{path!r} is not an absolute path", fix)
    path = os.path.normpath(path)
    problem = _usable_dir_problem(path)
    if problem is None and local_only:
        problem = _non_local_problem(path, ctx)
    if problem is None:
        return path
    if optional:
        ctx.notes.append(f"tier '{name}' dropped: {problem}")
        return None
    if "(local_only)" in problem:
        fix = "point it at a node-local disk or mark the tier optional: true"
    else:
        fix = "create it or mark the tier optional: true"
        if "$" in str(raw["path"]) and "${" not in str(raw["path"]):
            fix += " (variables must be written ${VAR}, with braces)"
    raise _error(ctx.source, key, problem, fix)


def _tier_identity(raw: Any, index: int, source: str) -> tuple[str, str]:
    """Check a tier's keys, name and kind; return (name, kind)."""
    where = f"tiers[{index}]."
    if not isinstance(raw, dict):
        fix = "write each tier as '- name: ...' with kind, path and capacity"
        raise _error(source, f"tiers[{index}]", f"expected a mapping, got {raw!r}", fix)
    _check_keys(raw, _TIER_KEYS, _TIER_REQUIRED, source, where)
    name, kind = raw["name"], raw["kind"]
    if not isinstance(name, str) or not _TIER_NAME_RE.match(name):
        fix = "use letters, digits, '_', '-' or '.', e.g. ram or ssd"
        raise _error(source, where + "name", f"bad tier name {name!r}", fix)
    if kind not in TIER_KINDS:
        close = difflib.get_close_matches(str(kind), TIER_KINDS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise _error(source, where + "kind", f"unknown kind {kind!r}", f"{hint}kind is memory or filesystem")
    return name, kind


def _resolve_tier(raw: Any, index: int, ctx: _Context) -> Tier | None:
    """Validate one tier and resolve it on this machine; None when an optional tier is dropped."""
    src, where = ctx.source, f"tiers[{index}]."
    name, kind = _tier_identity(raw, index, src)
    threads = _positive_int(raw.get("threads"), DEFAULT_TIER_THREADS, src, where + "threads")
    optional = _flag(raw.get("optional"), src, where + "optional")
    local_only = _flag(raw.get("local_only"), src, where + "local_only")
    bandwidth = _bandwidth(raw.get("bandwidth"), src, where + "bandwidth")
    raw_capacity = raw["capacity"]
    if isinstance(raw_capacity, str) and "${" in raw_capacity:  # e.g. ${RAM_TIER:-auto}
        raw_capacity = _expand(raw_capacity, ctx, where + "capacity")
    # Syntax is checked before the path, so typos show up even where the tier is dropped.
    spec = _capacity_spec(raw_capacity, kind, src, where + "capacity")

    path = _tier_path(raw, name, optional, local_only, ctx, where + "path")
    if path is None:
        return None
    capacity = _resolve_capacity(spec, kind, path, optional, name, ctx, where + "capacity")
    if capacity <= 0:
        if optional:
            ctx.notes.append(f"tier '{name}' dropped: capacity {spec} resolves to 0 bytes at {path}")
            return None
        why = f"{human_bytes(free_bytes(path))} free"
        if kind == "memory" and spec == "auto":
            why += f", of which {human_bytes(shm_reserve(path))} stay free for the job's own shared memory"
        if kind == "memory" and (spec == "auto" or spec.endswith("%")):
            why += f", memory bound {human_bytes(memory_tier_bound())} (half of available RAM / cgroup headroom)"
        fix = "free some space, give a size, or mark the tier optional: true"
        raise _error(src, where + "capacity", f"{spec} resolves to 0 bytes at {path} ({why})", fix)
    return Tier(
        name=name, kind=kind, path=path, capacity=capacity, capacity_spec=spec,
        threads=threads, bandwidth=bandwidth,
    )


def _expand(value: Any, ctx: _Context, key: str) -> str:
    if not isinstance(value, str):
        raise _error(ctx.source, key, f"expected text, got {value!r}", "quote the value")
    try:
        return expand_vars(value, ctx.env)
    except _ExpansionError as exc:
        raise _error(ctx.source, key, exc.problem, exc.fix) from None


def _non_local_problem(path: str, ctx: _Context) -> str | None:
    """Why path is not a node-local disk distinct from the faster tiers (local_only), or None."""
    fstype = filesystem_type(path)
    if fstype and not is_local_fstype(fstype):
        return f"path {path} is on a {fstype} file system, not a node-local disk (local_only)"
    dev = os.stat(path).st_dev
    for tier, tier_dev in ctx.kept:
        if tier_dev == dev:
            return f"path {path} is on the same file system as tier '{tier.name}' ({tier.path}) (local_only)"
    return None


# --------------------------------------------------------------------------- profile assembly


def _build_profile(data: dict[str, Any], source: str, env: Mapping[str, str]) -> Profile:
    _check_keys(data, _TOP_KEYS, _TOP_REQUIRED, source, "")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise _error(source, "name", f"expected a profile name, got {name!r}", "e.g. name: mycluster")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _error(source, "description", "expected one line of text", "quote it")

    raw_tiers = data["tiers"]
    if not isinstance(raw_tiers, list) or not raw_tiers:
        fix = "write each tier as '- name: ram' with kind, path and capacity"
        raise _error(source, "tiers", "expected a non-empty list of tiers, fastest first", fix)
    if len(raw_tiers) > MAX_TIERS:
        problem = f"{len(raw_tiers)} tiers given, the shared index holds at most {MAX_TIERS}"
        raise _error(source, "tiers", problem, f"keep the {MAX_TIERS} fastest tiers")
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_tiers):
        tier_name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(tier_name, str) and tier_name in seen:
            problem = f"duplicate tier name {tier_name!r} (also tiers[{seen[tier_name]}])"
            raise _error(source, f"tiers[{i}].name", problem, "give each tier its own name")
        if isinstance(tier_name, str):
            seen[tier_name] = i

    ctx = _Context(source=source, env=env, notes=[], kept=[])
    for i, raw in enumerate(raw_tiers):
        tier = _resolve_tier(raw, i, ctx)
        if tier is not None:
            ctx.kept.append((tier, os.stat(tier.path).st_dev))
    if not ctx.kept:
        raise ProfileError(
            f"{source}: tiers: no tier is usable on this machine ({'; '.join(ctx.notes)}); "
            f"add a tier that exists here, e.g. /dev/shm with capacity auto, or fix the paths",
            source=source, key="tiers",
        )
    for i, (a, dev_a) in enumerate(ctx.kept):
        for b, dev_b in ctx.kept[i + 1 :]:
            if dev_a == dev_b:
                ctx.notes.append(
                    f"tiers '{a.name}' and '{b.name}' share one file system; "
                    "each fits what is free, together they may not"
                )

    pfs = _build_pfs(data.get("pfs"), source)
    return Profile(
        name=name, source=source, description=description.strip(),
        tiers=tuple(t for t, _ in ctx.kept), pfs=pfs, notes=tuple(ctx.notes),
    )


def _build_pfs(raw: Any, source: str) -> Pfs:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _error(source, "pfs", f"expected a mapping, got {raw!r}", f"keys are {', '.join(_PFS_KEYS)}")
    _check_keys(raw, _PFS_KEYS, (), source, "pfs.")
    latency = raw.get("latency_ms")
    if latency is not None and (isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0):
        problem = f"must be a number of milliseconds >= 0, got {latency!r}"
        raise _error(source, "pfs.latency_ms", problem, "e.g. latency_ms: 1.0, or leave it out")
    return Pfs(
        read_threads=_positive_int(
            raw.get("read_threads"), DEFAULT_PFS_READ_THREADS, source, "pfs.read_threads"
        ),
        bandwidth=_bandwidth(raw.get("bandwidth"), source, "pfs.bandwidth"),
        latency_ms=None if latency is None else float(latency),
    )


# --------------------------------------------------------------------------- shipped profiles, entry points


def _shipped_dir() -> Any:
    """Directory (Traversable) holding the shipped profiles, installed or in a source checkout."""
    try:
        return importlib.resources.files("tiering.profiles")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "profiles"


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    directory = _shipped_dir()
    return sorted(
        entry.name[: -len(".yaml")]
        for entry in directory.iterdir()
        if entry.name.endswith(".yaml") and entry.is_file()
    )


def _load_text(text: str, source: str, env: Mapping[str, str] | None) -> Profile:
    env = os.environ if env is None else env
    return _build_profile(_parse_yaml(text, source), source, env)


def check_profile(path: str, env: Mapping[str, str] | None = None) -> Profile:
    """Load and validate a profile file; raises ProfileError (what `tiering profile check` runs)."""
    file = Path(os.path.expanduser(str(path)))
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(
            f"{file}: profile file not found; give an existing YAML file or a shipped profile name "
            f"({', '.join(list_profiles())})",
            source=str(file),
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(
            f"{file}: cannot read the profile ({exc}); check the path and its permissions", source=str(file)
        ) from None
    return _load_text(text, str(file), env)


def load_profile(spec: str | None = None, env: Mapping[str, str] | None = None) -> Profile:
    """Load a profile: None or "auto" -> the auto profile; a shipped name; or a path to a YAML file.

    Anything containing "/" or ending in .yaml/.yml is a path.  ``env`` (default
    os.environ) is used for ${VAR} expansion and the job id.
    """
    name = "auto" if spec is None else str(spec).strip()
    if "/" in name or name.endswith((".yaml", ".yml")):
        return check_profile(name, env)
    shipped = list_profiles()
    if name not in shipped:
        close = difflib.get_close_matches(name, shipped, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ProfileError(
            f"unknown profile {name!r}: {hint}shipped profiles are {', '.join(shipped)}; "
            f"or give the path to a YAML file (e.g. ./mycluster.yaml)",
            source=name,
        )
    entry = _shipped_dir() / f"{name}.yaml"
    return _load_text(entry.read_text(encoding="utf-8"), str(entry), env)


# --------------------------------------------------------------------------- display


def _format_bandwidth(table: dict[int, float]) -> str:
    if not table:
        return "not given"
    return ", ".join(f"{t} thread{'s' if t > 1 else ''}: {mbps:g} MB/s" for t, mbps in table.items())


def format_profile(p: Profile) -> str:
    """The resolved profile in human-readable form (`tiering profile show`)."""
    lines = [f"profile {p.name}", f"  source:      {p.source}"]
    if p.description:
        lines.append(f"  description: {p.description}")
    lines.append("tiers (fastest first):")
    for i, t in enumerate(p.tiers, 1):
        lines += [
            f"  {i}. {t.name} ({t.kind})",
            f"     path:      {t.path}",
            f"     capacity:  {human_bytes(t.capacity)} (spec: {t.capacity_spec})",
            f"     threads:   {t.threads}",
            f"     bandwidth: {_format_bandwidth(t.bandwidth)}",
        ]
    latency = "not given" if p.pfs.latency_ms is None else f"{p.pfs.latency_ms:g} ms"
    lines += [
        "pfs:",
        f"  read threads: {p.pfs.read_threads}",
        f"  bandwidth:    {_format_bandwidth(p.pfs.bandwidth)}",
        f"  latency:      {latency}",
    ]
    if p.notes:
        lines.append("notes:")
        lines += [f"  - {note}" for note in p.notes]
    return "\n".join(lines)
