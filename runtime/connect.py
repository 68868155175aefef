"""Join a Ray cluster or the embedded local one, in our namespace, and say which.

Which Ray a program lands on decides whether its topics outlive it, so
``connect()`` chooses in a fixed order and prints the choice on one line:
an explicit address, else ``RAY_ADDRESS`` (as under ``ray job submit``), else a
cluster started on this machine with ``ray start`` (Ray's own habit), else the
embedded Ray of the storage root (``runtime.embedded``), whose metadata is kept
on disk next to the segment logs. A cluster whose GCS keeps metadata only in
memory is legal but loses every topic when its head restarts, so joining one
raises a ``MetadataNotDurableWarning`` once per process.

Ray is imported by the functions that use it, not by this module: ``runtime`` (whose
package imports this module) is imported by the REST client too, which needs no Ray.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime import embedded
from runtime.config import ray_namespace
from runtime.errors import RayUnreachableError
from runtime.placement import placement_from_env
from runtime.processes import host_port, tcp_answers

# Settings for the embedded Ray; clusters started with `ray start` take the same
# ones via --system-config (or RAY_<name> variables on every node).
LOCAL_SYSTEM_CONFIG = {
    # Ray passes call arguments up to this size inline instead of through the object
    # store. A 1,000-message batch is ~130 KB, just over Ray's 100 KiB default, and
    # inlining it doubles append throughput (bench/segment_append.py).
    "max_direct_call_object_size": 1 << 20,
    # After a call to a dead actor fails, Ray waits this long for the cause of death
    # before failing (or, for a restarting actor, resending) the call: 1 s by default,
    # which every caller pays on each controller or segment restart. Our clients
    # retry such calls anyway, so a nicer error message is not worth a second.
    "timeout_ms_task_wait_for_death_info": 100,
    # A backlog age grows with the clock, so a scrape is only as fresh as Ray's last
    # export of it; Ray's default of 10 s would leave it that far behind. What exporting
    # every second costs is measured by bench/metrics_export.py.
    "metrics_report_interval_ms": 1000,
}


def local_system_config() -> dict[str, Any]:
    """``LOCAL_SYSTEM_CONFIG`` without the settings this process's environment gives as
    Ray's own ``RAY_<name>`` variables: a system config overrides Ray's environment, so
    an operator's ``RAY_metrics_report_interval_ms=10000`` (an idle deployment then
    exports a tenth as often, its backlog ages up to 10 s old) would be lost otherwise.
    Ray's processes, which inherit the environment, read those variables themselves."""
    return {k: v for k, v in LOCAL_SYSTEM_CONFIG.items() if f"RAY_{k}" not in os.environ}


# The address that means "the embedded Ray of the storage root", skipping the
# search for a `ray start` cluster (Ray's "local" likewise never joins one).
EMBEDDED_ADDRESS = "local"

_lock = threading.RLock()
_warned_not_durable = False
_checked: set[str] = set()  # GCS addresses whose metadata backend was looked at


# How long a cluster's address may take to accept a connection before it counts as down.
REACH_TIMEOUT_S = 3.0


class MetadataNotDurableWarning(UserWarning):
    """The cluster's GCS keeps metadata only in memory: topics, subscriptions and
    cursors vanish when its head restarts."""


def connect(
    address: str | None = None,
    *,
    namespace: str | None = None,
    **ray_init_kwargs: Any,
) -> str:
    """Make this process a Ray driver in the project's namespace and return the namespace.

    ``address=None`` joins ``RAY_ADDRESS`` when set, else a cluster started on this
    machine with ``ray start``, else the embedded Ray of the storage root (started
    if none runs; ``"local"`` goes straight there). ``"auto"`` or ``host:port``
    joins a running cluster. A line on stderr says which Ray was chosen (shown at
    ``logging_level`` INFO, Ray's default, like Ray's own connection messages).
    Arguments that configure a head (``num_cpus``, ``_system_config``, ...) apply
    only when the embedded Ray is started here; joining a running Ray ignores them
    and says so. In a process that is a Ray driver already (``ray.init`` called
    first), it joins nothing and only settles the namespace the system is used in:
    ``namespace``, else ``runtime.config.ray_namespace``. The REST admin gateway is
    started apart, once connected (``raytopics serve``, or ``start_gateway(port)`` of
    the actors package): this module sits below every actor and must not reach up to
    one.
    """
    with _lock:
        namespace = _join(address, namespace, ray_init_kwargs)
        _warn_if_not_durable()
    return namespace


