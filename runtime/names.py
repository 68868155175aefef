"""Names of topics and segments, and everything derived from them.

One module owns the text forms (``topic://``, ``segment://``, Ray actor names)
so the dashboard, the metadata store (``storage.catalog`` builds its paths from
these parts) and the REST paths can never disagree about what a topic is called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtime.errors import InvalidNameError

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$")
_DESCRIPTOR = re.compile(r"^([0-9a-f]{4})-([0-9a-f]{4})-(0|[1-9][0-9]{0,18})$")
_ALLOWED = (
    "1-128 characters of letters, digits, '_', '.', '=', '-', starting with a letter or digit"
)
MAX_HASH = 0xFFFF


def is_valid_part(value: object) -> bool:
    return isinstance(value, str) and _PART.fullmatch(value) is not None


def validate_part(kind: str, value: str) -> str:
    """Check one path component (tenant, namespace, topic, subscription, consumer)."""
    if not is_valid_part(value):
        raise InvalidNameError(f"invalid {kind} {value!r}: use {_ALLOWED}")
    return value


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    topic: str

    def __post_init__(self) -> None:
        validate_part("tenant", self.tenant)
        validate_part("namespace", self.namespace)
        validate_part("topic", self.topic)

    @classmethod
    def parse(cls, name: str | TopicName) -> TopicName:
        if isinstance(name, TopicName):
            return name
        if not isinstance(name, str) or not name.startswith("topic://"):
            raise InvalidNameError(
                f"invalid topic name {name!r}: expected topic://tenant/namespace/topic"
            )
        parts = name[len("topic://") :].split("/")
        if len(parts) != 3:
            raise InvalidNameError(
                f"invalid topic name {name!r}: expected exactly tenant/namespace/topic "
                "after topic://"
            )
        try:
            return cls(*parts)
        except InvalidNameError as err:
            raise InvalidNameError(f"invalid topic name {name!r}: {err.message}") from None

    def __str__(self) -> str:
        return f"topic://{self.short}"

    @property
    def short(self) -> str:
        """``tenant/namespace/topic``: the form used in actor names and REST paths."""
        return f"{self.tenant}/{self.namespace}/{self.topic}"

    @property
    def namespace_path(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    def segment(self, segment_id: int, start: int, end: int) -> SegmentName:
        return SegmentName(self, segment_id, start, end)


def parse_namespace(namespace: str) -> tuple[str, str]:
    """``tenant/namespace`` as its two validated parts."""
    parts = namespace.split("/") if isinstance(namespace, str) else []
    if len(parts) != 2:
        raise InvalidNameError(f"invalid namespace {namespace!r}: expected tenant/namespace")
    return validate_part("tenant", parts[0]), validate_part("namespace", parts[1])


@dataclass(frozen=True)
class SegmentName:
    topic: TopicName
    segment_id: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.start <= self.end <= MAX_HASH):
            raise InvalidNameError(
                f"invalid segment range [{self.start}, {self.end}]: "
                f"need 0 <= start <= end <= {MAX_HASH}"
            )
        if self.segment_id < 0:
            raise InvalidNameError(f"invalid segment id {self.segment_id}: must be >= 0")

    @property
    def descriptor(self) -> str:
        return f"{self.start:04x}-{self.end:04x}-{self.segment_id}"

    @classmethod
    def from_descriptor(cls, topic: TopicName, descriptor: str) -> SegmentName:
        match = _DESCRIPTOR.fullmatch(descriptor) if isinstance(descriptor, str) else None
        if not match:
            raise InvalidNameError(
                f"invalid segment descriptor {descriptor!r}: expected "
                "{start:04x}-{end:04x}-{segmentId}, e.g. 0000-7fff-1"
            )
        start, end, seg = int(match[1], 16), int(match[2], 16), int(match[3])
        return cls(topic, seg, start, end)

    @classmethod
    def parse(cls, name: str | SegmentName) -> SegmentName:
        if isinstance(name, SegmentName):
            return name
        if not isinstance(name, str) or not name.startswith("segment://"):
            raise InvalidNameError(
                f"invalid segment name {name!r}: expected "
                "segment://tenant/namespace/topic/{start:04x}-{end:04x}-{id}"
            )
        parts = name[len("segment://") :].split("/")
        if len(parts) != 4:
            raise InvalidNameError(
                f"invalid segment name {name!r}: expected tenant/namespace/topic/descriptor "
                "after segment://"
            )
        return cls.from_descriptor(TopicName(*parts[:3]), parts[3])

    def __str__(self) -> str:
        return f"segment://{self.topic.short}/{self.descriptor}"

    @property
    def actor_name(self) -> str:
        return f"segment:{self.topic.short}/{self.descriptor}"
