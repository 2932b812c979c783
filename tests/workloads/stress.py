"""Opens random data-set files from many threads in several forked processes
and checks every byte read against known checksums.

    stress.py EXPECTED.json SECONDS PROCESSES THREADS

EXPECTED.json maps absolute paths to sha256 hex digests.  Prints one JSON
line: {"reads": n, "mismatches": [...], "errors": [...]}; exit 1 on any
mismatch."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]


def read_file(path: str, how: int) -> bytes:
    if how == 0:
        with open(path, "rb") as f:
            return f.read()
    if how == 1:
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks = []
            while True:
                b = os.read(fd, 1 << 16)
                if not b:
                    return b"".join(chunks)
                chunks.append(b)
        finally:
            os.close(fd)
    fp = libc.fopen(path.encode(), b"rb")
    if not fp:
        raise OSError(ctypes.get_errno(), "fopen", path)
    try:
        chunks = []
        buf = ctypes.create_string_buffer(1 << 16)
        while True:
            n = libc.fread(buf, 1, len(buf), fp)
            if not n:
                return b"".join(chunks)
            chunks.append(buf.raw[:n])
    finally:
        libc.fclose(fp)


def worker(expected: dict[str, str], deadline: float, seed: int, out: dict) -> None:
    rng = random.Random(seed)
    paths = sorted(expected)
    while time.monotonic() < deadline:
        p = rng.choice(paths)
        try:
            data = read_file(p, rng.randrange(3))
        except OSError as e:
            out["errors"].append(f"{p}: {e}")
            continue
        out["reads"] += 1
        if hashlib.sha256(data).hexdigest() != expected[p]:
            out["mismatches"].append(p)


def process(expected: dict[str, str], seconds: float, threads: int, seed: int) -> dict:
    out: dict = {"reads": 0, "mismatches": [], "errors": []}
    deadline = time.monotonic() + seconds
    ts = [threading.Thread(target=worker, args=(expected, deadline, seed * 100 + i, out)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def main() -> int:
    expected = json.load(open(sys.argv[1]))
    seconds, nproc, nthreads = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    children = []
    for k in range(nproc):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            res = process(expected, seconds, nthreads, k + 1)
            os.write(w, json.dumps(res).encode())
            os._exit(0)
        os.close(w)
        children.append((pid, r))
    total: dict = process(expected, seconds, nthreads, 0)
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            res = json.loads(f.read() or b'{"reads": 0, "mismatches": ["child died"], "errors": []}')
        os.waitpid(pid, 0)
        total["reads"] += res["reads"]
        total["mismatches"] += res["mismatches"]
        total["errors"] += res["errors"]
    print(json.dumps(total))
    return 1 if total["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
