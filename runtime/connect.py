"""Join an existing Ray cluster or start an embedded local one, in our namespace."""

from __future__ import annotations

import os
from typing import Any

import ray

from runtime.config import ray_namespace

# Variables that actors started from this driver must see too.
_FORWARDED_ENV = ("RAYTOPICS_NAMESPACE", "RAYTOPICS_STORAGE_ROOT", "RAYTOPICS_DURABILITY")


def connect(
    address: str | None = None, *, namespace: str | None = None, **ray_init_kwargs: Any
) -> str:
    """Make this process a Ray driver in the project's namespace and return the namespace.

    ``address=None`` uses ``RAY_ADDRESS`` when set (as under ``ray job submit``)
    and otherwise starts an embedded local Ray; ``"auto"`` or ``host:port``
    joins a running cluster. Calling it again in a connected process is a no-op
    as long as the namespace agrees.
    """
    namespace = namespace or ray_namespace()
    if ray.is_initialized():
        current = ray.get_runtime_context().namespace
        if current != namespace:
            raise RuntimeError(
                f"Ray is already initialized in namespace {current!r}, not {namespace!r}; "
                "call ray.shutdown() first or pass namespace=" + repr(current)
            )
        return namespace
    os.environ["RAYTOPICS_NAMESPACE"] = namespace
    env_vars = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    runtime_env = dict(ray_init_kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**env_vars, **runtime_env.get("env_vars", {})}
    ray.init(address=address, namespace=namespace, runtime_env=runtime_env, **ray_init_kwargs)
    return namespace
