"""Fixtures: a shim environment with an index over a small data set, the C
test programs, and the check that tier-run leaves nothing behind.  Helpers
the test modules import are in helpers.py."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import C_DIR, ShimEnv, build_index, dead_job_dir, leftovers, make_data, private_dir
from tiering.placement.index import Root, library_path


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


@pytest.fixture
def no_leftovers():
    before = set(leftovers())
    yield
    left = [d for d in set(leftovers()) - before if dead_job_dir(d)]
    assert left == [], "tier-run left directories in /dev/shm"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that run the C test programs carry the cc marker."""
    for item in items:
        if "cbin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cc)
