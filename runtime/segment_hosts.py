"""Which host process a segment, a topic's controller, or a subscription's coordinator goes
to: pure naming, shared by whoever starts them and whoever counts or closes their hosts
(``actors.segment.directory`` says why segments share processes at all;
``actors.control.controller_host`` and ``actors.control.coordinator_host`` why
controllers and coordinators do).

A host serves the segments of every topic of one namespace (``tenant/namespace``), as a
broker serves many topics: a topic's creation then starts its controller only, and an
idle namespace costs one process however many topics it holds. A namespace is also the
unit of placement (``runtime.placement``) and of authorization, so a host never mixes
two namespaces' data, nodes or tenants.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Mapping

from runtime.errors import InvalidArgumentError
from runtime.names import SegmentName, TopicName

HOSTS_ENV = "RAYTOPICS_SEGMENT_HOSTS"
DEFAULT_HOSTS_PER_NAMESPACE = 1
HOST_PREFIX = "segment-host:"
CONTROLLER_HOST_PREFIX = "controllers:"
COORDINATOR_HOST_PREFIX = "coordinators:"
IDLE_EXIT_ENV = "RAYTOPICS_HOST_IDLE_EXIT_S"
DEFAULT_IDLE_EXIT_S = 30.0


def hosts_per_namespace() -> int:
    """How many hosts share a namespace's segments on shared storage
    (``RAYTOPICS_SEGMENT_HOSTS``): 1 keeps a namespace in one process; more spread busy
    topics over more cores and nodes."""
    raw = os.environ.get(HOSTS_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_HOSTS_PER_NAMESPACE
    except ValueError:
        raise InvalidArgumentError(f"{HOSTS_ENV} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise InvalidArgumentError(f"{HOSTS_ENV} must be at least 1, got {value}")
    return value


def idle_exit_s() -> float:
    """How long a host that serves no segment waits before its process exits
    (``RAYTOPICS_HOST_IDLE_EXIT_S``): a namespace whose topics were all deleted, or whose
    segments all hibernate, then costs no process; the next segment opened starts one."""
    raw = os.environ.get(IDLE_EXIT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_IDLE_EXIT_S
    except ValueError:
        raise InvalidArgumentError(f"{IDLE_EXIT_ENV} must be a number, got {raw!r}") from None
    if not value > 0:
        raise InvalidArgumentError(f"{IDLE_EXIT_ENV} must be more than 0, got {value}")
    return value


def host_name(
    segment: SegmentName, node: str | None, hosts: int, settings: Mapping[str, str] | None = None
) -> str:
    """The host of ``segment``: the one on Ray node ``node`` (a disk per node: a segment
    runs where its files are) or one of its namespace's ``hosts``, by segment id from a
    slot of its own topic's (so one topic's segments, and the namespace's topics, spread
    over the hosts). Topics created with ``settings`` of their own
    (``runtime.config.topic_settings``: the certificate their data plane serves with)
    share hosts only with topics created with the same. Every name starts with
    ``host_prefix(segment.topic)``."""
    if node:
        slot = f"node-{node}"
    else:
        slot = str((_topic_slot(segment.topic) + segment.segment_id) % hosts)
    return f"{host_prefix(segment.topic)}{settings_tag(settings or {})}{slot}"


def controller_host_name(topic: TopicName, settings: Mapping[str, str] | None = None) -> str:
    """The host of ``topic``'s controller: its namespace's, or, for a topic created with
    ``settings`` of its own, the one of the namespace's topics created with the same (a
    controller's process settings are what its segments start with)."""
    tag = settings_tag(settings or {}).rstrip("/")
    return f"{CONTROLLER_HOST_PREFIX}{topic.namespace_path}" + (f"/{tag}" if tag else "")


def coordinator_host_name(topic: TopicName) -> str:
    """The host of the coordinators of ``topic``'s subscriptions: its namespace's (a
    coordinator serves no data, so a topic's own settings do not choose its host)."""
    return f"{COORDINATOR_HOST_PREFIX}{topic.namespace_path}"


def host_namespace(host: str) -> str:
    """The namespace (``tenant/namespace``) whose segments host ``host`` serves."""
    tenant, namespace, *_ = host.removeprefix(HOST_PREFIX).split("/")
    return f"{tenant}/{namespace}"


def host_prefix(topic: TopicName) -> str:
    """What the name of every host that may serve ``topic``'s segments starts with: its
    namespace's hosts (and no other namespace's)."""
    return f"{HOST_PREFIX}{topic.namespace_path}/"


def settings_tag(settings: Mapping[str, str]) -> str:
    """Nothing for a topic without settings of its own, else a short digest of them (never
    the values: actor names are public)."""
    if not settings:
        return ""
    digest = hashlib.sha256(json.dumps(sorted(settings.items())).encode()).hexdigest()
    return f"with-{digest[:10]}/"


def _topic_slot(topic: TopicName) -> int:
    """A stable number per topic (the same in every process and run)."""
    return zlib.crc32(topic.short.encode())
