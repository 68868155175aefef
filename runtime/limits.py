"""Limits: message and batch size, topics and segments per namespace and per topic.

Defaults come from ``RAYTOPICS_MAX_*`` variables; an operator can override any of
them for one namespace (``ScalableTopicsAdmin.set_namespace_limits``), kept by
``storage.catalog``. Every check raises ``LimitExceededError`` saying
what was asked and what is allowed, before anything is changed. The segment is
the authority on message and batch size; producers check the same numbers early
so that the error names the message, and split batches so none is too large
(``runtime.batch.check_batch`` and ``batch_slices``: the Arrow side of the same
numbers, kept there so that a process that never sees a batch, such as a
coordinator, does not import Arrow through its limits).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    LimitExceededError,
    is_integer,
)
from runtime.names import TopicName

_ENV = {
    "max_message_bytes": "RAYTOPICS_MAX_MESSAGE_BYTES",
    "max_batch_bytes": "RAYTOPICS_MAX_BATCH_BYTES",
    "max_batch_messages": "RAYTOPICS_MAX_BATCH_MESSAGES",
    "max_topics_per_namespace": "RAYTOPICS_MAX_TOPICS_PER_NAMESPACE",
    "max_segments_per_topic": "RAYTOPICS_MAX_SEGMENTS_PER_TOPIC",
    "max_segments_per_namespace": "RAYTOPICS_MAX_SEGMENTS_PER_NAMESPACE",
}
LIMIT_ENV_VARS = tuple(_ENV.values())


@dataclass(frozen=True)
class Limits:
    """Segment counts are of ACTIVE segments: sealed ones take no new writes."""

    max_message_bytes: int = 5 << 20
    max_batch_bytes: int = 64 << 20
    max_batch_messages: int = 100_000
    max_topics_per_namespace: int = 10_000
    max_segments_per_topic: int = 65_536
    max_segments_per_namespace: int = 1_000_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not is_integer(value, 1):
                raise InvalidArgumentError(
                    f"{field.name} must be a positive integer, got {value!r}"
                )
        if self.max_batch_bytes < self.max_message_bytes:
            raise InconsistentRequestError(
                f"max_batch_bytes ({self.max_batch_bytes}) must be >= max_message_bytes "
                f"({self.max_message_bytes}): a batch holds at least one message"
            )

    @classmethod
    def from_env(cls) -> Limits:
        values = {}
        for name, var in _ENV.items():
            raw = os.environ.get(var)
            if raw:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise InvalidArgumentError(f"{var} must be an integer, got {raw!r}") from None
        return cls(**values)

    def overridden(self, overrides: dict[str, Any]) -> Limits:
        unknown = sorted(set(overrides) - set(_ENV))
        if unknown:
            raise InvalidArgumentError(f"unknown limits {unknown}; known: {sorted(_ENV)}")
        return replace(self, **overrides)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    # --- checks ----------------------------------------------------------------------

    def check_message(self, nbytes: int) -> None:
        if nbytes > self.max_message_bytes:
            raise LimitExceededError(
                f"message of {nbytes} bytes (key + value) exceeds max_message_bytes "
                f"{self.max_message_bytes}"
            )

    def check_topics(self, namespace: str, existing: int) -> None:
        if existing + 1 > self.max_topics_per_namespace:
            raise LimitExceededError(
                f"namespace {namespace} has {existing} topic{'' if existing == 1 else 's'}; "
                "max_topics_per_namespace is "
                f"{self.max_topics_per_namespace}"
            )

    def check_segments(self, where: str, active_after: int, limit_name: str) -> None:
        """``limit_name``: ``max_segments_per_topic`` or ``max_segments_per_namespace``."""
        limit = getattr(self, limit_name)
        if active_after > limit:
            raise LimitExceededError(
                f"{where} would have {active_after} active segments; {limit_name} is {limit}"
            )


class _Catalog(Protocol):
    """What the checks read from ``storage.catalog.Catalog``."""

    def limit_overrides(self, namespace: str) -> dict[str, Any]: ...

    def active_segments(self, namespace: str) -> dict[str, int]: ...


def namespace_limits(catalog: _Catalog, namespace: str) -> Limits:
    """The env defaults with this namespace's stored overrides applied."""
    return Limits.from_env().overridden(catalog.limit_overrides(namespace))


class LiveLimits:
    """A namespace's limits as the catalog holds them now, re-read at most every
    ``max_age_s``: an operator's change reaches running segments and producers within
    seconds, not at their next restart, and the check on the append path costs a
    catalog read only once per ``max_age_s``.

    Who calls: the segment's appender (the authority) and the producer (early checks,
    batch cuts), on each use through ``current``."""

    def __init__(
        self,
        catalog: _Catalog,
        namespace: str,
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog, self._namespace = catalog, namespace
        self._max_age_s, self._clock = max_age_s, clock
        self._limits = namespace_limits(catalog, namespace)
        self._read_at = clock()

    @property
    def current(self) -> Limits:
        now = self._clock()
        if now - self._read_at >= self._max_age_s:
            self._read_at = now
            self._limits = namespace_limits(self._catalog, self._namespace)
        return self._limits


def check_room(
    catalog: _Catalog,
    topic: TopicName,
    added: int,
    *,
    new_topic: bool = False,
    active_now: int = 0,
) -> None:
    """Refuse what would break the namespace's limits, before anything is written.

    The admin client checks early (so a refused create starts no controller);
    the controller checks again as the authority. Per topic the check is exact
    (its controller is the only writer); across the topics of a namespace two
    concurrent creates may both pass.
    """
    namespace = topic.namespace_path
    limits = namespace_limits(catalog, namespace)
    others = {t: n for t, n in catalog.active_segments(namespace).items() if t != topic.topic}
    if new_topic:
        limits.check_topics(namespace, len(others))
    limits.check_segments(str(topic), active_now + added, "max_segments_per_topic")
    total = sum(others.values()) + active_now + added
    limits.check_segments(f"namespace {namespace}", total, "max_segments_per_namespace")
