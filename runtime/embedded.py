"""The embedded Ray: one durable local head per storage root, shared by its programs.

Every topic, subscription, cursor, policy and limit lives in Ray's GCS key-value
store. A program that calls ``ray.init()`` gets a private head that keeps those
tables in memory and dies with the program, while the segment logs it wrote stay
on disk with nothing left that finds them. So when no cluster is given, the
system runs on a head whose GCS keeps its tables in RocksDB under
``<storage root>/.metadata/gcs`` (a leading dot never names a tenant), started
detached from the program that needs it, and shared by every program using that
storage root, one after the other or at the same time.

Two GCS processes on one RocksDB directory must never run: the second crashes on
RocksDB's ``LOCK`` file and its program waits forever for it. Hence:

* Everything about the head (reading its record, joining it, starting or
  stopping it) happens under an exclusive ``flock`` of
  ``.metadata/embedded.lock``, and ``.metadata/embedded.json`` records the head
  (GCS address, its processes) and its users.
* Processes are recorded as pid plus create time, so a pid the kernel reused
  for another program is never taken for a user, nor ever signalled.
* The last user to leave (``leave()``, also run at process exit) stops the
  head. A user killed before it could leave is pruned by the next program that
  takes the lock; a head left with no live user is joined, and later stopped,
  by the next program of that storage root.
* Before starting a head, the RocksDB ``LOCK`` files are checked: a process
  other than the recorded head holding one is an error naming the file, never
  a start that cannot finish.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runtime.errors import ConflictError, InvalidArgumentError, UnavailableError
from runtime.listen import NODE_ENV
from runtime.processes import (
    PROBE_TIMEOUT_S,
    STOP_WAIT_S,
    ProcessId,
    host_port,
    lock_holder,
    stop_processes,
    tcp_refuses,
)

METADATA_DIR = ".metadata"  # under the storage root; never a valid tenant name
LOCK_FILE = "embedded.lock"
STATE_FILE = "embedded.json"
GCS_DIR = "gcs"
REDIS_ADDRESS_ENV = "RAY_REDIS_ADDRESS"  # Ray's own switch to a Redis-backed GCS

LOCK_TIMEOUT_S = 120.0  # a head start holds the lock for seconds, never minutes
_REQUIRED = ("gcs_server", "raylet")  # a head missing either cannot take a driver

# ray.init() arguments that configure the head it would start, and the RayParams
# field each one sets. A driver joining a running head cannot apply them.
_HEAD_PARAMS = {
    "num_cpus": "num_cpus",
    "num_gpus": "num_gpus",
    "resources": "resources",
    "labels": "labels",
    "object_store_memory": "object_store_memory",
    "include_dashboard": "include_dashboard",
    "dashboard_host": "dashboard_host",
    "dashboard_port": "dashboard_port",
    "_system_config": "_system_config",
    "_memory": "memory",
    "_plasma_directory": "plasma_directory",
    "_object_spilling_directory": "object_spilling_directory",
    "_enable_object_reconstruction": "enable_object_reconstruction",
    "_node_name": "node_name",
    "_tracing_startup_hook": "tracing_startup_hook",
}
_ISOLATION_ARGS = ("enable_resource_isolation", "cgroup_path", "system_reserved_cpu",
                   "system_reserved_memory")  # fmt: skip
HEAD_ONLY_ARGS = (*_HEAD_PARAMS, *_ISOLATION_ARGS)
# A program's own settings, never the head's: every actor of every later program
# would inherit them from the raylet (auth tokens file, durability, limits, ...).
_PRIVATE_ENV_PREFIX = "RAYTOPICS_"  # but a node's own (NODE_ENV): its starter speaks for it
# Ray's log monitor looks for new log files ten times a second while a session has fewer
# than 1,000 of them (every worker adds three): half of its idle CPU, a few ms a second
# for as long as the head runs (bench/README.md, idle.py). Once a second, a new worker's
# first lines still reach its driver within a second; the variables set for the head
# (Ray reads them from its processes' environment) win over these.
QUIET_RAY_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "1"}


# --- probes -------------------------------------------------------------------------------


def check_redis(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``UnavailableError`` naming ``address`` unless a Redis server answers there
    (a PING answered, even by "auth required", proves a Redis is listening)."""
    for one in dict.fromkeys(a.strip() for a in address.split(",") if a.strip()):
        try:
            with socket.create_connection(host_port(one), timeout=timeout_s) as sock:
                sock.settimeout(timeout_s)
                if one.startswith("rediss://"):
                    continue  # TLS: the TCP handshake is all a plain probe can check
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise UnavailableError(
                f"{REDIS_ADDRESS_ENV}={address}: cannot reach Redis at {one} ({reason}); "
                f"start that Redis, or unset {REDIS_ADDRESS_ENV} to keep the embedded "
                "Ray's metadata in RocksDB under the storage root"
            ) from None
        if not reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR")):
            raise UnavailableError(
                f"{REDIS_ADDRESS_ENV}={address}: {one} answered PING with {reply[:40]!r}, "
                "which is not Redis"
            )