_before_disconnect: list[Callable[[], None]] = []


def before_disconnect(hook: Callable[[], None], *, first: bool = False) -> None:
    """Run ``hook`` first in every ``disconnect``, while Ray still runs (with ``first``,
    before the hooks without). Open producers are flushed and closed there, then the
    clients' event loop ends its calls to actors (``clients._loop``): a call still
    awaited when Ray's core worker shuts down makes that worker exit the whole process."""
    if hook in _before_disconnect:
        return
    _before_disconnect.insert(0 if first else len(_before_disconnect), hook)


def disconnect() -> None:
    """Stop being a Ray driver; the last program using the embedded Ray stops it.

    Also done at process exit. ``ray.shutdown()`` alone leaves this process counted
    as a user of the embedded Ray until it exits. Clients still open stop working:
    their calls raise ``ClientClosedError``."""
    import ray

    with _lock:
        for hook in list(_before_disconnect):
            hook()
        if ray.is_initialized():
            ray.shutdown()
        embedded.leave()


def metadata_durability() -> dict[str, Any]:
    """Where the connected cluster keeps its metadata and whether that outlives its
    head (``storage.metadata.metadata_durability``)."""
    from storage.metadata import metadata_durability as durability

    return durability()


def _join(address: str | None, namespace: str | None, ray_init_kwargs: dict[str, Any]) -> str:
    """ray.init in ``namespace``; in a process that is a Ray driver already (a program
    that called ``ray.init`` itself), use ``namespace`` for the system from now on.
    Every actor and metadata key is addressed with its namespace, so a driver whose
    own job namespace differs works with the system's all the same."""
    import ray

    if ray.is_initialized():
        if namespace is None:
            return ray_namespace()
        configured = os.environ.get("RAYTOPICS_NAMESPACE")
        if configured and configured != namespace:
            raise RuntimeError(
                f"this process already uses the Ray namespace {configured!r} "
                f"(RAYTOPICS_NAMESPACE), not {namespace!r}"
            )
        os.environ["RAYTOPICS_NAMESPACE"] = namespace
        return namespace
    namespace = namespace or ray_namespace()
    placement_from_env()  # a bad placement fails here, not in some actor start later
    os.environ["RAYTOPICS_NAMESPACE"] = namespace
    init_kwargs = {**ray_init_kwargs, "namespace": namespace}
    head_args = {k: init_kwargs.pop(k) for k in embedded.HEAD_ONLY_ARGS if k in init_kwargs}
    line, started_head = _init(address, head_args, init_kwargs)
    level = _level(init_kwargs.get("logging_level", logging.INFO))
    if level <= logging.INFO:
        _say(line)
    ignored = sorted(k for k, v in head_args.items() if v is not None)
    if ignored and not started_head and level <= logging.WARNING:
        _say(f"ignored {', '.join(ignored)}: they configure a Ray head, and this Ray was "
             "already running")  # fmt: skip
    return namespace


def _init(
    address: str | None, head_args: dict[str, Any], init_kwargs: dict[str, Any]
) -> tuple[str, bool]:
    """Choose a Ray and ray.init as its driver; say which, and whether a head was
    started here."""
    import ray

    env_address = os.environ.get("RAY_ADDRESS") or None
    found = None if address or env_address else _ray_start_cluster()
    if (address or env_address or found or EMBEDDED_ADDRESS) == EMBEDDED_ADDRESS:
        joined = _join_embedded(head_args, init_kwargs)
        head = joined.head
        if joined.started:
            said = f"started the embedded Ray (GCS {head.gcs_address}) with metadata kept in "
            return f"{said}{head.metadata}; {_ray_auth(head.auth_mode)}", True
        said = f"joined the embedded Ray of {joined.storage_root} (GCS {head.gcs_address}) "
        return said + f"started by pid {head.started_by.pid}", False
    if address:
        _check_answers(address, "the address= argument")
        ray.init(address=address, **init_kwargs)
        return f"joined the Ray cluster at {_gcs_address() or address} (address {address})", False
    if env_address:
        _check_answers(env_address, "RAY_ADDRESS")
        ray.init(address=None, **init_kwargs)  # Ray reads RAY_ADDRESS itself (ray://, auto)
        return f"joined the Ray cluster at {_gcs_address() or env_address} (RAY_ADDRESS)", False
    _adopt_local_auth()
    ray.init(address=found, **init_kwargs)
    return (
        f"joined the Ray cluster at {found}, started on this machine with `ray start` "
        "(Ray's ray_current_cluster file)"
    ), False


