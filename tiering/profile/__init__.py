"""Per-cluster storage profiles: YAML files that say which local tiers exist.

A profile lists the node-local tiers (fastest first) that `tier-run` may use to
cache a data set, and a few facts about the parallel file system (PFS).  The
loader expands ``${VAR}`` references (expand), resolves every capacity to bytes
*on the machine it runs on* (node, resolve), drops optional tiers that cannot be
used here, and raises :class:`ProfileError` with a message naming the file, the
key and the fix (schema).  Nothing here needs the built shim.
"""
from __future__ import annotations

from ..units import human_bytes, parse_size
from .expand import expand_vars, job_id
from .load import check_profile, list_profiles, load_profile
from .model import MAX_TIERS, Network, NoUsableTier, Pfs, Profile, ProfileError, Tier
from .resolve import data_root_problems
from .show import format_profile

__all__ = [
    "MAX_TIERS",
    "Network",
    "Pfs",
    "Profile",
    "NoUsableTier",
    "ProfileError",
    "Tier",
    "check_profile",
    "data_root_problems",
    "expand_vars",
    "format_profile",
    "human_bytes",
    "job_id",
    "list_profiles",
    "load_profile",
    "parse_size",
]
