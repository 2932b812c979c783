"""Emulated nodes on one machine: network namespaces joined by veth pairs to a
bridge that lives in a namespace of its own (the host's network is never
touched), with addresses 10.213.<net>.<i>/24.

    with emulated_nodes(3) as net:
        subprocess.run(net.node(0).argv(["python", "server.py"]))

Everything is removed on exit, and namespaces of test runs that died are
removed by the next one.  `unavailable()` says why namespaces cannot be made
here (not root, no iproute2), for a skip with that reason.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

PREFIX = "tiering-t"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass(frozen=True)
class Node:
    ns: str
    iface: str
    address: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """command run inside this node's namespace (ip execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *command]

    def limit(self, rate: str) -> None:
        """Caps what this node sends (token bucket on its interface), e.g. "16mbit"."""
        subprocess.run(["ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", self.iface, "root",
                        "tbf", "rate", rate, "burst", "32kbit", "latency", "1s"],
                       check=True, capture_output=True, timeout=30)


@dataclass
class Network:
    bridge_ns: str
    nodes: list[Node] = field(default_factory=list)

    def node(self, i: int) -> Node:
        return self.nodes[i]

    def namespaces(self) -> list[str]:
        return [self.bridge_ns] + [n.ns for n in self.nodes]


def unavailable() -> str | None:
    """Why emulated nodes cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def sweep() -> None:
    """Removes the namespaces of test runs whose process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = re.match(rf"({re.escape(PREFIX)}(\d+)-\S+)", line)
        if m and not psutil.pid_exists(int(m.group(2))):
            _ip("netns", "del", m.group(1), check=False)


@contextmanager
def emulated_nodes(count: int, net: int = 0) -> Iterator[Network]:
    """count namespaces on one bridge; removed whatever happens."""
    sweep()
    tag = f"{PREFIX}{os.getpid()}-{net}"
    network = Network(f"{tag}-br")
    try:
        _ip("netns", "add", network.bridge_ns)
        _ip("-n", network.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", network.bridge_ns, "link", "set", "br0", "up")
        for i in range(count):
            node = Node(f"{tag}-{i}", "eth0", f"10.213.{net}.{i + 1}")
            _ip("netns", "add", node.ns)
            network.nodes.append(node)
            host_end, bridge_end = f"tv{os.getpid()}n{i}"[-15:], f"tb{os.getpid()}n{i}"[-15:]
            _ip("link", "add", host_end, "type", "veth", "peer", "name", bridge_end)
            _ip("link", "set", bridge_end, "netns", network.bridge_ns)
            _ip("link", "set", host_end, "netns", node.ns)
            _ip("-n", network.bridge_ns, "link", "set", bridge_end, "master", "br0")
            _ip("-n", network.bridge_ns, "link", "set", bridge_end, "up")
            _ip("-n", node.ns, "link", "set", host_end, "name", node.iface)
            _ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", node.iface)
            _ip("-n", node.ns, "link", "set", node.iface, "up")
            _ip("-n", node.ns, "link", "set", "lo", "up")
        yield network
    finally:
        for ns in network.namespaces():
            _ip("netns", "del", ns, check=False)   # takes its veth ends and the bridge with it


def remaining(network: Network) -> list[str]:
    """Namespaces of this network still present (none after the context exits)."""
    listed = _ip("netns", "list", check=False).stdout
    return [ns for ns in network.namespaces() if re.search(rf"^{re.escape(ns)}\b", listed, re.M)]
