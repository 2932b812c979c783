"""Resolving a profile on this node: ${VAR} expansion, tier paths, capacities
(auto, N%, sizes) against free space, memory and the cgroup, optional and
local-only tiers."""
from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from ..rundirs import SAFE_PARENT_FIX, parent_problem, relation
from ..units import human_bytes, parse_size
from . import node
from .expand import _ExpansionError, expand_vars
from .model import (
    DEFAULT_CHUNKED_COPY_MB,
    DEFAULT_NETWORK_LATENCY_MS,
    DEFAULT_PFS_READ_THREADS,
    DEFAULT_TIER_THREADS,
    MAX_TIERS,
    TIER_KINDS,
    Errors,
    Network,
    NoUsableTier,
    Pfs,
    Profile,
    ProfileError,
    Tier,
    _error,
)
from .schema import (
    NETWORK_KEYS,
    PFS_KEYS,
    TIER_KEYS,
    TIER_REQUIRED,
    TOP_KEYS,
    TOP_REQUIRED,
    bandwidth,
    check_keys,
    flag,
    positive_int,
)

log = logging.getLogger("tiering")

_TIER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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
    free = node.free_bytes(path)
    # Memory tiers: "auto" and "N%" are also capped by memory_tier_bound(), i.e. half of
    # the available RAM and half of what a cgroup memory limit still leaves, because
    # tmpfs pages are charged to the job's memory cgroup (README, "Sizing the memory tier").
    if spec == "auto":
        return max(0, min(free - node.shm_reserve(path), node.memory_tier_bound()))
    if spec.endswith("%"):
        capacity = parse_size(spec, free=free)
        if kind == "memory" and capacity > (bound := node.memory_tier_bound()):
            ctx.notes.append(
                f"tier '{name}': {spec} of {path} capped at {human_bytes(bound)} "
                f"(half of the available RAM / of the cgroup memory headroom)"
            )
            return bound
        return capacity
    capacity = parse_size(spec)
    limit, what = free, f"free at {path}"
    if kind == "memory":
        room = node.cgroup_memory_headroom()
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
    problem = node.usable_dir_problem(path)
    fix = "create it or mark the tier optional: true"
    if "$" in str(raw["path"]) and "${" not in str(raw["path"]):
        fix += " (variables must be written ${VAR}, with braces)"
    if problem is None and (unsafe := parent_problem(path)) is not None:
        # NOTE [tier directories]: the tier's private directory must not be renamable by others
        problem, fix = f"path {path} is not safe for a private directory: {unsafe}", SAFE_PARENT_FIX
        if optional:
            log.warning("tier '%s' dropped: %s; %s", name, problem, fix)
    if problem is None and local_only:
        problem = _non_local_problem(path, ctx)
        fix = "point it at a node-local disk or mark the tier optional: true"
    if problem is None:
        return path
    if optional:
        ctx.notes.append(f"tier '{name}' dropped: {problem}")
        return None
    raise _error(ctx.source, key, problem, fix)


IN_DATA_FIX = ("tier-run's directory there, and the copies in it, would be part of the data set (COMMAND would "
               "list them); put the tier's path outside every --data directory, or give --data a directory that "
               "does not hold it")


def _shown(path: str) -> str:
    """path, and where it leads when symlinks take it elsewhere."""
    real = os.path.realpath(path)
    return path if real == os.path.normpath(path) else f"{path} ({real})"


def data_root_problems(profile: Profile, data: Sequence[str]) -> list[str]:
    """One line for each tier whose path is a data root or inside one
    (symlinks resolved): the tier's private directory would be in the data
    set.  A data root inside a tier's path is fine: the private directory is
    made new beside it (NOTE [tier directories])."""
    problems = []
    for t in profile.tiers:
        for root in data:
            if (how := relation(t.path, root)) in ("is", "is inside"):
                what = "is the data root" if how == "is" else "is inside the data root"
                problems.append(f"{profile.source}: tier '{t.name}': path {_shown(t.path)} {what} {_shown(root)}: "
                                f"{IN_DATA_FIX}")
                break
    return problems


def _tier_name(name: Any, source: str, key: str) -> str:
    if not isinstance(name, str) or not _TIER_NAME_RE.match(name):
        fix = "use letters, digits, '_', '-' or '.', e.g. ram or ssd"
        raise _error(source, key, f"bad tier name {name!r}", fix)
    return name


