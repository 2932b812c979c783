"""The peer service on loopback: complete copies with the same bytes, absent
and refused answers counted, nothing partial left, listening only while
started and only on its address."""
from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from helpers import Entered, private_dir, staged, wait_for
from tiering.catalog import CatalogFile
from tiering.cluster.peer import (
    FETCH,
    GET,
    FileKey,
    Network,
    PeerClient,
    PeerError,
    PeerServer,
    PeerUnavailable,
    Published,
    auth_token,
    fetch_copy,
    fetch_deadline,
    interface_address,
    peer_is_faster,
)
from tiering.placement.tiers import TierState

SECRET = bytes(range(32))
SIZES = {"empty.bin": 0, "small.bin": 100 * 1024, "odd/multi.bin": 3 * (1 << 20) + 17}


@pytest.fixture
def served(tmp_path: Path):
    """A server on 127.0.0.1 serving the files under tmp_path/copies as data root 0."""
    copies = tmp_path / "copies"
    contents = {}
    for rel, size in SIZES.items():
        p = copies / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        contents[rel] = os.urandom(size)
        p.write_bytes(contents[rel])
    published = {rel: Published(str(copies / rel), len(data), 1234) for rel, data in contents.items()}
    server = PeerServer("127.0.0.1", SECRET, lambda root, rel: published.get(rel) if root == 0 else None)
    address = server.start()
    client = PeerClient(address, SECRET)
    yield server, client, contents, tmp_path
    client.close()
    server.stop(0)


def key(rel: str, size: int | None = None, mtime_ns: int = 1234) -> FileKey:
    return FileKey(0, rel, SIZES[rel] if size is None else size, mtime_ns)


def test_published_copies_arrive_whole_with_the_same_bytes(served):
    server, client, contents, tmp = served
    for rel, data in contents.items():
        dest = tmp / (rel.replace("/", "_") + ".part")
        assert client.fetch(key(rel), dest, timeout=30) == len(data)
        assert dest.read_bytes() == data
        assert stat.S_IMODE(dest.stat().st_mode) == 0o400
    total = sum(SIZES.values())
    assert client.counters.snapshot() == {"fetched": 3, "bytes": total}
    assert server.counters.snapshot() == {"served": 3, "bytes": total}


@pytest.mark.parametrize("k, why", [
    (FileKey(0, "missing.bin", 10, 1234), "not published"),
    (key("small.bin", mtime_ns=999), "another source identity"),
    (key("small.bin", size=5), "another size"),
    (FileKey(1, "small.bin", SIZES["small.bin"], 1234), "another data root"),
])
def test_a_copy_that_is_not_here_is_absent_and_nothing_is_left(served, k, why):
    server, client, _, tmp = served
    dest = tmp / "x.part"
    with pytest.raises(PeerUnavailable) as e:
        client.fetch(k, dest, timeout=60)
    assert e.value.reason == "absent", why
    assert not dest.exists()
    assert server.counters.snapshot() == {"absent": 1}
    assert client.counters.snapshot() == {"absent": 1}


def test_calls_without_the_secret_are_refused_and_counted(served):
    server, _, _, tmp = served
    for secret in (b"\0" * 32, None):
        other = PeerClient(server.address, secret)
        with pytest.raises(PeerUnavailable) as e:
            other.fetch(key("small.bin"), tmp / "x.part", timeout=30)
        other.close()
        assert e.value.reason == "refused"
        assert not (tmp / "x.part").exists()
    # a token for another request does not open this one
    # a token for another request, or for the other method, does not open this one
    channel = grpc.insecure_channel(server.address)
    for method, token in ((GET, auth_token(SECRET, GET, key("empty.bin").encode())),
                          (GET, auth_token(SECRET, FETCH, key("small.bin").encode()))):
        with pytest.raises(grpc.RpcError) as rpc:
            channel.unary_unary(method)(key("small.bin").encode(), timeout=30, metadata=[("tiering-auth", token)])
        assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    assert server.counters.snapshot() == {"refused": 4}


@pytest.mark.slow
def test_a_server_serves_only_once_it_knows_the_secret(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    server = PeerServer("127.0.0.1", None, lambda r, p: Published(str(tmp_path / p), 3, 1))
    client = PeerClient(server.start(), SECRET)
    with pytest.raises(PeerUnavailable) as e:      # listening, address published, no secret yet
        client.fetch(FileKey(0, "f", 3, 1), tmp_path / "x.part", timeout=30)
    assert e.value.reason == "early"               # a node of the job that met the others first: not refused
    assert not (tmp_path / "x.part").exists()
    server.secret = SECRET                          # the rendezvous is done
    assert client.fetch(FileKey(0, "f", 3, 1), tmp_path / "x.part", timeout=30) == 3
    client.close()
    server.stop(0)
    assert server.counters.snapshot() == {"early": 1, "served": 1, "bytes": 3}
    assert client.counters.snapshot() == {"early": 1, "fetched": 1, "bytes": 3}


def test_a_call_made_while_the_nodes_finish_meeting_waits_for_the_secret(tmp_path):
    """Another node met the others a poll before this one: its call waits
    for this node's secret and is served, not answered "early"."""
    (tmp_path / "f").write_bytes(b"abc")
    server = PeerServer("127.0.0.1", None, lambda r, p: Published(str(tmp_path / p), 3, 1))
    server._met = Entered()
    client = PeerClient(server.start(), SECRET)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.fetch, FileKey(0, "f", 3, 1), tmp_path / "x.part", 30)
        wait_for(server._met.waiting.is_set, "the call waiting for the secret")
        server.secret = SECRET
        assert call.result() == 3
    assert (tmp_path / "x.part").read_bytes() == b"abc"
    client.close()
    server.stop(0)
    assert server.counters.snapshot() == {"served": 1, "bytes": 3}
    assert client.counters.snapshot() == {"fetched": 1, "bytes": 3}