def _join_embedded(head_args: dict[str, Any], init_kwargs: dict[str, Any]) -> embedded.Joined:
    """Join or start the embedded Ray of the storage root as this driver."""
    import ray

    head_args = dict(head_args)
    head_args["_system_config"] = {
        **local_system_config(),
        **(head_args.get("_system_config") or {}),
    }
    if init_kwargs.get("_temp_dir") is not None:
        head_args["_temp_dir"] = init_kwargs["_temp_dir"]
    return embedded.join_or_start(
        _storage_root(), head_args, lambda gcs: ray.init(address=gcs, **init_kwargs)
    )


def _level(value: int | str) -> int:
    """A logging level given as Ray takes it: a number or a name such as ``"info"``."""
    if isinstance(value, str):
        named = logging.getLevelName(value.upper())
        return named if isinstance(named, int) else logging.INFO
    return value


def _storage_root() -> Path:
    from storage.durability import default_storage_root

    return default_storage_root()


def _ray_start_cluster() -> str | None:
    """The GCS address of a cluster started on this machine with ``ray start`` (or
    ``ray.cluster_utils.Cluster``), from Ray's ``ray_current_cluster`` file, if that
    cluster still runs: the file outlives a cluster that was killed, and its port may
    be reused, so a local raylet must point at that GCS and the GCS must answer."""
    from ray._private import services
    from ray._private.utils import read_ray_address

    try:
        found = read_ray_address()
    except OSError:
        return None
    if not found or not tcp_answers(found, timeout_s=0.5):
        return None
    services.find_gcs_addresses.cache_clear()
    return found if found in services.find_gcs_addresses() else None


def _check_answers(address: str, source: str) -> None:
    """Fail at once, saying where it looked, when nothing listens at a ``host:port``
    address: ``ray.init`` would retry for minutes before it says so. ``auto`` is
    Ray's own search and is left to it."""
    if address == "auto" or ":" not in address:
        return
    try:
        host_port(address)
    except ValueError:
        raise RayUnreachableError(
            f"{source} is {address!r}, which is not host:port (or ray://host:port, or auto)"
        ) from None
    if not tcp_answers(address, timeout_s=REACH_TIMEOUT_S):
        raise RayUnreachableError(
            f"no Ray cluster answers at {address} (from {source}): start one there with "
            "`ray start --head`, point it at a running cluster, or leave address and "
            "RAY_ADDRESS unset to use the embedded Ray of this machine"
        )


def _ray_auth(mode: str) -> str:
    """What the line saying a head was started tells of Ray's own authentication
    (docs/security.md, "Ray's own authentication")."""
    if mode == "token":
        return "Ray's token authentication on (a driver needs the token, ~/.ray/auth_token)"
    return (
        "Ray's token authentication off (RAY_AUTH_MODE=disabled): any process of this "
        "machine that reaches its ports can join it"
    )


def _adopt_local_auth() -> None:
    """What ray.init() does when it finds a local cluster itself: use the local token
    if there is one and ``RAY_AUTH_MODE`` says nothing."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _gcs_address() -> str | None:
    import ray

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - Ray client mode has no GCS address to show
        return None


def _say(line: str) -> None:
    print(f"raytopics: {line}", file=sys.stderr, flush=True)


def _warn_if_not_durable() -> None:
    """Warn once per process when this driver's cluster keeps metadata only in memory
    (drivers only: a task's worker would repeat what its driver already said)."""
    import ray

    global _warned_not_durable
    if _warned_not_durable or ray._private.worker.global_worker.mode != ray.SCRIPT_MODE:
        return
    gcs = _gcs_address() or ""
    if gcs in _checked:
        return
    _checked.add(gcs)
    if metadata_durability()["backend"] != "memory":
        return
    _warned_not_durable = True
    warnings.warn(
        MetadataNotDurableWarning(
            f"the Ray cluster at {gcs or 'this address'} keeps its metadata (GCS) only in "
            "memory: every topic, subscription, cursor, policy and limit vanishes when "
            "its head restarts, though segment data stays on disk. Make it durable with "
            "Ray's GCS fault tolerance (start the head with RAY_REDIS_ADDRESS=host:port "
            'of a persistent Redis), see docs/operations.md "Durability of metadata"; or use the '
            "embedded Ray (no address), which keeps metadata under the storage root."
        ),
        stacklevel=3,
    )