def _tier_kind(kind: Any, source: str, key: str) -> str:
    if kind not in TIER_KINDS:
        close = difflib.get_close_matches(str(kind), TIER_KINDS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise _error(source, key, f"unknown kind {kind!r}", f"{hint}kind is memory or filesystem")
    return str(kind)


def _tier_capacity_spec(raw_capacity: Any, kind: str, ctx: _Context, key: str) -> str:
    if isinstance(raw_capacity, str) and "${" in raw_capacity:  # e.g. ${RAM_TIER:-auto}
        raw_capacity = _expand(raw_capacity, ctx, key)
    return _capacity_spec(raw_capacity, kind, ctx.source, key)


def _resolve_tier(raw: Any, index: int, ctx: _Context) -> Tier | None:
    """Validate one tier and resolve it on this machine; None when an optional
    tier is dropped.  Raises one ProfileError with every problem of the tier."""
    src, where = ctx.source, f"tiers[{index}]."
    if not isinstance(raw, dict):
        fix = "write each tier as '- name: ...' with kind, path and capacity"
        raise _error(src, f"tiers[{index}]", f"expected a mapping, got {raw!r}", fix)
    errs = Errors()
    errs.run(check_keys, raw, TIER_KEYS, TIER_REQUIRED, src, where)
    name = errs.run(_tier_name, raw["name"], src, where + "name") if raw.get("name") is not None else None
    kind = errs.run(_tier_kind, raw["kind"], src, where + "kind") if raw.get("kind") is not None else None
    threads = errs.run(positive_int, raw.get("threads"), DEFAULT_TIER_THREADS, src, where + "threads")
    chunked = errs.run(positive_int, raw.get("chunked_copy_mb"), DEFAULT_CHUNKED_COPY_MB, src,
                       where + "chunked_copy_mb")
    optional = bool(errs.run(flag, raw.get("optional"), src, where + "optional"))
    local_only = bool(errs.run(flag, raw.get("local_only"), src, where + "local_only"))
    bw = errs.run(bandwidth, raw.get("bandwidth"), src, where + "bandwidth")
    # Syntax is checked before the path, so typos show up even where the tier is dropped.
    spec = None
    if kind is not None and raw.get("capacity") is not None:
        spec = errs.run(_tier_capacity_spec, raw["capacity"], kind, ctx, where + "capacity")
    path = None
    if raw.get("path") is not None:
        path = errs.run(_tier_path, raw, name or f"tiers[{index}]", optional, local_only, ctx, where + "path")
    errs.raise_any()
    assert name is not None and kind is not None and spec is not None and threads is not None and bw is not None
    assert chunked is not None
    if path is None:
        return None
    capacity = _resolve_capacity(spec, kind, path, optional, name, ctx, where + "capacity")
    if capacity <= 0:
        if optional:
            ctx.notes.append(f"tier '{name}' dropped: capacity {spec} resolves to 0 bytes at {path}")
            return None
        why = f"{human_bytes(node.free_bytes(path))} free"
        if kind == "memory" and spec == "auto":
            why += f", of which {human_bytes(node.shm_reserve(path))} stay free for the job's own shared memory"
        if kind == "memory" and (spec == "auto" or spec.endswith("%")):
            why += f", memory bound {human_bytes(node.memory_tier_bound())} (half of available RAM / cgroup headroom)"
        fix = "free some space, give a size, or mark the tier optional: true"
        raise _error(src, where + "capacity", f"{spec} resolves to 0 bytes at {path} ({why})", fix)
    return Tier(
        name=name, kind=kind, path=path, capacity=capacity, capacity_spec=spec,
        threads=threads, bandwidth=bw, chunked_copy_mb=chunked,
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
    fstype = node.filesystem_type(path)
    if fstype and not node.is_local_fstype(fstype):
        return f"path {path} is on a {fstype} file system, not a node-local disk (local_only)"
    dev = os.stat(path).st_dev
    for tier, tier_dev in ctx.kept:
        if tier_dev == dev:
            return f"path {path} is on the same file system as tier '{tier.name}' ({tier.path}) (local_only)"
    return None


def _check_name(name: Any, source: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise _error(source, "name", f"expected a profile name, got {name!r}", "e.g. name: mycluster")


def _check_description(description: Any, source: str) -> None:
    if description is not None and not isinstance(description, str):
        raise _error(source, "description", "expected one line of text", "quote it")


def _check_tier_list(raw_tiers: Any, source: str) -> list[Any]:
    if not isinstance(raw_tiers, list) or not raw_tiers:
        fix = "write each tier as '- name: ram' with kind, path and capacity"
        raise _error(source, "tiers", "expected a non-empty list of tiers, fastest first", fix)
    return raw_tiers


def _check_tier_names(raw_tiers: list[Any], source: str) -> None:
    found = []
    if len(raw_tiers) > MAX_TIERS:
        problem = f"{len(raw_tiers)} tiers given, the shared index holds at most {MAX_TIERS}"
        found.append(_error(source, "tiers", problem, f"keep the {MAX_TIERS} fastest tiers"))
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_tiers):
        tier_name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(tier_name, str) and tier_name in seen:
            problem = f"duplicate tier name {tier_name!r} (also tiers[{seen[tier_name]}])"
            found.append(_error(source, f"tiers[{i}].name", problem, "give each tier its own name"))
        if isinstance(tier_name, str):
            seen.setdefault(tier_name, i)
    if found:
        raise ProfileError.combine(found)


def build_profile(data: dict[str, Any], source: str, env: Mapping[str, str]) -> Profile:
    """The profile resolved on this node; one ProfileError lists every problem."""
    errs = Errors()
    errs.run(check_keys, data, TOP_KEYS, TOP_REQUIRED, source, "")
    if data.get("name") is not None:
        errs.run(_check_name, data["name"], source)
    errs.run(_check_description, data.get("description"), source)
    ctx = _Context(source=source, env=env, notes=[], kept=[])
    raw_tiers = errs.run(_check_tier_list, data["tiers"], source) if data.get("tiers") is not None else None
    if raw_tiers is not None:
        errs.run(_check_tier_names, raw_tiers, source)
        for i, raw in enumerate(raw_tiers):
            tier = errs.run(_resolve_tier, raw, i, ctx)
            if tier is not None:
                ctx.kept.append((tier, os.stat(tier.path).st_dev))
    pfs = errs.run(_build_pfs, data.get("pfs"), source)
    network = errs.run(_build_network, data.get("network"), ctx) if data.get("network") is not None else None
    errs.raise_any()
    assert pfs is not None
    if not ctx.kept:
        raise NoUsableTier(
            f"{source}: tiers: no tier is usable on this machine ({'; '.join(ctx.notes)}); "
            f"give a profile with a tier that has room here, e.g. a local disk (kind: filesystem, path: "
            f"/local/scratch, capacity: 50%), with --profile FILE (`tiering profile check FILE` tries it)",
            source=source, notes=ctx.notes,
        )
    for i, (a, dev_a) in enumerate(ctx.kept):
        for b, dev_b in ctx.kept[i + 1 :]:
            if dev_a == dev_b:
                ctx.notes.append(
                    f"tiers '{a.name}' and '{b.name}' share one file system; "
                    "each fits what is free, together they may not"
                )
    return Profile(
        name=data["name"], source=source, description=(data.get("description") or "").strip(),
        tiers=tuple(t for t, _ in ctx.kept), pfs=pfs, network=network, notes=tuple(ctx.notes),
    )


def _latency(latency: Any, source: str, key: str = "pfs.latency_ms") -> float | None:
    if latency is not None and (isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0):
        problem = f"must be a number of milliseconds >= 0, got {latency!r}"
        raise _error(source, key, problem, "e.g. latency_ms: 1.0, or leave it out")
    return None if latency is None else float(latency)


def _network_bandwidth(value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _error(source, "network.bandwidth", f"must be a positive number of MB/s, got {value!r}",
                     "e.g. bandwidth: 12000 (MB/s between two nodes: 100 Gbit/s is 12500)")
    return float(value)


def _interface(value: Any, ctx: _Context) -> str:
    """A network interface of this node (its IPv4 address is where the peer service listens)."""
    name = _expand(value, ctx, "network.interface") if isinstance(value, str) else value
    if not isinstance(name, str) or not name:
        raise _error(ctx.source, "network.interface", f"must be the name of a network interface, got {value!r}",
                     "e.g. interface: ib0, or leave it out (the address the host name resolves to)")
    addrs = psutil.net_if_addrs()
    if name not in addrs:
        raise _error(ctx.source, "network.interface", f"no interface {name!r} on this node",
                     f"interfaces here: {', '.join(sorted(addrs))}; or leave it out (the address the host "
                     "name resolves to)")
    return name


def _build_network(raw: Any, ctx: _Context) -> Network:
    """``network: {bandwidth, latency_ms, interface}`` between the nodes of a multi-node job."""
    source = ctx.source
    if not isinstance(raw, dict):
        raise _error(source, "network", f"expected a mapping, got {raw!r}",
                     f"keys are {', '.join(NETWORK_KEYS)}, e.g. network: {{bandwidth: 12000, interface: ib0}}")
    errs = Errors()
    errs.run(check_keys, raw, NETWORK_KEYS, ("bandwidth",), source, "network.")
    bw = errs.run(_network_bandwidth, raw.get("bandwidth"), source) if raw.get("bandwidth") is not None else None
    latency = errs.run(_latency, raw.get("latency_ms"), source, "network.latency_ms")
    iface = errs.run(_interface, raw["interface"], ctx) if raw.get("interface") is not None else None
    errs.raise_any()
    assert bw is not None
    return Network(bandwidth=bw, latency_ms=DEFAULT_NETWORK_LATENCY_MS if latency is None else latency,
                   interface=iface)


def _build_pfs(raw: Any, source: str) -> Pfs:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _error(source, "pfs", f"expected a mapping, got {raw!r}", f"keys are {', '.join(PFS_KEYS)}")
    errs = Errors()
    errs.run(check_keys, raw, PFS_KEYS, (), source, "pfs.")
    latency = errs.run(_latency, raw.get("latency_ms"), source)
    threads = errs.run(positive_int, raw.get("read_threads"), DEFAULT_PFS_READ_THREADS, source, "pfs.read_threads")
    bw = errs.run(bandwidth, raw.get("bandwidth"), source, "pfs.bandwidth")
    errs.raise_any()
    assert threads is not None and bw is not None
    return Pfs(read_threads=threads, bandwidth=bw, latency_ms=latency)
