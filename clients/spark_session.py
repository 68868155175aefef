"""Spark on Ray: one RayDP session per process, set up for this project and for Java 17,
its ``raytopics`` streaming source and sink ready to use.

RayDP runs the Spark executors as Ray actors, so a Spark job shares the
cluster (and the segment actors) with everything else. Three things must be
right for that to work here, and this module is where they are decided once:

- Java 17 closes the JDK internals that Spark, Arrow and Netty reach into;
  the driver, the executors and RayDP's app master all need the same
  ``--add-opens`` list or the first Arrow or shuffle operation fails.
- Spark's Python workers are started by the executors, not by Ray: they need
  ``PYSPARK_PYTHON`` (this venv's interpreter), the project on ``PYTHONPATH``
  and the ``RAY_*``/``RAYTOPICS_*`` variables that let them join the cluster.
- RayDP's Java agent in the Spark driver must be told this node's Ray log
  directory; its default, ``/tmp/ray/session_latest/logs``, may not exist.
- Executors hold CPUs for their whole life, so by default they take only
  half of the cluster and leave the rest to Ray Data read tasks and producers.
- ``spark.readStream.format("raytopics")`` plans through a REST gateway: the
  session is pointed at one (``spark.raytopics.url``, ``clients.spark_streaming``)
  unless its configs name one already.
- RayDP names its masters alike in every session; each session's go to a Ray
  namespace of its own (``clients.spark_masters``), so any number of Spark programs
  run at once on one deployment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ray

from clients.spark_streaming import URL_CONF, enable_streaming
from runtime.config import ray_namespace
from runtime.connect import connect

# What Spark's own launcher adds on Java 17 (JavaModuleOptions), plus Arrow's
# and Netty's needs; harmless on Java 11 thanks to IgnoreUnrecognizedVMOptions.
_OPENED_PACKAGES = (
    "java.lang",
    "java.lang.invoke",
    "java.lang.reflect",
    "java.io",
    "java.net",
    "java.nio",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "sun.nio.ch",
    "sun.nio.cs",
    "sun.security.action",
    "sun.util.calendar",
)
JAVA17_OPTIONS = " ".join(
    [
        "-XX:+IgnoreUnrecognizedVMOptions",
        *(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in _OPENED_PACKAGES),
        "-Djdk.reflect.useDirectMethodHandle=false",
        "-Dio.netty.tryReflectionSetAccessible=true",
    ]
)

# The streaming source and sink (``spark.readStream.format("raytopics")``): a JVM
# DataSource V2 built from java/ by the setup (or on first use) against pyspark's jars.
CONNECTOR_JAR = Path(__file__).resolve().parent.parent / "build" / "raytopics-spark.jar"
_CONNECTOR_BUILD = Path(__file__).resolve().parent.parent / "java" / "build.sh"

# Environment that Spark's Python workers need to join Ray and find this project.
_WORKER_ENV = ("RAY_AUTH_MODE", "RAYTOPICS_NAMESPACE", "RAYTOPICS_STORAGE_ROOT")
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def spark_session(
    app_name: str = "raytopics",
    *,
    num_executors: int | None = None,
    executor_cores: int = 1,
    executor_memory: str | int = "1g",
    configs: dict[str, str] | None = None,
) -> Any:
    """The process's Spark session on Ray, started on first call (joins Ray via ``connect()``).

    ``num_executors=None`` sizes Spark to half of the cluster's CPUs (at least
    one executor): one executor on a 2-core machine, and room left on a large
    cluster for Ray Data tasks and producers. ``configs`` override any default.
    Calling it again returns the running session; ``stop_spark()`` ends it. Its
    ``raytopics`` source and sink work at once: they plan through the gateway that
    ``spark.raytopics.url`` in ``configs`` names, else through this node's gateway for
    Spark (``clients.spark_streaming.enable_streaming``, started if none runs).
    """
    import raydp
    from pyspark.sql import SparkSession

    from clients import spark_masters  # imports RayDP: only where a session starts

    connect()
    active = SparkSession.getActiveSession()
    if active is not None and _raydp_running():
        return _streaming(active)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    executors = num_executors or default_num_executors(executor_cores)
    spark_masters.install()
    session = raydp.init_spark(
        app_name,
        executors,
        executor_cores,
        executor_memory,
        fault_tolerant_mode=False,  # only ray.data.from_spark needs it; we never use it
        configs={**default_configs(executors * executor_cores), **(configs or {})},
    )
    return _streaming(session)


def _streaming(session: Any) -> Any:
    """``session``, its streaming source and sink pointed at a gateway unless they are."""
    if not session.conf.get(URL_CONF, None):
        enable_streaming(session)
    return session


def stop_spark() -> None:
    """Stop the Spark session and its executor actors (no-op when none is running)."""
    import raydp

    raydp.stop_spark()


def default_num_executors(executor_cores: int = 1) -> int:
    """Half of the cluster's CPUs in executors, never fewer than one."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, (cpus // 2) // max(1, executor_cores))


def default_configs(total_cores: int = 1) -> dict[str, str]:
    """Spark settings every session of this project needs (see the module docstring).

    Shuffles get two partitions per executor core instead of Spark's fixed 200,
    which on a small cluster spend more time scheduling than computing.
    """
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    configs = {
        "spark.driver.extraJavaOptions": f"{JAVA17_OPTIONS} -Dray.logging.dir={_ray_logs_dir()}",
        "spark.executor.extraJavaOptions": JAVA17_OPTIONS,
        "spark.ray.raydp_app_master.extraJavaOptions": JAVA17_OPTIONS,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.executorEnv.PYTHONPATH": _python_path(),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(max(2, 2 * total_cores)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        "spark.jars": connector_jar(),
    }
    for name in _WORKER_ENV:
        if name in os.environ:
            configs[f"spark.executorEnv.{name}"] = os.environ[name]
    # The system's namespace, which a driver that joined Ray in a namespace of its own
    # does not share: the executors' tasks address the system's actors in it
    configs["spark.executorEnv.RAYTOPICS_NAMESPACE"] = ray_namespace()
    from clients import spark_masters

    configs[spark_masters.NAMESPACE_CONF] = spark_masters.session_namespace(ray_namespace())
    return configs


def connector_jar() -> str:
    """The streaming connector's jar, built first when missing or older than its sources
    (``java/build.sh``: javac against pyspark's own jars, nothing downloaded)."""
    result = subprocess.run(
        ["bash", str(_CONNECTOR_BUILD), str(CONNECTOR_JAR)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"building the raytopics Spark connector failed ({_CONNECTOR_BUILD}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return str(CONNECTOR_JAR)


def _ray_logs_dir() -> str:
    """This node's Ray log directory, for the Spark driver's RayDP agent. Told nothing,
    the agent logs to ``/tmp/ray/session_latest/logs`` and kills the driver JVM when it
    cannot create that: when the link is stale because the cluster runs with another
    ``--temp-dir``, or ``/tmp/ray`` was cleaned. RayDP reads the same private call."""
    return ray._private.worker._global_node.get_logs_dir_path()


def _python_path() -> str:
    """The project root first, so executors import the same code as this driver
    (under ``ray job submit`` that is the uploaded working directory)."""
    parts = [_PROJECT_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(parts))


def _raydp_running() -> bool:
    from raydp import context

    return context._global_spark_context is not None
