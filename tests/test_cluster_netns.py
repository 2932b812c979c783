"""The peer service between emulated nodes (network namespaces on a bridge):
a node fetches another node's copy; a wrong secret is refused and counted; an
absent copy is answered at once; a peer killed mid-stream or stopped
(SIGSTOP) makes the client fall back, with nothing partial left."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

NODE = Path(__file__).resolve().parent / "cluster_node.py"
REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no emulated nodes: {REASON}")


@pytest.fixture
def net():
    with netns.emulated_nodes(3) as network:
        yield network
    assert netns.remaining(network) == []


@pytest.fixture
def files(tmp_path: Path):
    src = tmp_path / "copies"
    src.mkdir()
    data = {"small.bin": os.urandom(100 * 1024), "big.bin": os.urandom(32 << 20)}
    for rel, content in data.items():
        (src / rel).write_bytes(content)
    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    wrong = tmp_path / "wrong"
    wrong.write_text(os.urandom(32).hex())
    dest = tmp_path / "dest"
    dest.mkdir()
    return src, data, secret, wrong, dest


class Server:
    def __init__(self, node: netns.Node, src: Path, secret: Path):
        self.proc = subprocess.Popen(node.argv([sys.executable, str(NODE), "serve", "--host", node.address,
                                                "--secret-file", str(secret), "--dir", str(src)]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = json.loads(self.proc.stdout.readline())["address"]

    def counters(self) -> dict:
        out, _ = self.proc.communicate("", timeout=60)
        return json.loads(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)


def fetch_argv(node: netns.Node, address: str, src: Path, dest: Path, secret: Path | None, *rels: str,
               timeout: float = 60) -> list[str]:
    secret_args = ["--secret-file", str(secret)] if secret else ["--no-secret"]
    return node.argv([sys.executable, str(NODE), "fetch", "--address", address, *secret_args, "--src", str(src),
                      "--dest-dir", str(dest), "--timeout", str(timeout), *rels])


def run_fetch(argv: list[str]) -> list[dict]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["results"]


@pytest.fixture
def server(net, files):
    src, _, secret, _, _ = files
    s = Server(net.node(0), src, secret)
    yield s
    s.kill()


@pytest.mark.slow
def test_a_node_fetches_another_nodes_copy_and_strangers_are_refused(net, files, server):
    src, data, secret, wrong, dest = files
    assert server.address.startswith(net.node(0).address + ":")
    got = run_fetch(fetch_argv(net.node(1), server.address, src, dest, secret, "small.bin", "big.bin"))
    assert got == [{"ok": len(data["small.bin"])}, {"ok": len(data["big.bin"])}]
    assert (dest / "small.bin.part").read_bytes() == data["small.bin"]
    assert (dest / "big.bin.part").read_bytes() == data["big.bin"]
    for s in (wrong, None):
        refused = run_fetch(fetch_argv(net.node(2), server.address, src, dest, s, "small.bin"))
        assert [r["reason"] for r in refused] == ["refused"]
    assert server.counters() == {"served": 2, "bytes": len(data["small.bin"]) + len(data["big.bin"]),
                                 "refused": 2}


@pytest.mark.slow
def test_an_absent_copy_is_answered_at_once(net, files, server):
    src, _, secret, _, dest = files
    # a deadline far beyond the test's own timeout: only an immediate answer passes
    got = run_fetch(fetch_argv(net.node(1), server.address, src, dest, secret, "missing.bin", timeout=3600))
    assert [r["reason"] for r in got] == ["absent"]
    assert os.listdir(dest) == []
    assert server.counters() == {"absent": 1}


def _fetch_until_bytes_arrive(net, files, server, timeout: float) -> tuple[subprocess.Popen, Path]:
    """Starts fetching big.bin over a slowed link; returns once part of it has arrived."""
    src, data, secret, _, dest = files
    net.node(0).limit("128mbit")              # 32 MiB take about 2 s, far more than HTTP/2 keeps in flight
    client = subprocess.Popen(fetch_argv(net.node(1), server.address, src, dest, secret, "big.bin", timeout=timeout),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = dest / "big.bin.part"
    deadline = time.monotonic() + 60
    while not (part.exists() and 0 < part.stat().st_size < len(data["big.bin"])):
        assert client.poll() is None, client.communicate()
        assert time.monotonic() < deadline, "no bytes arrived in 60 s"
        time.sleep(0.01)
    return client, dest


def _result(client: subprocess.Popen) -> dict:
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    [result] = json.loads(out)["results"]
    return result


@pytest.mark.slow
def test_a_peer_killed_mid_stream_leaves_no_partial_copy(net, files, server):
    client, dest = _fetch_until_bytes_arrive(net, files, server, timeout=3600)
    server.proc.kill()
    assert _result(client)["reason"] == "error"
    assert os.listdir(dest) == []


@pytest.mark.slow
def test_a_stopped_peer_is_given_up_at_the_deadline(net, files, server):
    client, dest = _fetch_until_bytes_arrive(net, files, server, timeout=8)
    os.kill(server.proc.pid, signal.SIGSTOP)
    result = _result(client)      # returns although the peer never answers again
    assert result["reason"] == "deadline", result
    assert os.listdir(dest) == []
