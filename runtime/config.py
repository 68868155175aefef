"""Process-wide settings, each overridable from the environment.

Every knob is a ``RAYTOPICS_*`` variable. The actors of the system get the
variables of the program that started them as a constructor argument
(``apply_settings``), not through a job ``runtime_env``: with one, Ray starts
every worker process through a second interpreter, which nearly doubles what an
actor costs to start (and a restarted cluster starts all of them at once). The
argument also makes a restarted actor run with exactly the settings it had.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Mapping

from runtime.capacity import MEMORY_ENV, PER_CPU_ENV
from runtime.limits import LIMIT_ENV_VARS
from runtime.listen import PORTS_ENV
from runtime.logs import LOG_LEVEL_ENV, configure_actor_logging
from runtime.placement import PLACEMENT_ENV
from runtime.rest import REST_TIMEOUT_ENV
from runtime.segment_hosts import HOSTS_ENV, IDLE_EXIT_ENV
from runtime.tiering import TIER_URIS_ENV
from runtime.tls import TLS_ENV_VARS

DEFAULT_NAMESPACE = "scalable-topics"
log = logging.getLogger(__name__)
GC_FREEZE_ENV = "RAYTOPICS_GC_FREEZE"  # read by clients (clients._ray), forwarded to actors

# What actors started from this process must see too. A client's token and the
# operator's token file are not among them: no actor acts on a client's behalf
# with the client's credentials, and the cluster's policy lives in its metadata.
ACTOR_SETTINGS = (
    "RAYTOPICS_NAMESPACE",
    "RAYTOPICS_STORAGE_ROOT",
    "RAYTOPICS_STORAGE_SCOPE",
    "RAYTOPICS_DURABILITY",
    "RAYTOPICS_FSYNC_INTERVAL_S",
    "RAYTOPICS_ACK_TIMEOUT_S",
    "RAYTOPICS_MAINTENANCE_INTERVAL_S",
    HOSTS_ENV,
    IDLE_EXIT_ENV,
    PLACEMENT_ENV,
    GC_FREEZE_ENV,
    LOG_LEVEL_ENV,
    MEMORY_ENV,
    PER_CPU_ENV,
    REST_TIMEOUT_ENV,
    PORTS_ENV,
    TIER_URIS_ENV,
    *LIMIT_ENV_VARS,
    *TLS_ENV_VARS,
)


def ray_namespace() -> str:
    """The Ray namespace (and GCS KV namespace) every actor of the system lives in:
    ``RAYTOPICS_NAMESPACE``, else the running Ray job's namespace when the job chose one
    (``connect(namespace=...)``, ``ray.init(namespace=...)``: its tasks and actors
    inherit it), else the default. A job that called a plain ``ray.init()`` has an
    anonymous namespace of its own, which holds nothing: it gets the default, as a
    program that never called ``ray.init`` does."""
    configured = os.environ.get("RAYTOPICS_NAMESPACE")
    if configured:
        return configured
    import ray  # not at import time: the CLI's --help must not pay for Ray

    if ray.is_initialized():
        job_namespace = ray.get_runtime_context().namespace
        if not _anonymous(job_namespace):
            _say_chosen(job_namespace)
            return job_namespace
    return DEFAULT_NAMESPACE


def _anonymous(namespace: str) -> bool:
    """Whether ``namespace`` is the one Ray makes up for a job that named none (a
    random UUID, ``ray.job_config``)."""
    try:
        return str(uuid.UUID(namespace)) == namespace
    except ValueError:
        return False


@functools.cache
def _say_chosen(namespace: str) -> None:
    """Tell a driver, once, that its own namespace is where it finds topics."""
    import ray

    if namespace != DEFAULT_NAMESPACE and ray.get_runtime_context().worker.mode == ray.SCRIPT_MODE:
        log.warning(
            "raytopics: using this program's Ray namespace %r; topics of the default "
            "namespace %r are not seen from it (set RAYTOPICS_NAMESPACE to choose)",
            namespace, DEFAULT_NAMESPACE,
        )  # fmt: skip


def apply_settings(settings: Mapping[str, str] | None) -> None:
    """Make an actor's process see the settings of the program that started it, and log
    as the system's actors do (``runtime.logs``, at the level those settings say).

    Called first thing in every actor's constructor, before anything reads them;
    the actors it starts in turn get them from its environment."""
    os.environ.update(settings or {})
    configure_actor_logging()


def actor_settings() -> dict[str, str]:
    """This process's settings that the actors it starts must run with."""
    return {name: os.environ[name] for name in ACTOR_SETTINGS if name in os.environ}


# What the program creating a topic decides for that topic's actors, though the
# cluster's admin service starts them: the certificate its segments serve with.
# The rest (namespace, storage root, limits, footprint) is the cluster's.
TOPIC_SETTINGS = TLS_ENV_VARS


def topic_settings() -> dict[str, str]:
    """This process's settings for the actors of a topic it creates."""
    return {name: os.environ[name] for name in TOPIC_SETTINGS if name in os.environ}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default
