"""What a simulated policy reports, and how it is printed."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import Outcome
from .streams import Streams

MB = 1_000_000


@dataclass
class PolicyResult:
    seconds: float
    epochs: list[float]
    pfs_bytes: int
    peer_bytes: int
    local_bytes: int
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"seconds": self.seconds, "epochs": self.epochs, "pfs_bytes": self.pfs_bytes,
                                "peer_bytes": self.peer_bytes, "local_bytes": self.local_bytes}
        if self.note:
            d["note"] = self.note
        return d


def epoch_times(barriers: np.ndarray, batch_epoch: np.ndarray, start: float = 0.0) -> list[float]:
    """Seconds per epoch from the end time of each batch (epoch 1 includes the
    time before the first batch)."""
    out, prev = [], start
    for e in range(int(batch_epoch.max(initial=-1)) + 1):
        idx = np.flatnonzero(batch_epoch == e)
        if len(idx) == 0:
            out.append(0.0)
            continue
        end = float(barriers[idx[-1]])
        out.append(end - prev)
        prev = end
    return out


def result_of(o: Outcome, st: Streams, *, bulk_pfs_mb: float = 0.0, bulk_peer_mb: float = 0.0,
              note: str = "") -> PolicyResult:
    total = float(o.barriers[-1]) if len(o.barriers) else 0.0
    return PolicyResult(total, epoch_times(o.barriers, st.batch_epoch), round((o.pfs_mb + bulk_pfs_mb) * MB),
                        round((o.peer_mb + bulk_peer_mb) * MB), round(o.local_mb * MB), note)


@dataclass
class Report:
    policies: dict[str, PolicyResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"policies": {k: v.as_dict() for k, v in self.policies.items()}}
        if self.skipped:
            d["skipped"] = self.skipped
        return d

    def format(self, human_bytes) -> str:  # type: ignore[no-untyped-def]
        lines = [f"{'policy':<22} {'seconds':>11} {'vs lower':>9}  {'PFS':>10} {'peer':>10} {'local':>10}  epochs (s)"]
        lb = self.policies.get("lower-bound")
        for name, r in self.policies.items():
            ratio = f"{r.seconds / lb.seconds:.2f}x" if lb is not None and lb.seconds > 0 else "-"
            ep = " ".join(f"{e:.1f}" for e in r.epochs[:12]) + (" ..." if len(r.epochs) > 12 else "")
            lines.append(f"{name:<22} {r.seconds:>11.2f} {ratio:>9}  {human_bytes(r.pfs_bytes):>10} "
                         f"{human_bytes(r.peer_bytes):>10} {human_bytes(r.local_bytes):>10}  {ep}")
        for name, why in self.skipped.items():
            lines.append(f"{name:<22} skipped: {why}")
        return "\n".join(lines)
