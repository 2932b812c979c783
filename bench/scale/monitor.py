"""Running a command while the OS measures it: wall time, peak RSS and CPU
seconds of the process itself (polled from /proc, so COMMAND under tier-run
is not counted), the rusage of its whole tree (wait4), and a wall-clock
limit after which it is killed and recorded as such."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

POLL = 0.05


@dataclass
class Sample:
    t: float          # wall clock (time.time())
    cpu: float        # user + system seconds of the process itself
    rss: int          # bytes
    hwm: int          # peak RSS so far (VmHWM), bytes


@dataclass
class Finished:
    cmd: list[str]
    launched: float              # wall clock just before the fork
    exited: float                # wall clock when wait4 returned (within POLL)
    status: int | None           # exit status; None when killed by a signal or by the limit
    killed: bool                 # exceeded the wall-clock limit
    tree_maxrss: int             # bytes, wait4's ru_maxrss: the largest process of the tree
    tree_cpu: float              # user + system seconds of the tree (wait4)
    samples: list[Sample] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.exited - self.launched

    @property
    def peak_rss(self) -> int:
        """The process's own peak RSS (VmHWM, last sample before it exited)."""
        return max((s.hwm for s in self.samples), default=0)

    @property
    def cpu(self) -> float:
        """The process's own CPU seconds, last sample before it exited."""
        return self.samples[-1].cpu if self.samples else 0.0

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """CPU seconds the process used between two wall-clock times (from the
        samples nearest inside the interval); None when the interval is too short."""
        inside = [s for s in self.samples if t0 <= s.t <= t1]
        if len(inside) < 2 or inside[-1].t - inside[0].t < 0.5:
            return None
        return (inside[-1].cpu - inside[0].cpu) / (inside[-1].t - inside[0].t) * (t1 - t0)

    def peak_rss_until(self, t: float) -> int | None:
        """The process's peak RSS as of wall-clock time t (the last sample
        at or before it); None before the first sample."""
        before = [s.hwm for s in self.samples if s.t <= t]
        return before[-1] if before else None

    def core_share(self, t0: float, t1: float) -> float | None:
        """Share of one core the process used between t0 and t1 (0.1 = 10%)."""
        cpu = self.cpu_between(t0, t1)
        return None if cpu is None else cpu / (t1 - t0)


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _sample(proc: psutil.Process) -> Sample | None:
    try:
        t = proc.cpu_times()
        return Sample(time.time(), t.user + t.system, _status_kib(proc.pid, "VmRSS:"),
                      _status_kib(proc.pid, "VmHWM:"))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _kill_group(pid: int) -> None:
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
            time.sleep(0.1)


def run(cmd: list[str], log: Path, limit: float, env: dict[str, str] | None = None) -> Finished:
    """Run cmd in its own session (stdout to `log`, stderr to `log`.err),
    sampling it every POLL s; past `limit` seconds its process group is
    terminated."""
    with log.open("w") as out, log.with_name(log.name + ".err").open("w") as err:
        launched = time.time()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    proc = psutil.Process(p.pid)
    samples: list[Sample] = []
    killed = False
    while True:
        pid, wstatus, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            break
        if time.time() - launched > limit:
            killed = True
            _kill_group(p.pid)
            wstatus, ru = 0, None  # type: ignore[assignment]
            break
        s = _sample(proc)
        if s is not None:
            samples.append(s)
        time.sleep(POLL)
    exited = time.time()
    p.returncode = -1  # reaped here, not by Popen
    status = os.waitstatus_to_exitcode(wstatus) if ru is not None else None
    return Finished(cmd, launched, exited, None if killed or (status is not None and status < 0) else status,
                    killed, ru.ru_maxrss * 1024 if ru else 0, ru.ru_utime + ru.ru_stime if ru else 0.0, samples)


def timed_shell(script: str, log: Path, limit: float) -> tuple[float, str, bool]:
    """Wall seconds, stdout and success of a shell pipeline (a reference)."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        log.write_text(f"$ {script}\nkilled after {limit} s\n")
        return time.monotonic() - t0, "", False
    seconds = time.monotonic() - t0
    log.write_text(f"$ {script}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return seconds, r.stdout, r.returncode == 0