# --- the state file -----------------------------------------------------------------------


@dataclass
class HeadRecord:
    """The running head: how to reach it, where it keeps metadata, what to stop."""

    head_id: str
    gcs_address: str
    metadata: str  # a directory (RocksDB) or "redis://host:port"
    started_by: ProcessId
    started_at: float
    auth_mode: str
    ray_version: str
    session_dir: str
    processes: list[ProcessId]  # in the order they are stopped

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["started_by"] = asdict(self.started_by)
        data["processes"] = [asdict(p) for p in self.processes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadRecord:
        return cls(
            head_id=str(data["head_id"]),
            gcs_address=str(data["gcs_address"]),
            metadata=str(data["metadata"]),
            started_by=ProcessId.from_dict(data["started_by"]),
            started_at=float(data["started_at"]),
            auth_mode=str(data.get("auth_mode", "")),
            ray_version=str(data.get("ray_version", "")),
            session_dir=str(data.get("session_dir", "")),
            processes=[ProcessId.from_dict(p) for p in data["processes"]],
        )

    def why_unusable(self) -> str | None:
        """Why no driver can join it (a recorded GCS or raylet exited, or the GCS
        refuses connections), or ``None``. A GCS slow to accept counts as usable: a
        loaded machine must not make the next program stop a head others are using."""
        required = [p for p in self.processes if p.kind in _REQUIRED]
        missing = set(_REQUIRED) - {p.kind for p in required}
        if missing:
            return f"no {', '.join(sorted(missing))} recorded"
        for process in required:
            if not process.alive():
                return f"its {process.kind} (pid {process.pid}) exited"
        if tcp_refuses(self.gcs_address):
            return f"its GCS refuses connections at {self.gcs_address}"
        return None


@dataclass
class State:
    head: HeadRecord | None = None
    users: list[ProcessId] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> State:
        """The recorded state; an unreadable file counts as no head (the RocksDB lock
        check still stops a second GCS on the same tables)."""
        try:
            data = json.loads(path.read_text())
            head = HeadRecord.from_dict(data["head"]) if data.get("head") else None
            return cls(head, [ProcessId.from_dict(u) for u in data.get("users", [])])
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"raytopics: ignoring the unreadable {path} ({err})", file=sys.stderr)
            return cls()

    def write(self, path: Path) -> None:
        data = {
            "head": self.head.to_dict() if self.head else None,
            "users": [asdict(u) for u in self.users],
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as out:
            json.dump(data, out, indent=2)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)


# --- the lock ---------------------------------------------------------------------------


def metadata_dir(storage_root: Path) -> Path:
    return storage_root / METADATA_DIR


def prepare(storage_root: Path) -> Path:
    """Create ``<root>/.metadata`` and its lock file; ``InvalidArgumentError`` naming
    the path when the storage root cannot be written."""
    directory = metadata_dir(storage_root)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / LOCK_FILE, "a"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise InvalidArgumentError(
            f"the storage root {storage_root} is not writable ({reason} at {directory}); "
            "set RAYTOPICS_STORAGE_ROOT to a directory this user can write"
        ) from None
    return directory


