"""tier-run's own messages on stderr, which may be closed or a broken pipe.

Nothing tier-run says may change COMMAND's exit status (NOTE [exit status]):
a message that cannot be written is dropped, and every later one with it;
fd 2 is then pointed at /dev/null so that the interpreter's last flush at
exit does not fail either (Python exits with status 120 when it does).
"""
from __future__ import annotations

import logging
import os
import sys

_gone = False


def stderr_gone() -> bool:
    return _gone


def say(text: str) -> None:
    """One message (one or more lines) on stderr, or nothing when stderr is gone."""
    write(text + "\n")


def write(text: str) -> None:
    """Text as it is (a progress bar's redraw), or nothing when stderr is gone."""
    global _gone
    stream = sys.stderr
    if _gone or stream is None:    # None: started with fd 2 closed
        _gone = True
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # EPIPE, EIO, ENOSPC, a closed stream
        _gone = True
        _to_devnull(2)


class Stderr:
    """A file-like stderr for libraries that draw on it (the progress bar):
    every write goes through write(), so a broken stderr only silences it."""

    def write(self, text: str) -> int:
        write(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return stderr_is_terminal()


def stderr_is_terminal() -> bool:
    try:
        return not _gone and sys.stderr is not None and os.isatty(sys.stderr.fileno())
    except (OSError, ValueError):
        return False


def _to_devnull(fd: int) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, fd, inheritable=False)
    except OSError:
        pass
    finally:
        os.close(null)


def reserve_standard_fds() -> None:
    """A standard descriptor (0, 1, 2) closed when tier-run started is held
    on /dev/null, close-on-exec: otherwise the next file tier-run opens (its
    index, a copy) would take that number, and a library writing to "stderr"
    would write into it.  COMMAND still starts with it closed."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                got = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return
            if got != fd:  # a lower one was free after all: leave things as they are
                os.close(got)


class SayHandler(logging.Handler):
    """Logging through say(): a record that cannot be written is dropped,
    never reported with a traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
        except Exception:  # a bad format string must not break the job either
            msg = str(record.msg)
        say(msg)


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    log = logging.getLogger("tiering")
    for h in list(log.handlers):
        if isinstance(h, SayHandler):
            log.removeHandler(h)
    handler = SayHandler()
    handler.setFormatter(logging.Formatter("tiering: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def flush_quietly() -> None:
    """Flushes stdout and stderr before exit; a failure silences that stream."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            _to_devnull(fd)
