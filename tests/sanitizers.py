"""The sanitized builds of the shim and of the C test programs.  A test
marked `sanitizers("asan", "tsan")` runs as it is and again under each
sanitizer named (conftest's `flavour`): AddressSanitizer with UBSan, and
ThreadSanitizer.  Every program a ShimEnv runs under a sanitizer fails the
test when the sanitizer reports (docs/design.md, NOTE [sanitizers])."""
from __future__ import annotations

import ast
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tiering.shimlib import library_path

REPO = Path(__file__).resolve().parent.parent
SUPPRESSIONS = Path(__file__).resolve().parent / "c" / "tsan.supp"
REPORT_EXIT = 86   # the exit status of a sanitized program that reported
REPORT = re.compile(r"Sanitizer|runtime error:")   # how every report (and TSan's warnings) begins or ends

# -g: the reports name lines; -Wno-tsan: TSan does not model atomic fences
# (the event ring's seqlock has two), said once at each build
FLAGS = {
    "asan": ["-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "tsan": ["-g", "-fsanitize=thread", "-Wno-tsan"],
}
OPTIONS = {
    # detect_leaks=0: CPython, which the concurrency tests run under the
    # shim, does not free everything at exit (the shim allocates nothing)
    "asan": {"ASAN_OPTIONS": f"halt_on_error=1:exitcode={REPORT_EXIT}:detect_leaks=0",
             "UBSAN_OPTIONS": f"halt_on_error=1:print_stacktrace=1:exitcode={REPORT_EXIT}"},
    "tsan": {"TSAN_OPTIONS": f"halt_on_error=1:exitcode={REPORT_EXIT}:suppressions={SUPPRESSIONS}"},
}
RUNTIME = {"asan": "libasan.so", "tsan": "libtsan.so"}


@dataclass(frozen=True)
class Flavour:
    """How the shim and the C test programs are built and run: plain, or
    under a sanitizer (its runtime preloaded first, then the shim built
    with it)."""

    name: str = "plain"
    cflags: tuple[str, ...] = ()
    preload: str = ""        # LD_PRELOAD of a program under the shim ("": the package's shim)
    options: dict[str, str] = field(default_factory=dict)

    def env(self, index: Path) -> dict[str, str]:
        """This environment, with the shim preloaded on index."""
        env = dict(os.environ, LD_PRELOAD=self.preload or str(library_path()), TIERING_INDEX=str(index),
                   **self.options)
        env.pop("TIERING_DISABLE", None)
        return env

    def check(self, r: subprocess.CompletedProcess[str]) -> None:
        """Fails when the sanitizer reported in the run r (in the program or
        in any child of it: the report is on stderr either way)."""
        if self.name != "plain" and (r.returncode == REPORT_EXIT or REPORT.search(r.stderr or "")):
            raise AssertionError(f"{self.name} reported (exit status {r.returncode}):\n{r.stderr[-8000:]}")


PLAIN = Flavour()


def shim_cflags() -> list[str]:
    """SHIM_CFLAGS of setup.py: the flags the shim is built with."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHIM_CFLAGS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py assigns no SHIM_CFLAGS")


def build(cc: str, kind: str, out: Path) -> Flavour:
    """The shim (shim/*.c) built under the sanitizer kind into out."""
    shim = out / f"libtiershim-{kind}.so"
    r = subprocess.run([cc, *shim_cflags(), *FLAGS[kind], "-shared", "-o", str(shim),
                        *map(str, sorted((REPO / "shim").glob("*.c"))), "-ldl"], capture_output=True, text=True)
    assert r.returncode == 0, f"cannot build the shim with {FLAGS[kind]} (run `make sanitizer-deps`):\n{r.stderr}"
    runtime = subprocess.run([cc, f"-print-file-name={RUNTIME[kind]}"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(runtime), f"{cc} has no {RUNTIME[kind]} (run `make sanitizer-deps`)"
    return Flavour(kind, tuple(FLAGS[kind]), f"{os.path.realpath(runtime)}:{shim}", OPTIONS[kind])
