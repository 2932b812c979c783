"""Programs the cluster tests run as separate processes: a placement service
stand-in and a member (tests/test_cluster_nodelock.py), a peer server and a
peer client (tests/test_cluster_peer.py, inside network namespaces too).

    python cluster_node.py member --parent DIR --job J --tier-parent DIR --log FILE
    python cluster_node.py service --tier-parent DIR --log FILE NODE_DIR
    python cluster_node.py serve ...   /   fetch ...   (see peer_main)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiering.cluster import nodelock  # noqa: E402
from tiering.placement.tiers import remove_tree  # noqa: E402
from tiering.rundirs import make_private_dir  # noqa: E402


def _log(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def service(args: argparse.Namespace) -> int:
    """Stands in for the placement service: one tier directory, kept until the last member is gone."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _log(args.log, f"start {os.getpid()}")
    tier = make_private_dir(args.tier_parent, "tester")
    (tier / "copy.bin").write_bytes(b"x" * 100)
    life = nodelock.ServiceLifetime(Path(args.node_dir))
    life.ready({"tier": str(tier)})
    unused = life.wait_until_unused(poll=0.05, stop=stop)
    remove_tree(tier)
    _log(args.log, f"stop {os.getpid()} {'unused' if unused else 'stopped'}")
    return 0


def member(args: argparse.Namespace) -> int:
    """Joins, says what it joined, waits for a line on stdin, leaves."""
    argv = [sys.executable, __file__, "service", "--tier-parent", args.tier_parent, "--log", args.log]
    if args.fail:
        argv = [sys.executable, "-c", "import sys; print('service set-up failed: no room'); sys.exit(3)"]
    key = nodelock.NodeKey("tester", args.job, ("/pfs/data",))
    try:
        m = nodelock.join(key, nodelock.spawn_detached(argv), timeout=60, parent=args.parent)
    except nodelock.NodeLockError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps({"started": m.started, "service_pid": m.service_pid, "info": m.info,
                      "dir": str(m.directory)}), flush=True)
    sys.stdin.readline()
    m.leave(wait_service=30)
    print(json.dumps({"left": True}), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("service")
    s.add_argument("--tier-parent", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("node_dir")
    m = sub.add_parser("member")
    m.add_argument("--parent", required=True)
    m.add_argument("--job", default="job1")
    m.add_argument("--tier-parent", required=True)
    m.add_argument("--log", required=True)
    m.add_argument("--fail", action="store_true")
    args = p.parse_args()
    return {"service": service, "member": member}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
