"""The job's nodes meet: each learns every node's peer-service address and
the job's secret, through a job directory on a file system all nodes share.

NOTE [rendezvous] in docs/design.md.  In ``<base>/tiering-job-<digest>/``
(0700, checked; the base must not let other users rename entries):

- ``secret``: 32 random bytes (hex), written once by node 0, mode 0600.
- ``node-<r>.json``: node r's entry, {"rank", "host", "address", "budget",
  "nonce", "proof"}; budget: the bytes of node r's tiers its home files may
  take (NOTE [home nodes]); proof is an HMAC of the other fields under the
  secret, empty until node r knows the secret is this run's.
- ``ack-<r>``: node 0's HMAC of node r's nonce: node r trusts the secret it
  read only once node 0 acknowledged the nonce node r made at its start, so a
  secret or entries left by an earlier run of the same job id are never used.

Every node waits until it holds a proven entry of every node, up to a
timeout that names the nodes still missing.  The secret never appears on a
command line or in an environment.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..profile.node import filesystem_type, is_local_fstype
from .files import NotPrivate, check_parent, ensure_private_dir, pause, read_private, remove_quietly, write_private
from .identity import NodeIdentity

SECRET_BYTES = 32
DEFAULT_RENDEZVOUS_TIMEOUT = 600.0   # seconds the nodes have to meet (torchrun's default is 900)


class RendezvousError(Exception):
    """The nodes did not meet; the message says which are missing and why that may be."""


class RendezvousStopped(RendezvousError):
    """The wait was ended by this node (its job ends)."""


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    address: str             # host:port of its peer service
    budget: int = 0          # the bytes of its tiers its home files may take


@dataclass(frozen=True)
class Meeting:
    secret: bytes
    peers: tuple[Peer, ...]  # by rank, this node included


def mac(secret: bytes, *fields: Any) -> str:
    return hmac.new(secret, json.dumps(fields).encode(), hashlib.sha256).hexdigest()


def default_base() -> Path:
    """~/.cache/tiering/rendezvous: the home directory is shared by the nodes
    of most clusters; --rendezvous DIR names another place."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tiering" / "rendezvous"


