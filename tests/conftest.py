"""Fixtures: a shim environment with an index over a small data set, the C
test programs, the check that tier-run leaves nothing behind, and the
figures of the reliability tests.  Helpers the test modules import are in
helpers.py."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# The suite's process loads grpc (the multi-node tests) and then forks every
# tier-run it starts: grpc's fork support restarts its poller in the child,
# which then finds the poller's descriptor closed by subprocess (close_fds)
# and aborts before exec (grpc/grpc#43055).  The tests' children need none of it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from helpers import C_DIR, ShimEnv, build_index, dead_job_dir, leftovers, make_data, private_dir, wait_for
from sanitizers import PLAIN, Flavour, build
from tiering.placement.index import Root

# The tests start tier-run as a user's terminal does.  A run of the suite
# started under nohup, or in the background by a shell without job control,
# ignores SIGHUP (or SIGINT, SIGQUIT), and an ignored signal is inherited by
# every child: tier-run then keeps it ignored, as nohup asks, and the tests
# that send it or check the default dispositions would measure the shell.
for _sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, signal.default_int_handler if _sig == signal.SIGINT else signal.SIG_DFL)


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed for the shim tests"
    return cc


@pytest.fixture(scope="session")
def flavour(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Flavour:
    """plain, or the sanitizer a test marked `sanitizers` runs under
    (tests/sanitizers.py): its shim built once per session."""
    kind = getattr(request, "param", "plain")
    return PLAIN if kind == "plain" else build(compiler(), kind, tmp_path_factory.mktemp(kind))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked sanitizers("asan", "tsan") runs plain and under each
    sanitizer named (marked asan, tsan: `make sanitize` runs those; and slow:
    the shim and the C programs built again with the sanitizer, then run
    several times slower, are not part of the quick loop)."""
    marker = metafunc.definition.get_closest_marker("sanitizers")
    if marker:
        kinds = [pytest.param(k, marks=[getattr(pytest.mark, k), pytest.mark.slow]) for k in marker.args]
        metafunc.parametrize("flavour", ["plain", *kinds], indirect=True, scope="session")


@pytest.fixture
def shimenv(tmp_path: Path, flavour: Flavour):
    root = tmp_path / "pfs" / "data"
    contents = make_data(root)
    tier = private_dir(tmp_path / "tier" / "data")  # as tier-run makes it: 0700
    index, slots = build_index(tmp_path, [Root(str(root), 0)], root, contents, tier)
    se = ShimEnv(root, tier, index, slots, contents, flavour.env(index.path), flavour)
    yield se
    index.close()


_CBIN: dict[str, Path] = {}   # each flavour's programs, built once (plain serves both kinds of test)


@pytest.fixture(scope="session")
def cbin(tmp_path_factory: pytest.TempPathFactory, flavour: Flavour) -> Path:
    """The C test programs (lib*.c: shared libraries), built once per
    session and flavour (a sanitizer's: with it)."""
    if flavour.name in _CBIN:
        return _CBIN[flavour.name]
    out = tmp_path_factory.mktemp(f"cbin-{flavour.name}")
    cc = compiler()
    for src in C_DIR.glob("*.c"):
        lib_args = ["-shared", "-fPIC"] if src.stem.startswith("lib") else []
        name = src.stem + (".so" if lib_args else "")
        subprocess.run([cc, "-O1", "-Wall", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-pthread", *lib_args,
                        *flavour.cflags, "-o", str(out / name), str(src)], check=True)
    _CBIN[flavour.name] = out
    return out


@pytest.fixture
def no_leftovers():
    before = set(leftovers())
    yield

    def left() -> list[str]:
        return [d for d in set(leftovers()) - before if dead_job_dir(d)]
    # tiers are removed in the background after tier-run exits: wait for that, with a bound
    try:
        wait_for(lambda: not left(), "the background removal of tier-run's directories")
    except AssertionError:
        pass
    assert left() == [], "tier-run left directories in /dev/shm"


# -- reliability: the fault and hostile-input tests and what they checked ----------

@dataclass
class Figures:
    """What one reliability test checked, as it counted it (README, "Reliability")."""

    faults: list[str] = field(default_factory=list)   # the faults the job survived
    reads: int = 0          # reads whose bytes were compared with the source
    bytes: int = 0          # bytes so compared

    def survived(self, fault: str) -> None:
        self.faults.append(fault)

    def checked(self, reads: int, nbytes: int) -> None:
        self.reads += reads
        self.bytes += nbytes


_FIGURES = pytest.StashKey[dict[str, Figures]]()


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Figures:
    """A test that takes this fixture is a reliability test (marker
    `reliability`, `make reliability`); it records what it checked here."""
    figures = Figures()
    request.config.stash.setdefault(_FIGURES, {})[request.node.nodeid] = figures
    return figures


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that run the C test programs carry the cc marker; tests that
    record reliability figures carry the reliability marker."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "cbin" in names:
            item.add_marker(pytest.mark.cc)
        if "reliability" in names:
            item.add_marker(pytest.mark.reliability)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    figures = config.stash.get(_FIGURES, {})
    passed = {r.nodeid for r in terminalreporter.stats.get("passed", [])}
    rows = [(nodeid, f) for nodeid, f in sorted(figures.items()) if nodeid in passed]
    if not rows:
        return
    tw = terminalreporter
    tw.section("reliability figures (recorded by the tests that passed)")
    tw.write_line("| test | faults survived | reads checked | bytes checked |")
    tw.write_line("|---|---|---:|---:|")
    for nodeid, f in rows:
        faults = "; ".join(f.faults) or "-"
        tw.write_line(f"| `{nodeid.removeprefix('tests/')}` | {faults} | {f.reads:,} | {f.bytes:,} |")
    tw.write_line(f"| **{len(rows)} tests** | {sum(len(f.faults) for _, f in rows)} faults | "
                  f"{sum(f.reads for _, f in rows):,} | {sum(f.bytes for _, f in rows):,} |")
