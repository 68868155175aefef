"""Which host process a segment goes to: pure naming, shared by whoever starts segments
and whoever counts or kills their hosts (``actors.segment.directory`` says why segments
share processes at all)."""

from __future__ import annotations

import os

from runtime.errors import InvalidArgumentError
from runtime.names import SegmentName, TopicName

HOSTS_ENV = "RAYTOPICS_SEGMENT_HOSTS"
DEFAULT_HOSTS_PER_TOPIC = 1
HOST_PREFIX = "segment-host:"


def hosts_per_topic() -> int:
    """How many hosts share a topic's segments on shared storage (``RAYTOPICS_SEGMENT_HOSTS``):
    1 keeps a topic in one process; more spread a busy topic over more cores and nodes."""
    raw = os.environ.get(HOSTS_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_HOSTS_PER_TOPIC
    except ValueError:
        raise InvalidArgumentError(f"{HOSTS_ENV} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise InvalidArgumentError(f"{HOSTS_ENV} must be at least 1, got {value}")
    return value


def host_name(segment: SegmentName, node: str | None, hosts: int) -> str:
    """The host of ``segment``: the one on Ray node ``node`` (a disk per node: a segment
    runs where its files are) or one of its topic's ``hosts``, by segment id. Every name
    starts with ``host_prefix(topic)``."""
    slot = f"node-{node}" if node else str(segment.segment_id % hosts)
    return f"{host_prefix(segment.topic)}{slot}"


def host_prefix(topic: TopicName) -> str:
    """What every host name of ``topic`` starts with (and no other topic's)."""
    return f"{HOST_PREFIX}{topic.short}/"
