"""Reading a profile's YAML and checking the shape and types of its values
(independent of the node it is used on)."""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from .model import ProfileError, _error

TOP_KEYS = ("name", "description", "tiers", "pfs", "network")
TOP_REQUIRED = ("name", "tiers")
TIER_KEYS = ("name", "kind", "path", "capacity", "threads", "bandwidth", "optional", "local_only",
             "chunked_copy_mb")
TIER_REQUIRED = ("name", "kind", "path", "capacity")
PFS_KEYS = ("read_threads", "bandwidth", "latency_ms")
NETWORK_KEYS = ("bandwidth", "latency_ms", "interface")


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


def parse_yaml(text: str, source: str) -> dict[str, Any]:
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
            f"{source}: top level: expected a mapping with keys {', '.join(TOP_KEYS)}, "
            f"got {type(data).__name__}; see profiles/auto.yaml for the layout",
            source=source,
        )
    return data


def check_keys(
    data: Mapping, allowed: tuple[str, ...], required: tuple[str, ...], source: str, where: str
) -> None:
    """Every unknown key and every missing required key, in one error."""
    found = []
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"valid keys are {', '.join(allowed)}"
            found.append(_error(source, f"{where}{key}", "unknown key", fix))
    for key in required:
        if key not in data or data[key] is None:
            fix = f"add '{key}:' ({', '.join(required)} are required)"
            found.append(_error(source, f"{where}{key}", "required key is missing", fix))
    if found:
        raise ProfileError.combine(found)


def positive_int(value: Any, default: int, source: str, key: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = f"e.g. {key.rsplit('.', 1)[-1]}: {default}"
        raise _error(source, key, f"must be a whole number of at least 1, got {value!r}", fix)
    return value


def flag(value: Any, source: str, key: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        fix = f"write {key.rsplit('.', 1)[-1]}: true"
        raise _error(source, key, f"must be true or false, got {value!r}", fix)
    return value


def bandwidth(value: Any, source: str, key: str) -> dict[int, float]:
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
