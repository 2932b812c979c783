"""COMMAND as tier-run finds, starts, signals and waits for it
(NOTE [signals and COMMAND] in docs/design.md).

- tier-run blocks the signals it forwards, and SIGCHLD, in its main thread
  before it sets the job up, so that every thread started afterwards, its
  own and those of libraries (OpenBLAS, torch), inherits the block: a signal
  sent to tier-run is then only ever taken by sigtimedwait, never by a
  thread that would die of it or raise KeyboardInterrupt at a random point.
- While the job is being set up (before COMMAND exists) a watcher thread
  takes those signals and interrupts the main thread (with SIGURG, which it
  does not block, so that even a wait on a lock ends): the main thread
  raises Interrupted, cleans up and exits with 128 + the signal's number.
- COMMAND starts with fork + exec from the main thread, before the daemon's
  threads exist.  Between the two, the child asks the kernel for SIGTERM
  when tier-run dies (PR_SET_PDEATHSIG: a SIGKILLed tier-run leaves no
  orphan training behind a dead daemon), checks that tier-run had not died
  already, and takes an empty signal mask and the default actions of the
  signals tier-run handles (and of SIGPIPE and SIGXFSZ, which Python
  ignores); signals ignored when tier-run started stay ignored (nohup).
- A file the kernel refuses as not executable (ENOEXEC: a script without
  "#!") is run with /bin/sh, as execvp and a shell do.
- Waiting: sigtimedwait on the forwarded signals and SIGCHLD; a signal sent
  to tier-run by another process is forwarded to COMMAND; one that comes from
  the kernel (si_pid 0: the terminal sent it to the whole process group, so
  COMMAND has it already) or from COMMAND itself is not.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)
WATCHED = frozenset(FORWARDED) | {signal.SIGCHLD}
PR_SET_PDEATHSIG = 1
DEATH_SIGNAL = signal.SIGTERM
WAKE = signal.SIGURG   # the set-up's watcher interrupts the main thread with it (SetupWatch)


class CommandError(Exception):
    """COMMAND cannot be started; exit_code as a shell would give it."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def resolve_command(command: list[str]) -> str:
    if not command:
        raise CommandError("no COMMAND given; usage: tier-run --data DIR -- COMMAND [ARGS...]", 2)
    exe = shutil.which(command[0])
    if exe is None:
        if os.sep in command[0] and os.path.exists(command[0]):
            raise CommandError(f"COMMAND {command[0]!r} is not executable (chmod +x it, or run it "
                               f"through its interpreter, e.g. `python {command[0]}`)", 126)
        raise CommandError(f"COMMAND {command[0]!r} not found on PATH; check the spelling or give its full path",
                           127)
    return exe


# -- signals ---------------------------------------------------------------------

def block_signals() -> set[int]:
    """Blocks WATCHED in the calling thread (and every thread it starts
    from now on); returns the mask before."""
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED))


def ignored_at_start() -> set[int]:
    """Forwarded signals tier-run was started with set to ignore (nohup...):
    COMMAND inherits that, and they are not forwarded."""
    return {s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN}


def wait_signal(signals: frozenset[int] | tuple[int, ...], timeout: float) -> signal.struct_siginfo | None:
    """signal.sigtimedwait, without its garbage: a wait interrupted (EINTR:
    tier-run stopped with SIGSTOP and continued) after its timeout has passed
    returns an uninitialised siginfo in CPython (si_signo -1, say), which
    would be forwarded to COMMAND (os.kill fails with EINVAL: tier-run dies
    and takes COMMAND with it).  Only a signal of the set counts."""
    info = signal.sigtimedwait(signals, timeout)
    return info if info is not None and info.si_signo in signals else None


def child_defaults(ignored: set[int]) -> frozenset[int]:
    """The signals a child of tier-run takes with their default action: those
    tier-run handles or blocks and those Python ignores; those ignored when
    tier-run started stay ignored (nohup)."""
    return frozenset((set(FORWARDED) - ignored) | {signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, WAKE})


def as_plain_child(ignored: set[int]) -> None:
    """In a child that tier-run forks to run Python (no exec: the catalog
    cache writer): the signals' default actions and an empty mask, as
    COMMAND gets them."""
    for s in child_defaults(ignored):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def restore_signals(old_mask: set[int]) -> None:
    """Drops forwarded signals still pending (COMMAND is gone: there is no one
    left to forward them to) and puts the old mask back."""
    while signal.sigtimedwait(WATCHED, 0) is not None:
        pass
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


