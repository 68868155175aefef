"""A private Ray head whose GCS lives in a Redis server with append-only persistence,
and a way to take that head down as hard as ``ray stop --force`` does.

Used by ``tests/test_head_restart.py`` and ``bench/restart.py`` to show that
metadata outlives all of Ray: Ray's GCS fault tolerance writes the GCS tables
and its KV store (where every topic, subscription, consumer registration,
policy and limit lives) to Redis, so a head started again on the same Redis finds them,
and restarts the detached actors by itself.

Why not ``ray stop --force``: it kills every Ray process on the machine, the
other tests' clusters and anyone else's included. This head gets its own short
``--temp-dir`` (Ray's unix socket paths must stay under ~107 bytes) and fixed
free ports, and ``kill()`` SIGKILLs exactly its processes. What identifies them,
as Ray 2.60 starts them: ``gcs_server``, ``raylet`` and the dashboard carry the
temp/session directory on their command lines; the monitor, log monitor and
Ray client server carry the GCS address (``--gcs-address=`` / ``--address=``).
Workers, the dashboard agent and the runtime env agent retitle themselves
(``ray::IDLE``, ``ray::DashboardAgent``, ...), so they are found as the raylet's
descendants instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.connect import local_system_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

RAY = str(Path(sys.executable).with_name("ray"))


def redis_server_binary() -> str | None:
    """Debian's redis-server, on PATH or where its package puts it."""
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    return found if Path(found).exists() else None


