"""The peer tier: each node's service serves its published copies to the other
nodes of the job over gRPC; a node fetches a copy from a peer instead of the
PFS, and falls back to the PFS on any failure.

NOTE [peer protocol] in docs/design.md.  Two methods, raw bytes (no
generated code): ``/tiering.Peer/Fetch`` streams a file in chunks (1 MiB);
``/tiering.Peer/Get`` answers a file of at most one chunk in one message
(a streamed call costs about three times as much CPU per call in grpcio,
and most training samples are small).

- request: JSON {"root", "rel", "size", "mtime_ns"}: the file by data-root id
  and relative path, with the catalog's identity of the source;
- metadata ``tiering-auth``: HMAC-SHA256 of method and request under the
  job's secret (the secret itself never crosses the network), compared in
  constant time; a call without it or with a wrong one ends UNAUTHENTICATED
  and is counted; a call before this node knows the secret (the nodes are
  still meeting: one node finishes meeting up to a poll of the job
  directory after another) waits for it up to EARLY_WAIT seconds (within
  the call's deadline), then ends FAILED_PRECONDITION and is counted as
  early;
- response: the copy's bytes, then status OK; NOT_FOUND at once when the
  copy is not published here or its source's identity differs from the
  request's; DATA_LOSS when the copy is shorter than catalogued.

The client writes the stream into a staging file under a deadline and keeps
it only when the stream ended OK with exactly the expected size; it raises
PeerUnavailable (absent, early, refused, deadline, stopped, error) otherwise, after
removing the partial file.  The caller then reads the PFS.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from ..catalog import CatalogFile
from ..placement.tiers import TierState, unlink_at
from ..profile.model import Network

FETCH = "/tiering.Peer/Fetch"    # streamed, any size
GET = "/tiering.Peer/Get"        # one message, at most one chunk
AUTH_KEY = "tiering-auth"
CHUNK = 1 << 20
EARLY_WAIT = 1.0                 # seconds a call made before the secret is known waits for it


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class PeerError(Exception):
    """The peer service cannot start (address, interface)."""


class PeerUnavailable(Exception):
    """No copy from this peer; read the PFS.  ``reason``: absent, early
    (the peer has not met the others yet), refused, deadline, stopped or
    error."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class FileKey:
    """A file as every node of the job names it, with its catalogued identity."""
    root: int
    rel: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, f: CatalogFile) -> FileKey:
        return cls(f.root, f.rel, f.size, f.mtime_ns)

    def encode(self) -> bytes:
        return json.dumps({"root": self.root, "rel": self.rel, "size": self.size,
                           "mtime_ns": self.mtime_ns}).encode()

    @classmethod
    def decode(cls, data: bytes) -> FileKey:
        d = json.loads(data)
        key = cls(d["root"], d["rel"], d["size"], d["mtime_ns"])
        if not (isinstance(key.root, int) and isinstance(key.rel, str) and isinstance(key.size, int)
                and isinstance(key.mtime_ns, int)):
            raise ValueError("bad field types")
        return key


@dataclass(frozen=True)
class Published:
    """A complete copy this node serves, and the identity of its source."""
    path: str
    size: int
    mtime_ns: int
    file: int = -1     # its catalog id, when the lookup knows it (the relay rule's report of what was served)


Lookup = Callable[[int, str], "Published | None"]   # (data-root id, relative path) -> published copy


def auth_token(secret: bytes, method: str, request: bytes) -> str:
    return hmac.new(secret, method.encode() + b"\0" + request, hashlib.sha256).hexdigest()


SERVER_COUNTS = ("served", "bytes", "absent", "early", "refused", "errors")
CLIENT_COUNTS = ("fetched", "bytes", "absent", "early", "refused", "deadline", "stopped", "error")


@dataclass
class Counters:
    """Thread-safe counts (a server's: SERVER_COUNTS; a client's: CLIENT_COUNTS)."""
    values: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        """The counts that are not 0."""
        with self._lock:
            return dict(self.values)

    def report(self, names: tuple[str, ...]) -> dict[str, int]:
        """Every count of `names` (0 included) and any other counted."""
        return {**dict.fromkeys(names, 0), **self.snapshot()}


# -- addresses ------------------------------------------------------------------

def interface_address(name: str) -> str:
    """The IPv4 address of a network interface (the profile's ``network.interface``)."""
    addrs = psutil.net_if_addrs()
    if name not in addrs:
        raise PeerError(f"network interface {name!r} does not exist on {socket.gethostname()} "
                        f"(there are: {', '.join(sorted(addrs))})")
    for a in addrs[name]:
        if a.family == socket.AF_INET:
            return str(a.address)
    raise PeerError(f"network interface {name!r} has no IPv4 address")


# -- the server -----------------------------------------------------------------

