"""What a profile is once loaded: tiers (fastest first) and PFS facts, with
every capacity resolved to bytes on this node."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MAX_TIERS = 4  # the shared index (shim/tiering.h) has room for at most 4 tier roots
DEFAULT_TIER_THREADS = 4
DEFAULT_CHUNKED_COPY_MB = 64   # files of this many MiB or more are copied in parallel chunks
DEFAULT_PFS_READ_THREADS = 8
TIER_KINDS = ("memory", "filesystem")


class ProfileError(Exception):
    """A profile cannot be used.  The message names the file, the key and the
    fix; when a profile has several errors, it lists them all, one a line
    (`errors` holds each, `key` is the first one's)."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        super().__init__(message)
        self.source = source
        self.key = key
        self.errors: tuple[ProfileError, ...] = (self,)

    @staticmethod
    def combine(errors: list[ProfileError]) -> ProfileError:
        """One error standing for all of `errors` (flattened, in order)."""
        flat = tuple(e for err in errors for e in err.errors)
        if len(flat) == 1:
            return flat[0]
        combined = ProfileError("\n".join(str(e) for e in flat), source=flat[0].source, key=flat[0].key)
        combined.errors = flat
        return combined


class NoUsableTier(ProfileError):
    """Every tier of a profile was dropped on this machine (each was optional:
    too small, missing, not a local disk); `notes` says why, tier by tier.
    tier-run then runs COMMAND without tiering (NOTE [no usable tier])."""

    def __init__(self, message: str, *, source: str, notes: list[str]):
        super().__init__(message, source=source, key="tiers")
        self.notes = tuple(notes)


class Errors:
    """Collects the ProfileErrors of independent checks, so that one run
    reports every problem of a profile."""

    def __init__(self) -> None:
        self.found: list[ProfileError] = []

    def run(self, check: Callable[..., T], *args: Any) -> T | None:
        """check(*args), or None when it raised a ProfileError (kept)."""
        try:
            return check(*args)
        except ProfileError as e:
            self.found.append(e)
            return None

    def raise_any(self) -> None:
        if self.found:
            raise ProfileError.combine(self.found)


@dataclass(frozen=True)
class Tier:
    name: str  # unique within the profile
    kind: str  # "memory" | "filesystem"
    path: str  # expanded absolute parent directory; tier-run creates a private subdirectory in it
    capacity: int  # bytes, resolved now
    capacity_spec: str  # as written in the YAML, e.g. "64GiB", "25%", "auto"
    threads: int  # copy threads for this tier
    bandwidth: dict[int, float]  # MB/s by thread count, {} when not given
    # files of this many MiB or more are copied in chunks by `threads` threads at once (NOTE [chunked copy])
    chunked_copy_mb: int = DEFAULT_CHUNKED_COPY_MB


@dataclass(frozen=True)
class Pfs:
    read_threads: int  # PFS read concurrency
    bandwidth: dict[int, float]  # MB/s by thread count, {} when not given
    latency_ms: float | None


DEFAULT_PFS_MB_S = 500.0             # one PFS client's MB/s when the profile's pfs.bandwidth says nothing
DEFAULT_NETWORK_BANDWIDTH = 1250.0   # MB/s between two nodes when the profile says nothing (10 Gbit/s)
DEFAULT_NETWORK_LATENCY_MS = 0.1


@dataclass(frozen=True)
class Network:
    """The profile's ``network: {bandwidth, latency_ms, interface}``: how fast
    one node reads a peer's copy, and where the peer service listens."""
    bandwidth: float = DEFAULT_NETWORK_BANDWIDTH   # MB/s between two nodes
    latency_ms: float = DEFAULT_NETWORK_LATENCY_MS
    interface: str | None = None                   # None: the address the host name resolves to


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # file it came from
    description: str
    tiers: tuple[Tier, ...]  # fastest first, at least one
    pfs: Pfs
    network: Network | None = None   # None: not given (multi-node jobs take Network()'s defaults)
    # What the loader decided on this machine: dropped optional tiers, clamped
    # capacities, tiers sharing a file system.  Shown by format_profile.
    notes: tuple[str, ...] = ()


def _error(source: str, key: str, problem: str, fix: str) -> ProfileError:
    return ProfileError(f"{source}: {key}: {problem}; {fix}", source=source, key=key)
