"""Spark Structured Streaming on topics: ``spark.readStream.format("raytopics")`` and
``df.writeStream.format("raytopics")``.

The source and sink are a JVM DataSource V2 (``java/``, put on the classpath by
``runtime.spark.spark_session``): Spark tasks read segments' data planes and
never go through a Python worker. What they cannot decide alone, the cluster
decides for them through the REST gateway: where a micro-batch ends so that no
segment is read before its parents (``runtime.stream_plan``), and how a replayed
micro-batch is stored only once (``actors.stream_writes``). This module points a
Spark session at a gateway, starting one for it when none is given.
"""

from __future__ import annotations

from typing import Any

import ray

from actors.gateway import start_gateway
from runtime.config import env_float

GATEWAY_PORT_ENV = "RAYTOPICS_SPARK_GATEWAY_PORT"
DEFAULT_GATEWAY_PORT = 18080
URL_CONF = "spark.raytopics.url"


def enable_streaming(spark: Any, url: str | None = None) -> str:
    """Make ``spark``'s raytopics source and sink plan through ``url``, else through the
    gateway this node runs for Spark (port ``RAYTOPICS_SPARK_GATEWAY_PORT``, 18080),
    started if none runs. Returns the URL. The token the source and sink present is
    the ``token`` option, else ``spark.raytopics.token``, else ``RAYTOPICS_TOKEN``."""
    if url is None:
        port = int(env_float(GATEWAY_PORT_ENV, DEFAULT_GATEWAY_PORT))
        url = start_gateway(port, host=ray.util.get_node_ip_address())
    spark.conf.set(URL_CONF, url)
    return url
