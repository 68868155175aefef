"""``clients.connect``: ``runtime.connect.connect`` plus, with ``http_port``, the REST
gateway and its web console on this node. ``runtime`` sits below every actor and
cannot start one; an application's one call to be connected and browsable is here."""

from __future__ import annotations

from typing import Any

from runtime.connect import connect as connect_ray


def connect(
    address: str | None = None,
    *,
    namespace: str | None = None,
    http_port: int | None = None,
    http_host: str = "127.0.0.1",
    **ray_init_kwargs: Any,
) -> str:
    """Join (or start) Ray as ``runtime.connect.connect`` does and return the namespace;
    with ``http_port``, also serve the REST admin API and the web console there (an
    existing gateway on that port is reused) and say where."""
    joined = connect_ray(address, namespace=namespace, **ray_init_kwargs)
    if http_port is not None:
        from actors.gateway.server import start_gateway

        url = start_gateway(http_port, http_host)
        print(f"raytopics: the web console is at {url}/ (REST: {url}/openapi.json)", flush=True)
    return joined
