"""A resolved profile as text (`tiering profile show`)."""
from __future__ import annotations

from ..units import human_bytes
from .model import Profile


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
            f"     chunked:   files of {t.chunked_copy_mb} MiB or more, {t.threads} threads per file",
            f"     bandwidth: {_format_bandwidth(t.bandwidth)}",
        ]
    latency = "not given" if p.pfs.latency_ms is None else f"{p.pfs.latency_ms:g} ms"
    lines += [
        "pfs:",
        f"  read threads: {p.pfs.read_threads}",
        f"  bandwidth:    {_format_bandwidth(p.pfs.bandwidth)}",
        f"  latency:      {latency}",
    ]
    if p.network is not None:
        n = p.network
        lines += [
            "network (between the nodes of a job):",
            f"  bandwidth:    {n.bandwidth:g} MB/s",
            f"  latency:      {n.latency_ms:g} ms",
            f"  interface:    {n.interface or 'the address the host name resolves to'}",
        ]
    if p.notes:
        lines.append("notes:")
        lines += [f"  - {note}" for note in p.notes]
    return "\n".join(lines)
