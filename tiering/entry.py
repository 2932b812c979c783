"""Console entry points.

A job's tier-run blocks the signals it forwards to COMMAND before it imports
anything: numpy (OpenBLAS) and torch start threads of their own at import,
and a thread started before the block could take a forwarded signal that
only the main thread acts on (NOTE [signals and COMMAND] in docs/design.md).
Threads started after the block inherit it.  The other `tiering` commands
keep the default signal handling (Ctrl-C stops them).
"""
from __future__ import annotations

import sys


def tier_run() -> None:
    from .command import block_signals
    block_signals()
    from .cli import tier_run as command
    command()


def tiering() -> None:
    if sys.argv[1:2] == ["run"]:
        from .command import block_signals
        block_signals()
    from .cli import main
    main()
