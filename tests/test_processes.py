"""runtime.processes and the embedded head's checks built on it, on real sockets,
processes and POSIX locks: when a head counts as gone, and waiting for a stopped
GCS to let go of its RocksDB tables."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.embedded import _check_rocksdb_free
from runtime.errors import ConflictError
from runtime.processes import tcp_refuses

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
