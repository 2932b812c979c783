"""Sizes: the one parser and formatter of byte counts (profiles, command
options, the data-set generator, reports); and `some_of`, which keeps a list
of names in a message short.

Decimal units (KB, MB, ...) are powers of 1000, binary ones (KiB, MiB, ...)
powers of 1024, case-insensitive; a bare number is bytes; a lone K, M, G, T
or P is refused as ambiguous; "N%" is a share of a given free space.
"""
from __future__ import annotations

import difflib
import re
from typing import Any

__all__ = ["human_bytes", "parse_size", "some_of"]

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z%]*)\s*$")


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


def some_of(names: list[str], shown: int = 5) -> str:
    """A list of names for a message, at most `shown` of them and a count:
    "a, b, c, d, e and 995 more" (ImageNet has 1,000 classes)."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def plain_number(value: Any) -> Any:
    """json's default= for the numpy numbers of a record (sizes and counts
    kept in arrays): the Python number."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
