"""A topic's operating policy: automatic scaling, retention, tiering, hibernation and
how finely stream subscriptions share segments.

Stored inside the topic record (``policy``), so it changes through the same
fenced compare-and-swap as the layout and a restarted controller finds it
there. Absent parts mean "off": a topic without a policy is never split,
merged, truncated or pruned behind its operator's back.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.errors import InconsistentRequestError, InvalidArgumentError
from runtime.json_int import JsonInt, json_int
from runtime.layout import MAX_SEGMENTS
from runtime.replication import MAX_REPLICATION_FACTOR, Replication
from runtime.uris import redacted


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid", strict=True)


_TARGETS = ("targetMsgsPerS", "targetBytesPerS", "targetOutputMsgsPerS")
_A_TARGET = {
    "anyOf": [
        {"required": [target], "properties": {target: {"type": "number"}}} for target in _TARGETS
    ]
}


class AutoscalePolicy(_Model):
    """Split a segment whose load stays above target; merge two adjacent cold ones.

    Load is the largest of msgs/s and bytes/s written and msgs/s acknowledged (summed
    over its subscriptions: what reading it costs), each relative to its target
    (1.0 = at target). ``scale_factor`` is the hysteresis: two neighbours
    merge only when together they carry less than ``1 / scale_factor`` of one
    segment's target, so the merged segment is far from a split again, and a
    split's two halves (together above target) are never merged back.

    Consumers count too: when a stream subscription has more consumers than active
    segments, the busiest segment splits if its load is at least
    ``consumer_split_load`` (never below ``1 / scale_factor``, so a merged segment is
    not split again for them); below it the consumers share segments by key bucket
    instead (a *re-bucket*: the layout stays). ``max_merges_per_lineage`` caps how many
    merges a segment's ancestry may hold, so a lineage does not merge and split forever.
    """

    model_config = _Model.model_config | ConfigDict(json_schema_extra=_A_TARGET)

    target_msgs_per_s: float | None = Field(
        default=None, alias="targetMsgsPerS", gt=0, description="messages/s one segment should take"
    )
    target_bytes_per_s: float | None = Field(
        default=None, alias="targetBytesPerS", gt=0, description="bytes/s one segment should take"
    )
    target_output_msgs_per_s: float | None = Field(
        default=None, alias="targetOutputMsgsPerS", gt=0,
        description="messages/s one segment's subscriptions should acknowledge, summed",
    )  # fmt: skip
    consumer_split_load: float = Field(
        default=0.5, alias="consumerSplitLoad", ge=0, le=1,
        description="with more stream consumers than active segments, split the busiest "
        "segment if its load is at least this (else share by key bucket)",
    )  # fmt: skip
    max_merges_per_lineage: json_int(ge=0, le=MAX_SEGMENTS) | None = Field(
        default=None, alias="maxMergesPerLineage",
        description="merges a segment's ancestry in the layout may hold (none: no cap)",
    )  # fmt: skip
    scale_factor: float = Field(
        default=2.0, alias="scaleFactor", gt=1, le=100,
        description="merge only below target / scaleFactor (hysteresis), > 1",
    )  # fmt: skip
    min_segments: JsonInt = Field(default=1, alias="minSegments", ge=1, le=MAX_SEGMENTS)
    max_segments: JsonInt = Field(default=64, alias="maxSegments", ge=1, le=MAX_SEGMENTS)
    cooldown_s: float = Field(
        default=60.0, alias="cooldownS", ge=0, description="quiet time after any layout change"
    )
    window_s: float = Field(
        default=10.0, alias="windowS", gt=0, description="rates are averaged over this window"
    )

    @model_validator(mode="after")
    def _a_target(self) -> AutoscalePolicy:
        targets = (self.target_msgs_per_s, self.target_bytes_per_s, self.target_output_msgs_per_s)
        if all(target is None for target in targets):
            raise ValueError("set targetMsgsPerS, targetBytesPerS, targetOutputMsgsPerS or some")
        return self

    def check_consistent(self) -> None:
        """What the schema cannot say: ``InconsistentRequestError`` for min > max."""
        if self.min_segments > self.max_segments:
            raise InconsistentRequestError(
                f"autoscale: minSegments {self.min_segments} > maxSegments {self.max_segments}"
            )


class RetentionPolicy(_Model):
    """How long data is kept, for sealed and active segments alike."""

    time_s: float | None = Field(
        default=None, alias="timeS", ge=0,
        description="drop data older than this; drained sealed segments are pruned after it",
    )  # fmt: skip
    size_bytes: json_int(gt=0) | None = Field(
        default=None, alias="sizeBytes",
        description="cap on an active segment's stored bytes (oldest batches go first)",
    )  # fmt: skip


class TieringPolicy(_Model):
    """Sealed segments move to an object store once sealed for ``after_s`` seconds, and are
    served from there (``storage.tier``) by a process started when a reader needs one and
    stopped after ``idle_s`` unused. The URI names a location only: the endpoint,
    credentials and other options of the store are the operator's
    (``RAYTOPICS_TIER_URIS`` or the cluster's environment, ``runtime.tiering``)."""

    uri: str = Field(
        min_length=1, max_length=2048,
        description="a location under one of the cluster's allowed tiers "
        "(RAYTOPICS_TIER_URIS): file:///path or s3://bucket/prefix, with no query, "
        "credentials or fragment",
    )  # fmt: skip
    after_s: float = Field(
        default=60.0, alias="afterS", ge=0, le=10 * 365 * 86400,
        description="seconds a segment stays sealed on local disk before it moves",
    )  # fmt: skip
    idle_s: float = Field(
        default=60.0, alias="idleS", ge=0, le=86400,
        description="seconds a tiered segment woken by a reader stays up unused before "
        "its process exits again (it is started again on demand)",
    )  # fmt: skip


class HibernationPolicy(_Model):
    """A sealed segment kept on local disk (a topic without tiering, or one not moved yet)
    whose every subscription has acknowledged all of it and that no reader has used for
    ``idle_s`` seconds costs no process: its actor exits, and is started again on demand
    (a new subscription, a reader, a replay)."""

    idle_s: float = Field(
        default=300.0, alias="idleS", ge=0, le=86400,
        description="seconds a drained sealed segment stays up unused before its process "
        "exits (it is started again on demand)",
    )  # fmt: skip


DEFAULT_KEY_BUCKETS = 256


class KeySharedPolicy(_Model):
    """How finely a stream subscription's segments may be shared when it has more
    consumers than readable segments: each segment's keys fall in ``buckets`` buckets
    (``runtime.hashing.key_buckets``), and each consumer owns a run of whole buckets,
    so a key is read by one consumer at a time. 1 turns sharing off: consumers beyond
    the readable segments wait, as a Kafka group's beyond its partitions."""

    buckets: JsonInt = Field(
        default=DEFAULT_KEY_BUCKETS, ge=1, le=65536,
        description="key buckets per segment: the most consumers one segment is shared by",
    )  # fmt: skip


class ReplicationPolicy(_Model):
    """How many copies each active segment keeps, one per node, each on its node's own
    disk (``runtime.replication``): an append is acknowledged once ``ackQuorum`` of them,
    the leader among them, hold it. Needs a storage root per node
    (``RAYTOPICS_STORAGE_SCOPE=node``) and at least ``factor`` nodes the namespace may
    place segments on; applies to segments created after it is set, and within seconds
    to the active segments a topic has (``actors.control.replica_keeper``)."""

    factor: JsonInt = Field(
        default=1, ge=1, le=MAX_REPLICATION_FACTOR,
        description="copies of each active segment, each on a node of its own",
    )  # fmt: skip
    ack_quorum: json_int(ge=1, le=MAX_REPLICATION_FACTOR) | None = Field(
        default=None, alias="ackQuorum",
        description="copies that must hold a message before it is acknowledged, the "
        "leader's among them (default: a majority of factor)",
    )  # fmt: skip

    def check_consistent(self) -> None:
        """What the schema cannot say: ``InconsistentRequestError`` for ackQuorum > factor."""
        if self.ack_quorum is not None and self.ack_quorum > self.factor:
            raise InconsistentRequestError(
                f"replication: ackQuorum {self.ack_quorum} > factor {self.factor}"
            )

    @property
    def settings(self) -> Replication:
        return Replication.of(self.factor, self.ack_quorum)


class TopicPolicy(_Model):
    autoscale: AutoscalePolicy | None = None
    retention: RetentionPolicy | None = None
    tiering: TieringPolicy | None = None
    hibernation: HibernationPolicy | None = None
    key_shared: KeySharedPolicy | None = Field(default=None, alias="keyShared")
    replication: ReplicationPolicy | None = None

    @property
    def replicas(self) -> Replication:
        """The replication in force (one copy when the policy sets none)."""
        return Replication() if self.replication is None else self.replication.settings

    @property
    def key_buckets(self) -> int:
        """The key buckets per segment in force (the default when the policy sets none)."""
        return DEFAULT_KEY_BUCKETS if self.key_shared is None else self.key_shared.buckets

    @classmethod
    def parse(cls, data: Any) -> TopicPolicy:
        """Validate a JSON-shaped dict, raising ``InvalidArgumentError`` saying what is wrong."""
        if isinstance(data, TopicPolicy):
            return data
        try:
            parsed = cls.model_validate(data) if data is not None else cls()
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'policy'}: {e['msg']}"
                for e in err.errors(include_url=False)
            )
            raise InvalidArgumentError(f"invalid topic policy: {problems}") from None
        for part in (parsed.autoscale, parsed.replication):
            if part is not None:
                part.check_consistent()
        return parsed

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")

    def over(self, default: TopicPolicy | None) -> TopicPolicy:
        """This policy, with ``default``'s part (its namespace's) wherever it sets none:
        a topic's own part (autoscale, retention, tiering, hibernation, keyShared,
        replication) wins as a whole, never merged."""
        if default is None:
            return self
        return self.model_copy(
            update={
                "autoscale": self.autoscale or default.autoscale,
                "retention": self.retention or default.retention,
                "tiering": self.tiering or default.tiering,
                "hibernation": self.hibernation or default.hibernation,
                "key_shared": self.key_shared or default.key_shared,
                "replication": self.replication or default.replication,
            }
        )

    def shown(self) -> dict[str, Any]:
        """``to_dict`` as answered to callers: a tier URI's credentials hidden."""
        shown = self.to_dict()
        if self.tiering is not None:
            shown["tiering"]["uri"] = redacted(self.tiering.uri)
        return shown