class JobDirectory:
    """This node's side of the rendezvous in a shared job directory."""

    def __init__(self, base: Path, ident: NodeIdentity, poll: float = 0.2):
        if not ident.job_id:
            raise RendezvousError("a rendezvous needs a job id; give --job-id")
        self.ident = ident
        self.poll = poll
        self.base = Path(base)
        self.path = self.base / f"tiering-job-{hashlib.sha256(ident.job_id.encode()).hexdigest()[:24]}"
        self.nonce = secrets.token_hex(16)
        self._secret: bytes | None = None

    # -- files ------------------------------------------------------------------

    def _prepare(self) -> None:
        try:
            self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_parent(self.base)
            ensure_private_dir(self.path)
        except (OSError, NotPrivate) as e:
            raise RendezvousError(f"rendezvous directory: {e}; give --rendezvous DIR, a directory of yours "
                                  "on a file system every node of the job shares") from None

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = read_private(path)
            rec = json.loads(data) if data is not None else None
        except (ValueError, NotPrivate):
            return None
        return rec if isinstance(rec, dict) else None

    def _read_secret(self) -> bytes | None:
        try:
            data = read_private(self.path / "secret")
        except NotPrivate as e:
            raise RendezvousError(f"the job's secret: {e}") from None
        if data is None:
            return None
        try:
            secret = bytes.fromhex(data.decode())
        except ValueError:
            return None
        return secret if len(secret) == SECRET_BYTES else None

    def _entries(self) -> dict[int, dict[str, Any]]:
        out = {}
        for p in self.path.glob("node-*.json"):
            m = re.fullmatch(r"node-(\d+)\.json", p.name)
            rec = self._read_json(p) if m else None
            if m and rec is not None and rec.get("rank") == int(m.group(1)):
                out[int(m.group(1))] = rec
        return out

    @staticmethod
    def _proven(rec: dict[str, Any], secret: bytes) -> bool:
        budget = rec.get("budget")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            return False
        want = mac(secret, rec.get("rank"), rec.get("host"), rec.get("address"), budget, rec.get("nonce"))
        return hmac.compare_digest(want, str(rec.get("proof", "")))

    # -- the meeting --------------------------------------------------------------

    def meet(self, address: str, timeout: float, stop: threading.Event | None = None, budget: int = 0) -> Meeting:
        """Publishes this node's address and budget and waits for every
        node's; a set ``stop`` ends the wait early (RendezvousStopped)."""
        self._prepare()
        rank, count = self.ident.node_rank, self.ident.node_count
        if rank == 0:
            self._secret = secrets.token_bytes(SECRET_BYTES)
            write_private(self.path / "secret", self._secret.hex().encode())
        host = socket.gethostname()
        deadline = time.monotonic() + timeout
        written: dict[str, Any] | None = None
        acks: dict[int, str] = {}
        while True:
            secret = self._secret if rank == 0 else self._read_secret()
            entries = self._entries()
            if rank == 0:
                assert secret is not None
                self._acknowledge(secret, entries, acks)
            trusted = secret is not None and (rank == 0 or self._acknowledged(secret))
            mine = {"rank": rank, "host": host, "address": address, "budget": budget, "nonce": self.nonce,
                    "proof": ""}
            if trusted:
                assert secret is not None
                mine["proof"] = mac(secret, rank, host, address, budget, self.nonce)
            if mine != written:
                write_private(self.path / f"node-{rank}.json", json.dumps(mine).encode())
                written = mine
            proven = {r: e for r, e in entries.items()
                      if trusted and secret is not None and r < count and self._proven(e, secret)}
            if trusted and len(proven) == count and secret is not None:
                return Meeting(secret, tuple(Peer(r, str(proven[r]["host"]), str(proven[r]["address"]),
                                                  proven[r]["budget"]) for r in range(count)))
            if time.monotonic() >= deadline:
                raise RendezvousError(self._missing(timeout, secret is not None, set(proven)))
            if pause(self.poll, stop):
                raise RendezvousStopped("the job ended before the nodes met")

    def _acknowledge(self, secret: bytes, entries: dict[int, dict[str, Any]], acks: dict[int, str]) -> None:
        for r, e in entries.items():
            nonce = str(e.get("nonce", ""))
            if r != 0 and nonce and acks.get(r) != nonce:
                write_private(self.path / f"ack-{r}", mac(secret, "ack", r, nonce).encode())
                acks[r] = nonce

    def _acknowledged(self, secret: bytes) -> bool:
        try:
            ack = read_private(self.path / f"ack-{self.ident.node_rank}")
        except NotPrivate:
            return False
        want = mac(secret, "ack", self.ident.node_rank, self.nonce)
        return ack is not None and hmac.compare_digest(want.encode(), ack)

    def _missing(self, timeout: float, have_secret: bool, present: set[int]) -> str:
        fs = filesystem_type(str(self.path))
        node_only = is_local_fstype(fs) or fs in ("tmpfs", "ramfs", "devtmpfs")
        hint = (f"{self.base} is on {fs!r}, a node-local file system: give --rendezvous DIR on a file system "
                "every node shares" if node_only else
                f"is {self.base} ({fs}) shared by every node of the job, and did tier-run start there?")
        if not have_secret:
            return (f"rendezvous: after {timeout:.0f} s {self.ident.name_of(0)} has not written the job's secret "
                    f"into {self.path}; {hint}")
        missing = [self.ident.name_of(r) for r in range(self.ident.node_count) if r not in present]
        return (f"rendezvous: after {timeout:.0f} s still waiting for {', '.join(missing)} "
                f"({len(present)} of {self.ident.node_count} nodes met in {self.path}); {hint}")

    def close(self) -> None:
        """Removes this node's files; node 0 also the secret and, when empty, the directory."""
        rank = self.ident.node_rank
        for name in (f"node-{rank}.json", f"ack-{rank}") + (("secret",) if rank == 0 else ()):
            remove_quietly(self.path / name)
        if rank == 0:
            for p in self.path.glob("ack-*"):
                remove_quietly(p)
        try:
            self.path.rmdir()
        except OSError:
            pass