class Interrupted(KeyboardInterrupt):
    """A forwarded signal reached tier-run before COMMAND started."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class SetupWatch:
    """While the job is set up (signals blocked, no COMMAND yet): a forwarded
    signal interrupts the main thread, which raises Interrupted."""

    WAKE = WAKE   # ignored by default; the handler acts only when a signal was caught

    def __init__(self, ignored: set[int]):
        self.ignored = ignored
        self.caught: int | None = None
        self._main = threading.get_ident()
        self._stop, self._thread = self._watcher()
        self._old_wake: Any = None

    def _watcher(self) -> tuple[threading.Event, threading.Thread]:
        return threading.Event(), threading.Thread(target=self._run, name="tiering-setup-signals", daemon=True)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No watcher thread in the block (a fork, NOTE [cache written
        aside]): a signal sent meanwhile stays pending (blocked) and is taken
        when the watcher runs again."""
        self._stop.set()
        self._thread.join()
        try:
            yield
        finally:
            self._stop, self._thread = self._watcher()
            self._thread.start()

    def __enter__(self) -> SetupWatch:
        self._old_wake = signal.signal(self.WAKE, self._woken)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        signal.signal(self.WAKE, self._old_wake)
        if kind is None and self.caught is not None:   # caught, and set-up ended before the wake-up
            self._woken(self.WAKE, None)

    def _woken(self, _signum: int, _frame: Any) -> None:
        if self.caught is not None:
            sig, self.caught = self.caught, None
            raise Interrupted(sig)

    def _run(self) -> None:
        while not self._stop.is_set():
            info = wait_signal(FORWARDED, 0.05)
            if info is not None and info.si_signo not in self.ignored and self.caught is None:
                self.caught = info.si_signo
                signal.pthread_kill(self._main, self.WAKE)


def wait_forwarding(pid: int, ignored: set[int], on_tick: Callable[[], None], tick: float = 1.0) -> int:
    """Waits for COMMAND and returns its exit status (128+N for signal N),
    forwarding the signals other processes send to tier-run; on_tick runs
    about every `tick` seconds meanwhile."""
    last = time.monotonic()
    while True:
        info = wait_signal(WATCHED, tick)
        if info is not None and info.si_signo != signal.SIGCHLD:
            if info.si_pid not in (0, pid) and info.si_signo not in ignored:
                try:
                    os.kill(pid, info.si_signo)
                except ProcessLookupError:
                    pass
            continue
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
        if time.monotonic() - last >= tick:
            last = time.monotonic()
            on_tick()


# -- starting COMMAND -----------------------------------------------------------

def _prctl() -> Callable[..., int] | None:
    try:
        f = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    f.restype = ctypes.c_int
    return f


def _child_setup(parent: int, defaults: frozenset[int]) -> Callable[[], None]:
    """What the child does between fork and exec (everything it needs is
    bound beforehand: it imports and looks up nothing)."""
    prctl = _prctl()
    getppid, exit_now, setsig, setmask = os.getppid, os._exit, signal.signal, signal.pthread_sigmask
    dfl, setmask_how = signal.SIG_DFL, signal.SIG_SETMASK

    def setup() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)
        if getppid() != parent:         # tier-run died before the line above
            exit_now(128 + DEATH_SIGNAL)
        for s in defaults:
            setsig(s, dfl)
        setmask(setmask_how, ())

    return setup


def exec_plain(command: list[str], exe: str, ignored: set[int]) -> None:
    """Replaces tier-run with COMMAND, unchanged (tier-run's environment, no
    shim), with the signals as spawn gives them: what runs when no tier can
    be used (NOTE [no usable tier]).  Returns only by CommandError."""
    as_plain_child(ignored)
    try:
        os.execv(exe, command)
    except OSError as e:
        if e.errno != errno.ENOEXEC:
            raise CommandError(f"cannot start COMMAND {command[0]!r}: {e.strerror}",
                               126 if e.errno in (errno.EACCES, errno.EISDIR) else 127) from None
    try:           # execvp's rule: a file the kernel does not recognise is a shell script
        os.execv("/bin/sh", ["/bin/sh", exe, *command[1:]])
    except OSError as e:
        raise CommandError(f"cannot start COMMAND {command[0]!r} with /bin/sh: {e.strerror}", 126) from None


def spawn(command: list[str], exe: str, env: dict[str, str], ignored: set[int]) -> subprocess.Popen[bytes]:
    """Starts COMMAND (argv as given, found at exe) with env; file
    descriptors and the terminal are inherited as from a shell."""
    setup = _child_setup(os.getpid(), child_defaults(ignored))
    try:
        return subprocess.Popen(command, executable=exe, env=env, close_fds=False, preexec_fn=setup)
    except OSError as e:
        if e.errno != errno.ENOEXEC:
            raise CommandError(f"cannot start COMMAND {command[0]!r}: {e.strerror}",
                               126 if e.errno in (errno.EACCES, errno.EISDIR) else 127) from None
    # execvp's rule: a file the kernel does not recognise is a shell script
    try:
        return subprocess.Popen(["/bin/sh", exe, *command[1:]], executable="/bin/sh", env=env, close_fds=False,
                                preexec_fn=setup)
    except OSError as e:
        raise CommandError(f"cannot start COMMAND {command[0]!r} with /bin/sh: {e.strerror}", 126) from None
