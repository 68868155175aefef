"""Spark Structured Streaming on topics: ``spark.readStream.format("raytopics")`` and
``df.writeStream.format("raytopics")``.

The source and sink are a JVM DataSource V2 (``java/``, put on the classpath by
``clients.spark_session.spark_session``): Spark tasks read segments' data planes and
never go through a Python worker. What they cannot decide alone, the cluster
decides for them through the REST gateway: where a micro-batch ends so that no
segment is read before its parents (``runtime.stream_plan``), and how a replayed
micro-batch is stored only once (``actors.admin.stream_writes``). This module points a
Spark session at a gateway (``spark.raytopics.url``), starting one for it when none is
given: ``spark_session`` does so for every session it makes.
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

import ray

from actors.gateway.server import running_gateways, start_gateway
from runtime.config import env_float
from runtime.errors import UnavailableError

GATEWAY_PORT_ENV = "RAYTOPICS_SPARK_GATEWAY_PORT"
DEFAULT_GATEWAY_PORT = 18080
URL_CONF = "spark.raytopics.url"


def enable_streaming(spark: Any, url: str | None = None) -> str:
    """Make ``spark``'s raytopics source and sink plan through ``url``, else through the
    gateway this node runs for Spark (port ``RAYTOPICS_SPARK_GATEWAY_PORT``, 18080),
    started if none runs. Returns the URL. The token the source and sink present is
    the ``token`` option, else ``spark.raytopics.token``, else ``RAYTOPICS_TOKEN``."""
    if url is None:
        url = _spark_gateway(ray.util.get_node_ip_address())
    spark.conf.set(URL_CONF, url)
    return url


def _spark_gateway(host: str) -> str:
    """The gateway on the configured port; on the default one, taken by another program,
    a gateway this cluster already runs on ``host``, else one on a free port (a
    configured port that is taken is an error). Each session asking does not start one
    more."""
    configured = GATEWAY_PORT_ENV in os.environ
    port = int(env_float(GATEWAY_PORT_ENV, DEFAULT_GATEWAY_PORT))
    try:
        return start_gateway(port, host=host)
    except UnavailableError:
        if configured:
            raise
    for url in running_gateways().values():  # one started here before, on another port
        if urlsplit(url).hostname == host:
            return url
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    return start_gateway(port, host=host)