class PeerServer:
    """Serves this node's published copies to the job's other nodes; listens
    on one address only, from start() to stop().  Without a secret (None:
    the address has to be published before the rendezvous gives the secret)
    a call waits for it up to EARLY_WAIT seconds, then ends as early."""

    def __init__(self, host: str, secret: bytes | None, lookup: Lookup, port: int = 0, workers: int = 8,
                 chunk: int = CHUNK):
        self.host, self.port = host, port
        self._met = threading.Event()      # set with the secret
        self._secret: bytes | None = None
        self.secret, self.lookup, self.chunk = secret, lookup, chunk
        self.workers = workers
        self.counters = Counters()
        self.served: Callable[[int], None] | None = None   # told the catalog id of each copy handed out
        self._server: grpc.Server | None = None
        self.address = ""

    @property
    def secret(self) -> bytes | None:
        return self._secret

    @secret.setter
    def secret(self, value: bytes | None) -> None:
        self._secret = value
        if value is not None:
            self._met.set()   # the calls waiting for it go on

    def start(self) -> str:
        """Listens; returns host:port (the port the system chose for port 0)."""
        handler = grpc.method_handlers_generic_handler("tiering.Peer", {
            "Fetch": grpc.unary_stream_rpc_method_handler(self._fetch),
            "Get": grpc.unary_unary_rpc_method_handler(self._get)})
        server = grpc.server(ThreadPoolExecutor(self.workers, thread_name_prefix="peer"),
                             handlers=[handler], maximum_concurrent_rpcs=4 * self.workers,
                             options=[("grpc.so_reuseport", 0)])
        where = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(where)
        except RuntimeError as e:
            port, why = 0, str(e)
        else:
            why = "address in use or not on this node"
        if not port:
            server.stop(None)
            raise PeerError(f"the peer service cannot listen on {where}: {why}")
        server.start()
        self._server, self.port = server, port
        self.address = where.rsplit(":", 1)[0] + f":{port}"
        return self.address

    def stop(self, grace: float = 1.0) -> None:
        """Stops listening; calls still running get ``grace`` seconds."""
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def _fetch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        fd, key = self._admit(FETCH, request, context)
        try:
            sent = 0
            while sent < key.size:
                data = self._read(fd, sent, min(self.chunk, key.size - sent), context)
                sent += len(data)
                yield data
            self.counters.add("served")
        finally:
            os.close(fd)

    def _get(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        fd, key = self._admit(GET, request, context)
        try:
            if key.size > self.chunk:
                self.counters.add("errors")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Get serves files up to {self.chunk} bytes")
            data = self._read(fd, 0, key.size, context) if key.size else b""
            self.counters.add("served")
            return data
        finally:
            os.close(fd)

    def _admit(self, method: str, request: bytes, context: grpc.ServicerContext) -> tuple[int, FileKey]:
        """The caller proves the job's secret; the file is published here with
        the requested identity: an fd on the copy, else the call ends."""
        token = dict(context.invocation_metadata()).get(AUTH_KEY, "")
        secret = self.secret
        if secret is None:
            left = context.time_remaining()
            self._met.wait(EARLY_WAIT if left is None else max(0.0, min(EARLY_WAIT, left)))
            secret = self.secret
        if secret is None:
            self.counters.add("early")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the nodes of this job are still meeting")
        if secret is None or not isinstance(token, str) or not hmac.compare_digest(
                token.encode(), auth_token(secret, method, request).encode()):
            self.counters.add("refused")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a node of this job")
        try:
            key = FileKey.decode(request)
        except (ValueError, KeyError, TypeError):
            self.counters.add("errors")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request")
        fd = self._open(key)
        if fd is None:
            self.counters.add("absent")
            context.abort(grpc.StatusCode.NOT_FOUND, "no published copy")
        return fd, key   # type: ignore[return-value]   # abort raises

    def _open(self, key: FileKey) -> int | None:
        """An fd on the published copy when its source is the requested one;
        a copy evicted meanwhile is absent, one evicted later is still read
        whole through the fd."""
        try:
            pub = self.lookup(key.root, key.rel)
        except Exception:   # a broken lookup must not break the server
            pub = None
        if pub is None or (pub.size, pub.mtime_ns) != (key.size, key.mtime_ns):
            return None
        try:
            fd = os.open(pub.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        if os.fstat(fd).st_size != key.size:
            os.close(fd)
            return None
        if self.served is not None and pub.file >= 0:
            self.served(pub.file)   # the relay rule (NOTE [relay]): the next reader has it now
        return fd

    def _read(self, fd: int, offset: int, n: int, context: grpc.ServicerContext) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) < n:   # pread of a regular file returns less only at its end
            self.counters.add("errors")
            context.abort(grpc.StatusCode.DATA_LOSS, "copy shorter than catalogued")
        self.counters.add("bytes", len(data))
        return data


# -- the client -----------------------------------------------------------------

_REASONS = {grpc.StatusCode.NOT_FOUND: "absent", grpc.StatusCode.UNAUTHENTICATED: "refused",
            grpc.StatusCode.FAILED_PRECONDITION: "early",
            grpc.StatusCode.DEADLINE_EXCEEDED: "deadline", grpc.StatusCode.CANCELLED: "stopped"}


class PeerClient:
    """Fetches copies from one peer's service."""

    def __init__(self, address: str, secret: bytes | None, counters: Counters | None = None,
                 chunk: int = CHUNK):
        self.address = address
        self.secret = secret
        self.chunk = chunk
        self.counters = counters or Counters()
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", chunk + (1 << 16)), ("grpc.enable_retries", 0)])
        self._stream = self._channel.unary_stream(FETCH)
        self._get = self._channel.unary_unary(GET)

    def close(self) -> None:
        self._channel.close()

    def fetch(self, key: FileKey, dest: Path, timeout: float, stop: threading.Event | None = None) -> int:
        """Writes the peer's copy of key to dest (created, mode 0400) and returns
        its size.  Raises PeerUnavailable, leaving no dest, unless the call
        ended OK within ``timeout`` seconds with exactly key.size bytes; an
        OSError of the local write passes through (dest removed as well)."""
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o400)
        done = False
        try:
            got = self.fetch_into(key, fd, timeout, stop)
            done = True
            return got
        finally:
            os.close(fd)
            if not done:
                unlink_quietly(dest)

    def fetch_into(self, key: FileKey, fd: int, timeout: float, stop: threading.Event | None = None) -> int:
        """Writes the peer's copy of key into the empty file fd (made 0400) and
        returns its size; raises PeerUnavailable (the caller removes the file)
        unless the call ended OK within ``timeout`` seconds with exactly
        key.size bytes."""
        request = key.encode()
        method = GET if key.size <= self.chunk else FETCH
        metadata = [(AUTH_KEY, auth_token(self.secret, method, request))] if self.secret is not None else []
        try:
            if method == GET:
                chunks: Any = [self._get(request, timeout=timeout, metadata=metadata)]
            else:
                chunks = self._stream(request, timeout=timeout, metadata=metadata)
            got = _write(chunks, fd, key.size, stop)
            if got != key.size:
                raise PeerUnavailable("error", f"{self.address} sent {got} bytes of {key.size}")
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            reason = _REASONS.get(code, "error") if code is not None else "error"
            self.counters.add(reason)
            detail = e.details() if isinstance(e, grpc.Call) else str(e)
            raise PeerUnavailable(reason, f"{self.address}: {detail}") from None
        except PeerUnavailable as e:
            self.counters.add(e.reason)
            raise
        self.counters.add("fetched")
        self.counters.add("bytes", key.size)
        return key.size


