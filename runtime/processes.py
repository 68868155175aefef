"""Local processes as they can be recognised later, stopped, and probed.

A pid alone names a process only until it exits: the kernel hands the number to
the next program. Whatever outlives the process that recorded it (a state file
of the embedded Ray, say) therefore keeps a pid *and* its start (since the boot, which
no setting of the wall clock moves), and nothing is ever signalled unless both still
match.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

PROBE_TIMEOUT_S = 2.0
STOP_GRACE_S = 3.0  # per process, after SIGTERM, before SIGKILL
# How long a SIGKILLed process may take to exit (and drop its file locks) on a loaded
# machine, for a caller that must not start until it has.
STOP_WAIT_S = 30.0


# --- processes ------------------------------------------------------------------------


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MATCH_S = 0.05  # above a clock tick: one process's start, read twice, may differ by one


def since_boot(proc: psutil.Process) -> float:
    """When ``proc`` started, in seconds after the boot: the kernel's own count (clock
    ticks in ``/proc/<pid>/stat``), which no setting of the wall clock moves. Where
    there is no ``/proc``, psutil's wall-clock start time stands in."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            raise psutil.NoSuchProcess(proc.pid) from None
        return proc.create_time()
    ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22, starttime
    return ticks / CLOCK_TICKS


@functools.cache  # a process never outlives the boot it started in
def boot_id() -> str:
    """This boot of the machine: a pid and a start since boot name a process of it only."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcessId:
    """A process as it can be recognised later: its pid and when it started, counted
    from the boot (as the kernel does): a start time on the wall clock moves whenever
    that clock is set (NTP stepping it, a VM resumed from a snapshot), and would then
    match neither the process nor anything to stop."""

    pid: int
    since_boot: float
    boot: str
    kind: str = ""

    @classmethod
    def of(cls, pid: int, kind: str = "") -> ProcessId | None:
        try:
            return cls(pid, since_boot(psutil.Process(pid)), boot_id(), kind)
        except psutil.Error:
            return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessId:
        kind = str(data.get("kind", ""))
        if "since_boot" not in data:  # recorded by an earlier version: a wall-clock start
            since_boot = float(data["create_time"]) - psutil.boot_time()
            return cls(int(data["pid"]), since_boot, boot_id(), kind)
        return cls(int(data["pid"]), float(data["since_boot"]), str(data["boot"]), kind)

    def process(self) -> psutil.Process | None:
        """The running process, or ``None`` once it exited (a zombie has exited) or
        its pid belongs to another process now."""
        if self.boot != boot_id():
            return None  # the machine restarted since: every pid names another process
        try:
            proc = psutil.Process(self.pid)
            if abs(since_boot(proc) - self.since_boot) > MATCH_S:
                return None
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return self.process() is not None

    def same_process(self, other: ProcessId) -> bool:
        return (
            self.pid == other.pid
            and self.boot == other.boot
            and abs(self.since_boot - other.since_boot) <= MATCH_S
        )


def _gone(proc: psutil.Process) -> bool:
    """Whether ``proc`` exited; reaps it if it is our child, as nobody else will."""
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return False
        if proc.ppid() == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
        return True
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``procs`` to exit; return those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if not _gone(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def stop_processes(processes: list[ProcessId]) -> None:
    """SIGTERM each recorded process still running, in order, then SIGKILL it after a
    grace period; then the same for whatever they had started (workers, agents).

    Only a process whose pid and create time both match is signalled."""
    live = [proc for pid in processes if (proc := pid.process()) is not None]
    spawned: list[psutil.Process] = []
    for proc in live:
        with contextlib.suppress(psutil.Error):
            spawned.extend(proc.children(recursive=True))
    for proc in live:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
        for stuck in _wait_gone([proc], STOP_GRACE_S):
            with contextlib.suppress(psutil.Error):
                stuck.kill()  # psutil checks it is still the same process first
            _wait_gone([stuck], STOP_GRACE_S)
    for stuck in _wait_gone(spawned, STOP_GRACE_S):
        with contextlib.suppress(psutil.Error):
            stuck.kill()
    _wait_gone(spawned, STOP_GRACE_S)


# --- network probes ---------------------------------------------------------------------


def host_port(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``redis://host:port`` as a (host, port) pair."""
    text = address.split("://", 1)[-1].rsplit("@", 1)[-1].split("/", 1)[0]
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def tcp_answers(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts TCP connections at ``host:port`` within ``timeout_s``."""
    try:
        with socket.create_connection(host_port(address), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def tcp_refuses(address: str, attempts: int = 3, pause_s: float = 1.0) -> bool:
    """Whether ``host:port`` refuses connections ``attempts`` times in a row: nothing
    listens there. A time-out is not a refusal (a listener too busy to accept still
    listens), and one refusal may be a listener restarting its socket."""
    for attempt in range(attempts):
        if attempt:
            time.sleep(pause_s)
        try:
            with socket.create_connection(host_port(address), timeout=PROBE_TIMEOUT_S):
                return False
        except TimeoutError:
            return False
        except (OSError, ValueError):
            continue
    return True


def lock_holder(path: Path) -> int | None:
    """The pid holding a POSIX lock on ``path`` (RocksDB locks its ``LOCK`` files so),
    ``-1`` when the holder is unknown, ``None`` when nobody does."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)  # releases nothing: this process holds no lock on it
    return None if l_type == fcntl.F_UNLCK else (pid if pid > 0 else -1)
