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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiering.cluster import nodelock  # noqa: E402
from tiering.cluster.peer import FileKey, PeerClient, PeerServer, PeerUnavailable, Published  # noqa: E402
from tiering.rundirs import make_private_dir, remove_tree  # noqa: E402


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
                      "dir": str(m.directory), "alive": m.service_alive()}), flush=True)
    sys.stdin.readline()
    m.leave(wait_service=30)
    print(json.dumps({"left": True}), flush=True)
    return 0


def _secret(path: str) -> bytes:
    return bytes.fromhex(Path(path).read_text().strip())


def _directory_lookup(root_dir: Path):
    """Serves every regular file under root_dir as data root 0, identity from its stat."""
    def lookup(root: int, rel: str) -> Published | None:
        p = root_dir / rel
        if root != 0 or not p.is_file():
            return None
        st = p.stat()
        return Published(str(p), st.st_size, st.st_mtime_ns)
    return lookup


def serve(args: argparse.Namespace) -> int:
    """A peer server: prints its address, serves until stdin closes, prints its counters."""
    server = PeerServer(args.host, _secret(args.secret_file), _directory_lookup(Path(args.dir)))
    print(json.dumps({"address": server.start()}), flush=True)
    sys.stdin.read()
    server.stop(0)
    print(json.dumps(server.counters.snapshot()), flush=True)
    return 0


def fetch(args: argparse.Namespace) -> int:
    """Fetches files (stat'ed under --src for their identity) into --dest-dir; one JSON line of results."""
    secret = None if args.no_secret else _secret(args.secret_file)
    client = PeerClient(args.address, secret)

    def one(rel: str) -> dict:
        st = os.stat(Path(args.src) / rel) if (Path(args.src) / rel).exists() else None
        key = FileKey(0, rel, st.st_size if st else 1, st.st_mtime_ns if st else 0)
        tag = "" if args.threads == 1 else f".{threading.get_ident()}"
        dest = Path(args.dest_dir) / (rel.replace("/", "_") + tag + ".part")
        try:
            return {"ok": client.fetch(key, dest, timeout=args.timeout)}
        except PeerUnavailable as e:
            return {"reason": e.reason, "message": str(e)}
        finally:
            if args.discard:
                dest.unlink(missing_ok=True)

    if args.warmup:
        one(args.rel[0])    # connects the channel
    t0 = time.perf_counter()
    todo = [rel for _ in range(args.repeat) for rel in args.rel]
    with ThreadPoolExecutor(args.threads) as pool:
        results = list(pool.map(one, todo))
    seconds = time.perf_counter() - t0
    client.close()
    print(json.dumps({"results": results, "seconds": seconds}), flush=True)
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
    v = sub.add_parser("serve")
    v.add_argument("--host", required=True)
    v.add_argument("--secret-file", required=True)
    v.add_argument("--dir", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--address", required=True)
    f.add_argument("--secret-file")
    f.add_argument("--no-secret", action="store_true")
    f.add_argument("--src", required=True)
    f.add_argument("--dest-dir", required=True)
    f.add_argument("--timeout", type=float, default=60)
    f.add_argument("--repeat", type=int, default=1)
    f.add_argument("--discard", action="store_true")
    f.add_argument("--warmup", action="store_true")
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("rel", nargs="+")
    args = p.parse_args()
    return {"service": service, "member": member, "serve": serve, "fetch": fetch}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
