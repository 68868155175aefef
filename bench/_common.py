"""What the benchmarks share: the machine they ran on and the peers they compare
against, a private Redis server and a private NATS JetStream server on loopback."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RedisServer:
    client: Any  # redis.Redis
    port: int
    version: str
    pid: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[RedisServer]:
    """A private redis-server with AOF + everysec, the setting Redis recommends."""
    binary = server_binary("redis-server")
    import redis

    port = free_port()
    data = directory / "redis"
    data.mkdir()
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data)]
        + ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        + ["--protected-mode", "no", "--daemonize", "no", "--logfile", str(data / "log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start; see {data / 'log'}") from None
                time.sleep(0.05)
        yield RedisServer(client, port, client.info("server")["redis_version"], process.pid)
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class NatsServer:
    url: str
    version: str
    pid: int


@contextlib.contextmanager
def nats_server(directory: Path) -> Iterator[NatsServer]:
    """A private nats-server with JetStream on (file storage under ``directory``)."""
    binary = server_binary("nats-server")
    port, store = free_port(), directory / "nats"
    store.mkdir()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    process = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.05)
        yield NatsServer(f"nats://127.0.0.1:{port}", version.split()[-1], process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


def server_binary(name: str) -> str:
    """The path of a peer's server program (Debian's package has the same name)."""
    binary = shutil.which(name)
    if binary is None:
        raise FileNotFoundError(
            f"{name} is not installed; on Debian/Ubuntu: apt-get install -y {name}"
        )
    return binary


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gb"] = round(int(line.split()[1]) / 1e6, 1)
    with contextlib.suppress(Exception):
        info["commit"] = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    with contextlib.suppress(Exception):
        import pyarrow
        import ray
        import redis

        info["ray"] = ray.__version__
        info["pyarrow"] = pyarrow.__version__
        info["redis_py"] = redis.__version__
        info["redis_py_parser"] = "hiredis" if _has_hiredis() else "pure Python"
    return info


def _has_hiredis() -> bool:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return False
    return True


def report(benchmark: str, started: float, machine: dict[str, Any], **sections: Any) -> dict:
    """A results file's content: what ran, when, for how long, where, then ``sections``."""
    return {
        "benchmark": benchmark,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - started, 1),
        "machine": machine,
        **sections,
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")


# --- rounds in child processes: a fresh Ray each ---------------------------------------


def round_in_child(script: str, *options: str) -> dict[str, Any]:
    """Run ``script`` with ``options`` (one round) in a child process and return what it
    printed with ``print_round``."""
    out = subprocess.run(
        [sys.executable, script, *options], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])


def print_round(prefix: str, one_round: Any) -> int:
    """In the child: ``one_round()`` on a storage root of its own, its result printed for
    ``round_in_child``."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.environ["RAYTOPICS_STORAGE_ROOT"] = tmp
        print("RESULT", json.dumps(one_round()), flush=True)
    return 0