def _write(chunks: Any, fd: int, size: int, stop: threading.Event | None) -> int:
    """Writes the chunks of a call to fd; cancels the call on stop or excess."""
    got = 0
    for chunk in chunks:
        if stop is not None and stop.is_set():
            if hasattr(chunks, "cancel"):
                chunks.cancel()
            raise PeerUnavailable("stopped")
        got += len(chunk)
        if got > size:
            if hasattr(chunks, "cancel"):
                chunks.cancel()
            raise PeerUnavailable("error", f"more than the {size} bytes catalogued")
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    return got


def fetch_copy(client: PeerClient, f: CatalogFile, tier: TierState, timeout: float,
               stop: threading.Event | None = None) -> int:
    """A peer's copy of f, put in place on the tier like placement.tiers.copy_file
    (staging name, checked, renamed; not yet published): returns the bytes it
    takes there.  Raises PeerUnavailable (read the PFS instead) or OSError."""
    name = f"peer-{threading.get_ident()}-{os.getpid()}.part"
    fd, staging_fd = tier.dirs.create_staging(name)
    placed = False
    try:
        try:
            client.fetch_into(FileKey.of(f), fd, timeout, stop)
            blocks = os.fstat(fd).st_blocks
        finally:
            os.close(fd)
        tier.dirs.publish(name, staging_fd, f)
        placed = True
        return blocks * 512
    finally:
        if not placed:
            unlink_at(name, staging_fd)


# -- when a peer is worth asking --------------------------------------------------

def transfer_seconds(size: Any, bandwidth_mb_s: float, latency_ms: float) -> Any:
    """Seconds to move `size` bytes (an int, or a numpy array of them)."""
    return latency_ms / 1000 + size / (bandwidth_mb_s * 1e6)


def peer_is_faster(size: int, net: Network, pfs_bandwidth: float, pfs_latency_ms: float) -> bool:
    """A peer's copy arrives sooner than the PFS's (per-stream rates, MB/s)."""
    return transfer_seconds(size, net.bandwidth, net.latency_ms) < transfer_seconds(size, pfs_bandwidth,
                                                                                    pfs_latency_ms)


def peer_is_faster_each(sizes: np.ndarray, net: Network, pfs_bandwidth: float, pfs_latency_ms: float) -> np.ndarray:
    """peer_is_faster for many sizes at once (a bool per size)."""
    s = np.asarray(sizes, np.float64)
    return np.asarray(transfer_seconds(s, net.bandwidth, net.latency_ms)
                      < transfer_seconds(s, pfs_bandwidth, pfs_latency_ms), bool)


def fetch_deadline(size: int, net: Network, slack: float = 4.0, floor: float = 2.0) -> float:
    """How long a fetch may take before the PFS is read instead: ``floor``
    seconds plus ``slack`` times the expected transfer (a stalled peer costs
    at most this)."""
    return floor + slack * transfer_seconds(size, net.bandwidth, net.latency_ms)