def test_a_malformed_request_is_an_error_not_a_crash(served):
    server, client, _, tmp = served
    channel = grpc.insecure_channel(server.address)
    with pytest.raises(grpc.RpcError) as rpc:
        list(channel.unary_stream(FETCH)(b"{nonsense", timeout=30, metadata=[("tiering-auth", auth_token(SECRET, FETCH, b"{nonsense"))]))
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    big = key("odd/multi.bin").encode()     # Get serves one chunk at most
    with pytest.raises(grpc.RpcError) as rpc:
        channel.unary_unary(GET)(big, timeout=30, metadata=[("tiering-auth", auth_token(SECRET, GET, big))])
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert client.fetch(key("small.bin"), tmp / "ok.part", timeout=30) == SIZES["small.bin"]


def test_a_stopped_fetch_leaves_nothing(served):
    _, client, _, tmp = served
    stop = threading.Event()
    stop.set()
    with pytest.raises(PeerUnavailable) as e:
        client.fetch(key("odd/multi.bin"), tmp / "x.part", timeout=30, stop=stop)
    assert e.value.reason == "stopped" and not (tmp / "x.part").exists()


def test_a_stopped_server_no_longer_listens_and_the_client_falls_back(served):
    server, client, _, tmp = served
    host, port = server.address.rsplit(":", 1)
    server.stop(0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=10)
    with pytest.raises(PeerUnavailable) as e:
        client.fetch(key("small.bin"), tmp / "x.part", timeout=30)
    assert e.value.reason == "error" and not (tmp / "x.part").exists()


def test_the_server_listens_on_its_address_only(served):
    server, _, _, _ = served
    port = int(server.address.rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=10)
    with pytest.raises(PeerError, match="cannot listen on 127.0.0.1:"):
        PeerServer("127.0.0.1", SECRET, lambda r, p: None, port=port).start()


def test_fetch_copy_puts_the_copy_in_place_on_the_tier(served):
    _, client, contents, tmp = served
    root = private_dir(tmp / "tier")   # as tier-run makes it
    tier = TierState("ram", "memory", root, 1 << 30, 1)
    f = CatalogFile(0, "odd/multi.bin", SIZES["odd/multi.bin"], 1234)
    used = fetch_copy(client, f, tier, timeout=30)
    assert tier.copy_path(f).read_bytes() == contents["odd/multi.bin"]
    assert used >= f.size and staged(root / "staging") == []
    with pytest.raises(PeerUnavailable):
        fetch_copy(client, CatalogFile(0, "missing.bin", 1, 1234), tier, timeout=30)
    assert staged(root / "staging") == [] and not tier.copy_path(CatalogFile(0, "missing.bin", 1, 1)).exists()


def test_a_staging_file_is_made_as_the_c_copy_makes_its_own(tmp_path):
    """TierDirs.create_staging (the peer tier's copies) goes through the C
    copy's tiering_staging_create, in the calling thread's own directory in
    staging/: the file is new and 0400 (written through its fd only: a copy
    is read-only from its start), a leftover of the same name is replaced,
    a symlink at the name is never followed, and a staging directory that
    vanished is made again, with the thread's."""
    from tiering.placement.index import lib
    root = private_dir(tmp_path / "tier")
    tier = TierState("ram", "memory", root, 1 << 30, 1)
    dirs = tier.dirs
    staging = root / "staging"
    mine = staging / f"{threading.get_ident()}-{os.getpid()}"
    calls: list[str] = []
    real = lib.tiering_staging_create

    class Spy:
        def __getattr__(self, name):
            return getattr(lib, name)

        def tiering_staging_create(self, fd, name):
            calls.append(name)
            return real(fd, name)

    mine_fd = dirs.thread_staging()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and os.path.samestat(os.fstat(mine_fd), mine.stat())
    (mine / "a.part").write_bytes(b"left over")
    victim = tmp_path / "victim"
    victim.write_bytes(b"not mine")
    (mine / "b.part").symlink_to(victim)
    import tiering.placement.tiers as tiers_mod
    saved, tiers_mod.lib = tiers_mod.lib, Spy()
    try:
        for name in ("a.part", "b.part"):
            fd, dir_fd = dirs.create_staging(name)
            os.write(fd, b"new")
            os.close(fd)
            assert dir_fd == mine_fd
            st = os.lstat(mine / name)
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o400
            assert (mine / name).read_bytes() == b"new"
        assert victim.read_bytes() == b"not mine"
        shutil.rmtree(staging)
        fd, dir_fd = dirs.create_staging("c.part")
        os.close(fd)
        assert (mine / "c.part").is_file() and dir_fd == dirs.thread_staging() != mine_fd
        assert os.path.samestat(os.fstat(dirs.staging_fd), staging.stat())
    finally:
        tiers_mod.lib = saved
    assert calls == [b"a.part", b"b.part", b"c.part", b"c.part"]


def test_interface_addresses():
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(PeerError, match=r"'nosuch0' does not exist on .* \(there are: .*lo"):
        interface_address("nosuch0")


def test_when_a_peer_is_worth_asking():
    ib = Network(bandwidth=10_000, latency_ms=0.05)
    assert peer_is_faster(110_000, ib, pfs_bandwidth=200, pfs_latency_ms=1.0)
    slow = Network(bandwidth=100, latency_ms=0.5)
    assert not peer_is_faster(64 << 20, slow, pfs_bandwidth=2000, pfs_latency_ms=1.0)
    assert fetch_deadline(0, ib) == pytest.approx(2.0 + 4 * 0.00005)
    assert fetch_deadline(100_000_000, slow) == pytest.approx(2.0 + 4 * (0.0005 + 1.0))
