"""Join an existing Ray cluster or start an embedded local one, in our namespace."""

from __future__ import annotations

import os
from typing import Any

import ray

from runtime.config import GC_FREEZE_ENV, ray_namespace
from runtime.limits import LIMIT_ENV_VARS
from runtime.placement import PLACEMENT_ENV, placement_from_env

# Variables that actors started from this driver must see too.
_FORWARDED_ENV = (
    "RAYTOPICS_NAMESPACE",
    "RAYTOPICS_STORAGE_ROOT",
    "RAYTOPICS_DURABILITY",
    "RAYTOPICS_ACK_TIMEOUT_S",
    PLACEMENT_ENV,
    GC_FREEZE_ENV,
    *LIMIT_ENV_VARS,
)

# Settings for an embedded local Ray; clusters started with `ray start` take the
# same ones via --system-config (or RAY_<name> variables on every node).
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
}


def connect(
    address: str | None = None,
    *,
    namespace: str | None = None,
    http_port: int | None = None,
    **ray_init_kwargs: Any,
) -> str:
    """Make this process a Ray driver in the project's namespace and return the namespace.

    ``address=None`` uses ``RAY_ADDRESS`` when set (as under ``ray job submit``)
    and otherwise starts an embedded local Ray; ``"auto"`` or ``host:port``
    joins a running cluster. Calling it again in a connected process is a no-op
    as long as the namespace agrees. With ``http_port`` the REST admin gateway
    is started (or found) on that port of this node, bound to 127.0.0.1.
    """
    namespace = _join(address, namespace, ray_init_kwargs)
    if http_port is not None:
        # connect() is the wiring point of the whole system, so it may reach up
        # into actors/; imported lazily to keep runtime/ importable on its own.
        from actors.gateway import start_gateway

        start_gateway(http_port)
    return namespace


def _join(address: str | None, namespace: str | None, ray_init_kwargs: dict[str, Any]) -> str:
    """ray.init in ``namespace``, or check an existing connection is in it."""
    namespace = namespace or ray_namespace()
    if ray.is_initialized():
        current = ray.get_runtime_context().namespace
        if current != namespace:
            raise RuntimeError(
                f"Ray is already initialized in namespace {current!r}, not {namespace!r}; "
                "call ray.shutdown() first or pass namespace=" + repr(current)
            )
        return namespace
    placement_from_env()  # a bad placement fails here, not in some actor start later
    os.environ["RAYTOPICS_NAMESPACE"] = namespace
    env_vars = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    runtime_env = dict(ray_init_kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**env_vars, **runtime_env.get("env_vars", {})}
    if address is None and "RAY_ADDRESS" not in os.environ:  # an embedded local Ray
        # "local", or ray.init would join whichever Ray another program on this
        # machine happened to start last.
        address = "local"
        ray_init_kwargs["_system_config"] = {
            **LOCAL_SYSTEM_CONFIG,
            **ray_init_kwargs.get("_system_config", {}),
        }
    ray.init(address=address, namespace=namespace, runtime_env=runtime_env, **ray_init_kwargs)
    return namespace
