"""Shared fixtures: a small data set, an index over it with one tier, the C
test programs, and a way to run a process under the shim."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiering.index import Root, SharedIndex, library_path, lib

REPO = Path(__file__).resolve().parent.parent
C_DIR = Path(__file__).resolve().parent / "c"

# names that exercise the path handling: nesting, spaces, unicode, dots
DATA_FILES = {
    "a/one.bin": 1000,
    "a/two.bin": 70_000,
    "a/deep/er/three.bin": 4096,
    "b/with space.bin": 123,
    "b/ünï.bin": 5,
    "b/.hidden": 77,
    "top.bin": 0,
    "c/big.bin": 3_000_000,
}


def make_data(root: Path, files: dict[str, int] = DATA_FILES, seed: int = 1) -> dict[str, bytes]:
    import random
    rng = random.Random(seed)
    out = {}
    for rel, size in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(size)
        p.write_bytes(data)
        out[rel] = data
    return out


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


@dataclass
class ShimEnv:
    """A data root, one tier and an index, as tier-run would set them up,
    with the copies placed by hand."""

    root: Path
    tier: Path
    index: SharedIndex
    slots: dict[str, int]
    contents: dict[str, bytes]
    env: dict[str, str] = field(default_factory=dict)

    def place(self, rel: str, data: bytes | None = None) -> Path:
        dst = self.tier / "0" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(self.contents[rel] if data is None else data)
        assert self.index.cas_state(self.slots[rel], lib.TIERING_STATE_NONE, 1)
        return dst

    def place_all(self) -> None:
        for rel in self.contents:
            self.place(rel)

    def state(self, rel: str) -> int:
        return self.index.state(self.slots[rel])

    def run(self, args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env=self.env if env is None else env, capture_output=True,
                              text=True, timeout=120, **kw)


def build_index(tmp: Path, roots: list[Root], data_root: Path, contents: dict[str, bytes],
                tier: Path) -> tuple[SharedIndex, dict[str, int]]:
    run_dir = private_dir(tmp / "run")
    rels = sorted(contents)
    stats = [(data_root / r).stat() for r in rels]
    index, slots = SharedIndex.create(
        run_dir / "index", roots, [str(tier)], rels, [0] * len(rels),
        [len(contents[r]) for r in rels], [s.st_mtime_ns for s in stats],
        devs=[s.st_dev for s in stats], inos=[s.st_ino for s in stats])
    return index, dict(zip(rels, slots))


@pytest.fixture
def shimenv(tmp_path: Path):
    root = tmp_path / "pfs" / "data"
    contents = make_data(root)
    tier = private_dir(tmp_path / "tier" / "data")  # as tier-run makes it: 0700
    index, slots = build_index(tmp_path, [Root(str(root), 0)], root, contents, tier)
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(library_path())
    env["TIERING_INDEX"] = str(index.path)
    env.pop("TIERING_DISABLE", None)
    se = ShimEnv(root, tier, index, slots, contents, env)
    yield se
    index.close()


@pytest.fixture(scope="session")
def cbin(tmp_path_factory) -> Path:
    """The C test programs (lib*.c: shared libraries), built once per session."""
    out = tmp_path_factory.mktemp("cbin")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed for the shim tests"
    for src in C_DIR.glob("*.c"):
        lib_args = ["-shared", "-fPIC"] if src.stem.startswith("lib") else []
        name = src.stem + (".so" if lib_args else "")
        subprocess.run([cc, "-O1", "-Wall", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-pthread", *lib_args,
                        "-o", str(out / name), str(src)], check=True)
    return out


PYTHON = sys.executable