@contextlib.contextmanager
def locked(directory: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of ``directory``'s embedded Ray; waiting longer than
    ``timeout_s`` for it is an ``UnavailableError`` naming the holder."""
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise UnavailableError(
                        f"waited {timeout_s:g} s for {path}, held by pid {holder} "
                        "(a program starting or stopping the embedded Ray)"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


# --- joining, starting, leaving ---------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """What ``join_or_start`` did, for the caller's one-line report."""

    started: bool
    head: HeadRecord
    storage_root: Path


@dataclass
class _Membership:
    storage_root: Path
    head_id: str
    me: ProcessId


_membership: _Membership | None = None
_atexit_registered = False


def join_or_start(
    storage_root: Path,
    head_args: dict[str, Any],
    init: Callable[[str], None],
) -> Joined:
    """Join the embedded Ray of ``storage_root`` (starting it with ``head_args`` when none
    runs) by calling ``init(gcs_address)``, and record this process as its user."""
    global _membership
    storage_root = storage_root.expanduser().resolve()
    directory = prepare(storage_root)
    me = ProcessId.of(os.getpid())
    assert me is not None
    with locked(directory):
        state = State.read(directory / STATE_FILE)
        state.users = [u for u in state.users if u.alive() and not u.same_process(me)]
        head, started = state.head, False
        replaced = head is not None and (why := head.why_unusable()) is not None
        if replaced:
            print(f"raytopics: the embedded Ray of {storage_root} cannot serve ({why}); "
                  "stopping what is left of it and starting another", file=sys.stderr)  # fmt: skip
            stop_processes(head.processes)
            head, state.users = None, []
        if head is None:
            # a GCS just stopped releases its RocksDB lock only once it has exited
            head = _start_head(directory, head_args, STOP_WAIT_S if replaced else 0.0)
            started = True
            try:
                init(head.gcs_address)
            except BaseException:
                stop_processes(head.processes)
                State().write(directory / STATE_FILE)
                raise
        else:
            _adopt_auth_mode(head.auth_mode)
            init(head.gcs_address)
        state.head = head
        state.users.append(me)
        state.write(directory / STATE_FILE)
    _membership = _Membership(storage_root, head.head_id, me)
    _register_atexit()
    return Joined(started, head, storage_root)


def leave() -> None:
    """Stop being a user of the embedded Ray this process joined (if any); the last
    user stops it. The driver must be disconnected (``ray.shutdown()``) first."""
    global _membership
    membership, _membership = _membership, None
    if membership is None or membership.me.pid != os.getpid():
        return  # never joined, already left, or a forked child of the process that did
    directory = metadata_dir(membership.storage_root)
    try:
        with locked(directory):
            state = State.read(directory / STATE_FILE)
            if state.head is None or state.head.head_id != membership.head_id:
                return  # the head we joined is gone; a newer one is none of ours
            state.users = [
                u for u in state.users if u.alive() and not u.same_process(membership.me)
            ]
            if not state.users:
                stop_processes(state.head.processes)
                state.head = None
            state.write(directory / STATE_FILE)
    except (OSError, UnavailableError) as err:
        print(f"raytopics: could not leave the embedded Ray of {membership.storage_root}: "
              f"{err}", file=sys.stderr)  # fmt: skip


def _at_exit() -> None:
    if _membership is None:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    leave()


def _register_atexit() -> None:
    """Leave at exit, before Ray's own exit hook (registered when ``ray`` was imported,
    and atexit runs the last registered first) tears the driver down."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def _adopt_auth_mode(head_mode: str) -> None:
    """A driver given an explicit address never turns token authentication on by
    itself; one joining a head that uses it must, as Ray's own local discovery does."""
    if head_mode == "token" and "RAY_AUTH_MODE" not in os.environ:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _start_head(directory: Path, head_args: dict[str, Any], lock_wait_s: float = 0.0) -> HeadRecord:
    """Start a head that outlives this process (no reaper, no exit hook, no parent-death
    signal), as ``ray start --head`` does, with its GCS tables in RocksDB under
    ``directory/gcs``, or in Redis when ``RAY_REDIS_ADDRESS`` says so."""
    import ray
    from ray._common.usage import usage_lib
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    from ray._private.resource_isolation_config import ResourceIsolationConfig

    system_config = dict(head_args.get("_system_config") or {})
    redis = os.environ.get(REDIS_ADDRESS_ENV)
    if redis:
        check_redis(redis)
        metadata = f"redis://{redis}"
    else:
        gcs_dir = directory / GCS_DIR
        _check_rocksdb_free(gcs_dir, lock_wait_s)
        system_config |= {"gcs_storage": "rocksdb", "gcs_storage_path": str(gcs_dir)}
        metadata = str(gcs_dir)

    # What ray.init() does before it starts a local head.
    enable_token_auth_by_default()
    ensure_token_if_auth_enabled(system_config, create_token_if_missing=True)
    if not usage_lib.is_nightly_wheel():
        usage_lib.set_usage_stats_enabled_via_env_var(False)
    params: dict[str, Any] = {
        "redirect_output": None,
        "num_redis_shards": None,
        "redis_max_clients": None,
        "huge_pages": None,
        "plasma_store_socket_name": None,
        "dashboard_port": None,
        "temp_dir": head_args.get("_temp_dir"),
        "resource_isolation_config": ResourceIsolationConfig(
            **{k: head_args[k] for k in _ISOLATION_ARGS if head_args.get(k) is not None}
        ),
    }
    for arg, field_name in _HEAD_PARAMS.items():
        if head_args.get(arg) is not None:
            params[field_name] = head_args[arg]
    params["_system_config"] = system_config

    before = {p.pid for p in psutil.Process().children()}
    try:
        with (
            _environment_without(_PRIVATE_ENV_PREFIX, keep=NODE_ENV),
            _environment_defaults(QUIET_RAY_ENV),
            _terminal_signals_blocked(),
        ):
            node = Node(RayParams(**params), head=True, shutdown_at_exit=False, spawn_reaper=False)
    except BaseException:
        # Node() gives no handle when it fails half way: stop what it had started.
        started = [ProcessId.of(p.pid) for p in psutil.Process().children()]
        stop_processes([p for p in started if p is not None and p.pid not in before])
        raise
    order = ["raylet", *sorted(set(node.all_processes) - {"raylet", "gcs_server"}), "gcs_server"]
    processes = [
        pid
        for kind in order
        for info in node.all_processes.get(kind, [])
        if (pid := ProcessId.of(info.process.pid, kind)) is not None
    ]
    starter = ProcessId.of(os.getpid())
    assert starter is not None
    return HeadRecord(
        head_id=uuid.uuid4().hex,
        gcs_address=node.gcs_address,
        metadata=metadata,
        started_by=starter,
        started_at=time.time(),
        auth_mode=os.environ.get("RAY_AUTH_MODE", ""),
        ray_version=ray.__version__,
        session_dir=node.get_session_dir_path(),
        processes=processes,
    )


@contextlib.contextmanager
def _environment_defaults(defaults: dict[str, str]) -> Iterator[None]:
    """``defaults`` in the environment of the processes started meanwhile, where this
    process sets none of them itself; this process's environment is as before after."""
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def _environment_without(prefix: str, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """Hide this process's ``prefix*`` variables but ``keep`` from the processes started
    meanwhile (Ray copies ``os.environ`` into each); they are back once the head runs."""
    hidden = {
        k: os.environ.pop(k) for k in list(os.environ) if k.startswith(prefix) and k not in keep
    }
    try:
        yield
    finally:
        os.environ.update(hidden)


@contextlib.contextmanager
def _terminal_signals_blocked() -> Iterator[None]:
    """Start the head deaf to its starter's terminal: the processes share the starter's
    process group (Ray gives no way to start them in a session of their own), so a
    hangup, Ctrl-Z or Ctrl-\\ there would stop or kill a head other programs use. A
    blocked signal mask is inherited across fork and exec (Ray blocks SIGINT so)."""
    terminal = {signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, terminal)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _check_rocksdb_free(gcs_dir: Path, wait_s: float = 0.0) -> None:
    """``ConflictError`` naming the file when a process holds a RocksDB lock of
    ``gcs_dir`` (still, after ``wait_s``): a GCS started on it would crash, and its
    program wait forever."""
    deadline = time.monotonic() + wait_s
    while (held := _rocksdb_lock_held(gcs_dir)) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if held is None:
        return
    lock, holder = held
    who = f"pid {holder}" if holder > 0 else "another process"
    with contextlib.suppress(psutil.Error, ValueError):
        who += f" ({' '.join(psutil.Process(holder).cmdline())[:120]})"
    raise ConflictError(
        f"{lock} is locked by {who}, which is not the embedded Ray recorded in "
        f"{gcs_dir.parent / STATE_FILE}: another Ray keeps its GCS tables there. "
        "Stop it, or point RAYTOPICS_STORAGE_ROOT elsewhere"
    )


def _rocksdb_lock_held(gcs_dir: Path) -> tuple[Path, int] | None:
    """The first RocksDB ``LOCK`` file of ``gcs_dir`` that a process holds, and its pid."""
    for lock in sorted(gcs_dir.glob("*/LOCK")):
        holder = lock_holder(lock)
        if holder is not None:
            return lock, holder
    return None
