"""Each Spark program's RayDP masters in a Ray namespace of their own.

RayDP starts two named actors per Spark session: a Python master called
``<appName>_SPARK_MASTER`` and, from the JVM inside it, the Java app master called
``RAY_APP_MASTER``. Both go to the namespace of the Ray job that started Spark, and a
program of this project runs in the project's namespace (``RAYTOPICS_NAMESPACE``), so a
second Spark program on the same deployment failed at start ("Actor of name
RAY_APP_MASTER exists") until the first stopped. A team runs an ingest query, a
compaction job and a notebook side by side.

So ``spark_session()`` names a namespace per session (``NAMESPACE_CONF`` in the
session's configs) and installs ``SessionSparkMaster`` in RayDP's place: the Python
master is started in that namespace, and the JVM it launches joins Ray with it as its
job namespace, so the Java app master and the executors it starts live there too. The
project's own actors are unaffected: every lookup and start names the project's
namespace explicitly (``actors.registry``), and the executors' Python workers get it
from ``spark.executorEnv.RAYTOPICS_NAMESPACE``.

What this gives up: RayDP's ``ray.data.from_spark`` in fault-tolerant mode looks the
Python master up in the driver's own namespace, and this project starts Spark with
fault-tolerant mode off (it is never used here).

RayDP is pinned (1.6.5): the two hooks used are ``ray_cluster.RayDPSparkMaster`` (the
class ``SparkCluster`` starts) and ``RayDPSparkMaster._generate_ray_configs`` (the JVM's
Ray settings, ``ray.job.namespace`` among them).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import ray
from raydp.spark import ray_cluster
from raydp.spark.ray_cluster_master import RayDPSparkMaster

# The Spark config naming the Ray namespace of a session's RayDP masters and executors.
NAMESPACE_CONF = "spark.raytopics.rayNamespace"


def session_namespace(project_namespace: str) -> str:
    """A fresh namespace for one Spark session's RayDP actors, named after the project's
    so that ``ray list actors`` shows whose they are."""
    return f"{project_namespace}-spark-{uuid.uuid4().hex[:8]}"


@ray.remote
class SessionSparkMaster(RayDPSparkMaster.__ray_actor_class__):  # type: ignore[attr-defined]
    """RayDP's Python master, whose JVM joins Ray in the session's namespace."""

    def _generate_ray_configs(self) -> str:
        options = json.loads(super()._generate_ray_configs())
        options["ray.job.namespace"] = self._configs[NAMESPACE_CONF]
        return json.dumps(options)


class _SessionMasterStarter:
    """Stands in for ``RayDPSparkMaster`` where RayDP's ``SparkCluster`` starts it:
    ``.options(...).remote(configs)`` starts a ``SessionSparkMaster`` in the namespace the
    configs name (RayDP's own class when they name none: a session built by hand)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self._options = options or {}

    def options(self, **options: Any) -> _SessionMasterStarter:
        return _SessionMasterStarter(options)

    def remote(self, configs: dict[str, Any]) -> ray.actor.ActorHandle:
        namespace = configs.get(NAMESPACE_CONF)
        if not namespace:
            return RayDPSparkMaster.options(**self._options).remote(configs)
        return SessionSparkMaster.options(namespace=namespace, **self._options).remote(configs)


def install() -> None:
    """Make RayDP start its masters through ``SessionSparkMaster`` in this process."""
    ray_cluster.RayDPSparkMaster = _SessionMasterStarter()
