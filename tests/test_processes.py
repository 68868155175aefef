"""runtime.processes and the embedded head's checks built on it, on real sockets,
processes and POSIX locks: when a head counts as gone, and waiting for a stopped
GCS to let go of its RocksDB tables."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import psutil._pslinux
import pytest

from runtime.embedded import _check_rocksdb_free
from runtime.errors import ConflictError
from runtime.processes import ProcessId, stop_processes, tcp_refuses

# Locks a file as RocksDB locks its LOCK, says so, and holds it for argv[2] seconds.
HOLD_LOCK = """
import fcntl, sys, time
handle = open(sys.argv[1], "a+")
fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_closed_port_refuses_and_a_listener_that_never_accepts_does_not() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    assert tcp_refuses(closed, attempts=2, pause_s=0.01)

    with socket.socket() as busy:  # listens, but its program never calls accept()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        assert not tcp_refuses(f"127.0.0.1:{busy.getsockname()[1]}", attempts=2, pause_s=0.01)


def test_a_listener_back_before_the_last_attempt_is_not_refusing() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    back = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, time; time.sleep(0.5); s = socket.socket(); "
         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
         f"s.bind(('127.0.0.1', {port})); s.listen(8); time.sleep(30)"],
    )  # fmt: skip
    try:
        assert not tcp_refuses(f"127.0.0.1:{port}", attempts=5, pause_s=0.5)
    finally:
        back.kill()
        back.wait(timeout=30)


def _hold(lock: Path, seconds: float) -> subprocess.Popen[str]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock), str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_held_rocksdb_lock_is_refused_naming_its_holder(tmp_path: Path) -> None:
    gcs = tmp_path / "gcs"
    _check_rocksdb_free(gcs)  # no tables yet
    holder = _hold(gcs / "tables" / "LOCK", 60)
    try:
        started = time.monotonic()
        with pytest.raises(ConflictError, match=rf"tables/LOCK is locked by pid {holder.pid}"):
            _check_rocksdb_free(gcs, wait_s=0.5)
        assert 0.5 <= time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait(timeout=30)
    _check_rocksdb_free(gcs)


def test_a_lock_let_go_within_the_wait_is_free(tmp_path: Path) -> None:
    """A GCS just stopped drops its lock only when it has exited: waiting covers it."""
    gcs = tmp_path / "gcs"
    holder = _hold(gcs / "tables" / "LOCK", 1.0)
    try:
        with pytest.raises(ConflictError):
            _check_rocksdb_free(gcs)
        started = time.monotonic()
        _check_rocksdb_free(gcs, wait_s=30)
        assert time.monotonic() - started < 20
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_recorded_process_is_still_itself_after_the_wall_clock_is_set(monkeypatch) -> None:
    """NTP stepping the clock, or a VM resumed from a snapshot, moves the boot time that
    wall-clock start times are computed from: the process must still match, and be
    stopped when asked, or a live head counts as gone and cannot be stopped."""
    child = _sleeper()
    try:
        recorded = ProcessId.of(child.pid, "gcs_server")
        assert recorded is not None and recorded.alive()
        wall = psutil.Process(child.pid).create_time()
        stepped = psutil.boot_time() + 7.5
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)
        assert psutil.Process(child.pid).create_time() == pytest.approx(wall + 7.5)
        again = ProcessId.from_dict(asdict(recorded))
        assert again == recorded and again.alive() and again.same_process(recorded)
        stop_processes([again])  # reaps its own child: child.wait() cannot see how it ended
        assert not recorded.alive() and not psutil.pid_exists(child.pid)
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_record_of_an_earlier_version_or_another_boot(monkeypatch) -> None:
    child = _sleeper()
    try:
        wall = psutil.Process(child.pid).create_time()
        earlier = ProcessId.from_dict({"pid": child.pid, "create_time": wall, "kind": "raylet"})
        assert earlier.alive() and earlier.kind == "raylet"
        assert not ProcessId.from_dict({"pid": child.pid, "create_time": wall - 5}).alive()
        other_boot = ProcessId(child.pid, earlier.since_boot, "another-boot")
        assert not other_boot.alive() and not other_boot.same_process(earlier)
        stop_processes([other_boot])  # never signals a process it cannot recognise
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(timeout=30)