@dataclass
class RedisServer:
    """A private redis-server on loopback, append-only file fsynced every second: the
    persistence Ray's GCS fault tolerance needs to survive the head."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port)]
            + ["--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "everysec"]
            + ["--save", "", "--protected-mode", "no", "--daemonize", "no"]
            + ["--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _accepts(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server did not start; see {self.directory}/redis.log")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


# What ``ray start`` says when a node's raylet did not register within Ray's 30 s.
STARTUP_TIMED_OUT = "The current node timed out during startup"


@dataclass
class RayHead:
    """One ``ray start --head`` on Redis, restartable on the same ports and temp dir."""

    redis: RedisServer
    storage_root: Path
    num_cpus: int = 2
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp")))
    port: int = field(default_factory=free_port)
    # Fixed too, or a second cluster on the machine collides with Ray's defaults
    # (client server 10001, dashboard 8265 with no retries, agent 52365).
    client_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    # Ray's token authentication on, with the token in this file (None: off).
    auth_token: Path | None = None
    # The environment every node's processes get besides ``env()``'s (head and workers).
    node_env: dict[str, str] = field(default_factory=dict)
    # Worker nodes (``add_worker``): each one's own environment and resources, so that
    # ``start_workers`` starts the same nodes again after a restart.
    workers: list[tuple[dict[str, str], dict[str, float]]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, namespace: str | None = None) -> dict[str, str]:
        """The environment of ``ray start`` and of every program that joins this head."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_", "RAY_REDIS"))
        }
        env |= {
            "RAY_AUTH_MODE": "disabled" if self.auth_token is None else "token",
            "RAYTOPICS_STORAGE_ROOT": str(self.storage_root),
            "PYTHONPATH": str(ROOT),
        }
        if self.auth_token is not None:
            env["RAY_AUTH_TOKEN_PATH"] = str(self.auth_token)
        env |= self.node_env
        if namespace is not None:
            env |= {"RAY_ADDRESS": self.address, "RAYTOPICS_NAMESPACE": namespace}
        return env

    def start(self) -> float:
        """``ray start --head`` (returns once Ray says the head is up); its duration in s."""
        command = [RAY, "start", "--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}"]
        command += [f"--num-cpus={self.num_cpus}", "--include-dashboard=false"]
        command += [f"--ray-client-server-port={self.client_port}"]
        command += [f"--dashboard-port={self.dashboard_port}"]
        command += [f"--dashboard-agent-listen-port={self.agent_port}"]
        command += ["--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats"]
        command += [f"--system-config={json.dumps(local_system_config())}"]
        env = self.env() | {"RAY_REDIS_ADDRESS": self.redis.address}
        started = time.perf_counter()
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return time.perf_counter() - started

    def add_worker(self, env: dict[str, str], resources: dict[str, float]) -> None:
        """A worker node on this machine (one CPU), its processes given ``env`` too;
        started now and by every ``start_workers`` after a restart."""
        self.workers.append((env, resources))
        self._start_worker(env, resources)

    def start_workers(self) -> None:
        for env, resources in self.workers:
            self._start_worker(env, resources)

    def _start_worker(self, env: dict[str, str], resources: dict[str, float]) -> None:
        """``ray start --address``, in this head's temp dir (so that ``kill`` finds its
        processes), on ports of its own (every node here shares the machine).

        Ray gives a new node's raylet 30 s to register, a bound of its own code: on a
        loaded machine it can miss it and ``ray start`` fails, leaving that raylet
        running. Its processes are then stopped and the node started once more."""
        for attempt in (1, 2):
            port = free_port()
            done = self._ray_start_worker(env, resources, port)
            if done.returncode == 0:
                return
            if attempt == 1 and STARTUP_TIMED_OUT in done.stdout + done.stderr:
                self._kill_node(port)
                continue
            raise RuntimeError(f"ray start failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def _ray_start_worker(
        self, env: dict[str, str], resources: dict[str, float], node_manager_port: int
    ) -> subprocess.CompletedProcess:
        command = [RAY, "start", f"--address={self.address}", f"--temp-dir={self.temp_dir}"]
        command += ["--num-cpus=1", f"--resources={json.dumps(resources)}"]
        command += [f"--node-manager-port={node_manager_port}"]
        command += [f"--object-manager-port={free_port()}"]
        command += [f"--dashboard-agent-listen-port={free_port()}"]
        command += [f"--dashboard-agent-grpc-port={free_port()}"]
        command += [f"--metrics-export-port={free_port()}"]
        command += [f"--runtime-env-agent-port={free_port()}"]
        command += ["--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats"]
        return subprocess.run(
            command, env=self.env() | env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    def _kill_node(self, node_manager_port: int) -> None:
        """SIGKILL the raylet serving on ``node_manager_port``, and its children."""
        mark = f"--node_manager_port={node_manager_port}"
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                if mark in proc.cmdline():
                    for child in [*proc.children(recursive=True), proc]:
                        with contextlib.suppress(psutil.Error):
                            child.send_signal(signal.SIGKILL)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this head (see the module docstring for how)."""
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            args = proc.info["cmdline"] or []
            if proc.pid not in mine and any(
                str(self.temp_dir) in arg or arg.endswith(f":{self.port}") for arg in args
            ):
                found[proc.pid] = proc
        for proc in list(found.values()):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    found.setdefault(child.pid, child)
        return [p for p in found.values() if p.pid not in mine and _running(p)]

    def kill(self, timeout_s: float = 30.0) -> int:
        """SIGKILL every process of this head, as ``ray stop --force`` would (but only
        these); returns how many there were, once all are gone."""
        victims = self.processes()
        for proc in victims:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while any(_running(p) for p in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of {self.temp_dir} outlived SIGKILL")
            time.sleep(0.05)
        return len(victims)


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie waiting for its (dead) parent's reaper."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def head_on_redis(
    directory: Path,
    num_cpus: int = 2,
    auth_token: Path | None = None,
    node_env: dict[str, str] | None = None,
) -> Iterator[RayHead]:
    """A Redis server and a Ray head on it, both stopped (the head SIGKILLed, and any
    worker nodes added to it) on exit, whatever happened in between."""
    redis = RedisServer(directory / "redis")
    head = RayHead(
        redis, directory / "segments", num_cpus=num_cpus, auth_token=auth_token,
        node_env=node_env or {},
    )  # fmt: skip
    try:
        redis.start()
        head.start()
        yield head
    finally:
        try:
            head.kill()
        finally:
            redis.stop()
            shutil.rmtree(head.temp_dir, ignore_errors=True)


def run_phase(script: str, phase: str, out: Path, env: dict[str, str], timeout_s: float) -> dict:
    """Run ``script``'s ``phase`` as a program of its own (a driver joins one Ray for life),
    which writes its result to ``out`` as JSON; the result, or the test fails with the
    program's output."""
    proc = subprocess.run(
        [sys.executable, script, phase, str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert proc.returncode == 0 and out.exists(), (
        f"{phase} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return json.loads(out.read_text())
