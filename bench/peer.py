"""Peer fetch throughput against a local copy: 100 KiB and 64 MiB files, a
peer service on loopback and between two emulated nodes (network
namespaces on a bridge, as the tests make them).

    python -m bench.peer [--small N] [--big N] [--repeats R] [--out DIR]

The local copy is shutil.copyfile (sendfile) of the same source files, warm in
the page cache like the peer's; the peer figures are one client fetching the
files one after another, or with 8 threads at once (after one warm-up fetch),
each into a staging file that is then removed.  MB/s are 10^6 bytes per second, the median of
--repeats runs.  Writes DIR/peer.json and DIR/peer.md (default bench/results).
Needs root for the namespaces (the loopback rows run without).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE = REPO / "tests" / "cluster_node.py"
sys.path.insert(0, str(REPO / "tests"))

import netns  # noqa: E402

SIZES = {"100 KiB": 100 * 1024, "64 MiB": 64 << 20}


def make_files(src: Path, label: str, size: int, count: int) -> list[str]:
    rels = []
    for i in range(count):
        rel = f"{label.replace(' ', '')}-{i}.bin"
        (src / rel).write_bytes(os.urandom(size))
        rels.append(rel)
    return rels


def local_copy(src: Path, dest: Path, rels: list[str]) -> float:
    t0 = time.perf_counter()
    for rel in rels:
        shutil.copyfile(src / rel, dest / rel)
        (dest / rel).unlink()
    return time.perf_counter() - t0


def peer_fetch(client_prefix: list[str], address: str, secret: Path, src: Path, dest: Path,
               rels: list[str], threads: int = 1) -> float:
    r = subprocess.run([*client_prefix, sys.executable, str(NODE), "fetch", "--address", address,
                        "--threads", str(threads),
                        "--secret-file", str(secret), "--src", str(src), "--dest-dir", str(dest), "--discard",
                        "--warmup", "--timeout", "600", *rels], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    bad = [x for x in out["results"] if "ok" not in x]
    if bad:
        raise RuntimeError(f"peer fetch failed: {bad[0]}")
    return float(out["seconds"])


class Server:
    def __init__(self, prefix: list[str], host: str, secret: Path, src: Path):
        self.proc = subprocess.Popen([*prefix, sys.executable, str(NODE), "serve", "--host", host,
                                      "--secret-file", str(secret), "--dir", str(src)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = json.loads(self.proc.stdout.readline())["address"]

    def close(self) -> None:
        self.proc.communicate("", timeout=60)


def measure(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    src, dest = work / "src", work / "dest"
    src.mkdir()
    dest.mkdir()
    secret = work / "secret"
    secret.write_text(os.urandom(32).hex())
    files = {label: make_files(src, label, size, args.small if size < 1 << 20 else args.big)
             for label, size in SIZES.items()}
    seconds: dict[str, dict[str, list[float]]] = {label: {} for label in SIZES}

    def record(setting: str, run: object) -> None:
        for label, rels in files.items():
            for _ in range(args.repeats):
                seconds[label].setdefault(setting, []).append(run(rels))  # type: ignore[operator]

    record("local copy", lambda rels: local_copy(src, dest, rels))
    lo = Server([], "127.0.0.1", secret, src)
    record("peer, loopback", lambda rels: peer_fetch([], lo.address, secret, src, dest, rels))
    record("peer, loopback, 8 threads", lambda rels: peer_fetch([], lo.address, secret, src, dest, rels, 8))
    lo.close()
    reason = netns.unavailable()
    if reason is None:
        with netns.emulated_nodes(2, net=7) as net:
            a, b = net.node(0), net.node(1)
            srv = Server(a.argv([]), a.address, secret, src)
            record("peer, two namespaces", lambda rels: peer_fetch(b.argv([]), srv.address, secret, src, dest, rels))
            record("peer, two namespaces, 8 threads",
                   lambda rels: peer_fetch(b.argv([]), srv.address, secret, src, dest, rels, 8))
            srv.close()
    else:
        print(f"no namespaces: {reason}", file=sys.stderr)
    out: dict[str, dict[str, float]] = {}
    for label, by_setting in seconds.items():
        total = SIZES[label] * len(files[label])
        out[label] = {s: total / statistics.median(v) / 1e6 for s, v in by_setting.items()}
    return out


def table(result: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    settings = list(next(iter(result.values())))
    lines = [f"Peer fetch throughput, MB/s (median of {args.repeats}; {args.small} files of 100 KiB, "
             f"{args.big} of 64 MiB; one client process, one file at a time unless said)", "",
             "| file size | " + " | ".join(settings) + " |", "|---|" + "---:|" * len(settings)]
    for label, row in result.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[s]:.0f}" for s in settings) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=500)
    p.add_argument("--big", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiering-peer-bench-") as tmp:
        result = measure(args, Path(tmp))
    text = table(result, args)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer.json").write_text(json.dumps({"mb_per_s": result, "small": args.small, "big": args.big,
                                                    "repeats": args.repeats}, indent=2) + "\n")
    (args.out / "peer.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
