"""The REST gateway's documents: request bodies, query strings and answers.

Each is a strict pydantic model, so bad input is refused with what is allowed
before it reaches the admin service, and the same models generate the
OpenAPI schemas (``actors.gateway.routes.openapi_document``), so the documentation
cannot drift from what is accepted. Bodies take JSON types literally ("4" is
not 4); query strings are text, coerced ("true" is True); unknown fields and
parameters are refused in both.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, create_model
from pydantic.json_schema import SkipJsonSchema

from runtime.auth import MIN_TOKEN_CHARS
from runtime.json_int import JsonInt, json_int
from runtime.layout import MAX_SEGMENTS, MAX_SPLIT_CHILDREN
from runtime.limits import Limits
from runtime.names import _PART, MAX_HASH
from runtime.readiness import MAX_LISTED, MAX_WAIT_S
from runtime.subscription import DEFAULT_GRACE_S, StartPosition
from storage.topic_storage import INCARNATION_PATTERN


class Body(BaseModel):
    """Request bodies: JSON types taken literally ("4" is not 4), unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NoBody(Body):
    """Endpoints without a body accept only an empty body or ``{}``."""


class CreateTopicBody(Body):
    num_segments: JsonInt = Field(
        alias="numSegments",
        ge=1,
        le=MAX_SEGMENTS,
        description=f"number of initial segments, an integer from 1 to {MAX_SEGMENTS}",
    )
    properties: dict[str, str] | None = Field(
        default=None, description="free-form string-to-string map stored with the topic"
    )


def _session_grace_s() -> Any:
    """How long a consumer that went quiet keeps its segments (a subscription's or a
    checkpoint group's)."""
    return Field(
        default=DEFAULT_GRACE_S,
        alias="sessionGraceS",
        gt=0,
        allow_inf_nan=False,
        description="seconds a disconnected stream consumer keeps its segments, > 0",
    )


class CreateSubscriptionBody(Body):
    position: StartPosition = Field(
        default="earliest", description="where the subscription starts: 'earliest' or 'latest'"
    )
    session_grace_s: float = _session_grace_s()


class ResetSubscriptionBody(Body):
    to: StartPosition | json_int(ge=946_684_800_000, le=(1 << 63) - 1) = Field(
        description="'earliest', 'latest', or a publish time in epoch milliseconds: each "
        "segment's cursor goes to the first message published at or after it"
    )


class CreateSegmentBody(Body):
    subscriptions: list[Annotated[str, Field(pattern=_PART.pattern)]] = Field(
        default_factory=list, description="subscription names to pre-create at Earliest"
    )


_MOST_AT = MAX_SPLIT_CHILDREN - 1  # hashes of one split: each starts a child after the first
_MOST_MORE = MAX_SPLIT_CHILDREN - 2  # segments of one merge beyond the path's two


class SplitBody(Body):
    at: (
        json_int(ge=0, le=MAX_HASH)
        | Annotated[list[json_int(ge=0, le=MAX_HASH)], Field(min_length=1, max_length=_MOST_AT)]
        | None
    ) = Field(
        default=None,
        description="where the upper child starts, or ascending hashes where each child "
        "after the first starts (a key's 16-bit Murmur3 hash, as `raytopics hash KEY` "
        "prints it), each strictly inside the segment's range; omitted: two halves",
    )
    parts: json_int(ge=2, le=MAX_SPLIT_CHILDREN) | None = Field(
        default=None,
        description="split into this many near-equal children instead of at hashes",
    )


class MergeBody(Body):
    more_segment_ids: Annotated[list[json_int(ge=0)], Field(max_length=_MOST_MORE)] | None = Field(
        default=None,
        alias="moreSegmentIds",
        description="further active segments merged with the two in the path: together "
        "they must be a run of neighbouring ranges (at most 64 segments in all)",
    )


class RecoverBody(Body):
    incarnation: str | None = Field(
        default=None,
        pattern=f"^{INCARNATION_PATTERN}$",
        description="which stored incarnation to recover (GET /admin/v2/storage lists them); "
        "may be omitted when only one exists",
    )


_NAME = _PART.pattern.removeprefix("^").removesuffix("$")
_SCOPE = f"^(\\*|{_NAME}/\\*|{_NAME}/{_NAME})$"
_ONE_OF_TOKEN_OR_DIGEST = {
    "oneOf": [
        {"required": ["token"], "not": {"required": ["sha256"]}},
        {"required": ["sha256"], "not": {"required": ["token"]}},
    ]
}


class GrantDocument(Body):
    namespace: str = Field(
        pattern=_SCOPE, description="scope: '*', 'tenant/*' or 'tenant/namespace'"
    )
    actions: list[Literal["admin", "produce", "consume", "lookup"]] = Field(
        min_length=1, description="admin implies all others; produce and consume imply lookup"
    )


class TokenDocument(Body):
    model_config = Body.model_config | ConfigDict(json_schema_extra=_ONE_OF_TOKEN_OR_DIGEST)

    principal: str = Field(
        min_length=1, description="who holds the token (named in refusals and logs)"
    )
    token: str = Field(
        default=None,
        min_length=MIN_TOKEN_CHARS,
        description="the token itself, >= 16 characters, hashed on arrival (give this or sha256)",
    )
    sha256: str = Field(
        default=None,
        pattern="^[0-9a-fA-F]{64}$",
        description="the SHA-256 hex digest of the token (give this or token)",
    )
    grants: list[GrantDocument] = Field(min_length=1, description="what the principal may do where")


class AuthDocument(Body):
    """The cluster's authentication policy: who holds which token and may do what."""

    tokens: list[TokenDocument] = Field(
        min_length=1,
        description="a non-empty list (authentication is turned off only by DELETE)",
    )


class Query(BaseModel):
    """Query strings: text is coerced ("true" is True), unknown parameters refused."""

    model_config = ConfigDict(extra="forbid")


class NoQuery(Query):
    """Endpoints without query parameters refuse any."""


class DeleteSegmentQuery(Query):
    force: bool = Field(default=False, description="delete even if ACTIVE in the layout")


class TerminateSegmentQuery(Query):
    force: bool = Field(default=False, description="terminate even if ACTIVE in the layout")


def _limits_model(name: str, doc: str, base: type[BaseModel], *, partial: bool) -> Any:
    """One integer field per ``runtime.limits.Limits`` field, so the REST documents
    cannot drift from the limits; ``partial``: each may be omitted (an override)."""
    bounded = json_int(ge=1, le=(1 << 63) - 1)  # stored as JSON, used as int64
    annotation, default = (bounded | None, None) if partial else (bounded, ...)
    limit = Field(default=default)
    model = create_model(
        name, __base__=base, **{f.name: (annotation, limit) for f in fields(Limits)}
    )
    model.__doc__ = doc
    return model


NamespaceLimitsBody = _limits_model(
    "NamespaceLimitsBody",
    "Overrides for one namespace; an omitted limit keeps its value.",
    Body,
    partial=True,
)
NamespaceLimits = _limits_model(
    "NamespaceLimits", "The limits in force in a namespace.", BaseModel, partial=False
)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer; ``error`` is the ``code`` of a ``runtime.errors`` class."""

    error: str = Field(description="stable machine-readable code, e.g. topic_not_found")
    message: str = Field(description="what went wrong and what is allowed instead")


def _wait_s(waits_for: str) -> Any:
    """A long poll's ``waitS``: how long the cluster may hold the answer back."""
    return Field(
        default=0.0,
        alias="waitS",
        ge=0,
        le=MAX_WAIT_S,
        allow_inf_nan=False,
        description=f"seconds to wait for {waits_for}, 0 to {MAX_WAIT_S:g}",
    )


class StatusQuery(Query):
    wait_s: float = _wait_s(
        "the topic to become ready before answering (the answer says whether it did)"
    )


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class LayoutQuery(Query):
    known_epoch: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] | SkipJsonSchema[None] = Field(
        default=None,
        alias="knownEpoch",
        json_schema_extra=_no_default,  # a query string cannot say null
        description="the layout epoch the caller holds: the answer waits for another "
        "(a split, merge or delete); without it, the layout now",
    )
    wait_s: float = _wait_s("the epoch to change")


class AssignmentQuery(Query):
    known_version: int = Field(
        default=-1,
        alias="knownVersion",
        ge=-1,
        le=(1 << 63) - 1,
        description="the assignment version the consumer holds (-1: none yet): the answer "
        "waits for another",
    )
    wait_s: float = _wait_s("the consumer's assignment to change")


_INT64 = (1 << 63) - 1
_NON_NEGATIVE = json_int(ge=0, le=_INT64)
_ONLY_PATTERNS: dict[str, Any] = {"additionalProperties": False}  # keys are segment ids
_SEGMENT_KEY_PATTERN = r"^(0|[1-9][0-9]{0,18})$"
_SEGMENT_KEY = Annotated[str, StringConstraints(pattern=_SEGMENT_KEY_PATTERN)]


class SegmentPositionBody(Body):
    position: _NON_NEGATIVE | None = Field(
        default=None,
        description="the consumer's next offset in the segment, for a checkpoint group "
        "(whose consumers keep no cursor in it); a stream subscription's position is its "
        "cursor in the segment (its acknowledgements), and this is ignored",
    )


class AcknowledgeBody(Body):
    offset: _NON_NEGATIVE = Field(description="the highest offset acknowledged, with all before it")


class NewTransactionBody(Body):
    timeout_s: float = Field(
        default=60.0, alias="timeoutS", ge=1.0, le=900.0,
        description="seconds it may stay open; past them it can only abort",
    )  # fmt: skip
    owner: str | None = Field(
        default=None,
        pattern=_PART.pattern,
        description="the owner (Kafka's transactional.id): its transaction before this "
        "one is fenced and can no longer commit",
    )


class TransactionAckBody(Body):
    subscription: str = Field(pattern=_PART.pattern)
    offset: _NON_NEGATIVE
    cumulative: bool = Field(default=False, description="everything up to offset")


class CheckpointGroupBody(Body):
    session_grace_s: float = _session_grace_s()


class ResetCheckpointGroupBody(Body):
    finished: list[_NON_NEGATIVE] = Field(
        description="the segments the checkpoint read to their end"
    )
    positions: dict[_SEGMENT_KEY, _NON_NEGATIVE] = Field(
        default_factory=dict,
        description="segment id → the checkpoint's next offset in it",
        json_schema_extra=_ONLY_PATTERNS,
    )


class TopicStatus(BaseModel):
    topic: str
    state: Literal["ready", "starting"] = Field(
        description="ready: every segment of the layout has a running actor"
    )
    segments: int = Field(ge=0, description="segments in the layout, sealed ones included")
    running: int = Field(ge=0, description="of those, how many have a running actor")
    not_running: list[int] = Field(
        alias="notRunning",
        description=f"ids of segments without a running actor (at most {MAX_LISTED})",
    )


class StreamPositionDoc(Body):
    """Where a streaming query stands (``runtime.stream_plan.StreamPosition``): made by
    the server, kept verbatim by the client (Spark's checkpoint), sent back as is."""

    topic: str
    incarnation: str = Field(pattern=f"^{INCARNATION_PATTERN}$")
    next: dict[_SEGMENT_KEY, json_int(ge=0, le=_INT64)] = Field(
        description="segment id → the next offset to read", json_schema_extra=_ONLY_PATTERNS
    )
    finished: list[json_int(ge=0, le=_INT64)] = Field(
        description="sealed segments read to their end"
    )


class StreamInitialBody(Body):
    starting_offsets: (
        Literal["earliest", "latest"]
        | Annotated[
            dict[_SEGMENT_KEY, json_int(ge=-2, le=_INT64)],
            WithJsonSchema(
                {
                    "type": "object",
                    "patternProperties": {
                        _SEGMENT_KEY_PATTERN: {"type": "integer", "minimum": -2, "maximum": _INT64}
                    },
                    **_ONLY_PATTERNS,
                }
            ),
        ]
        | None
    ) = Field(
        default=None,
        alias="startingOffsets",
        description="'earliest', 'latest', or segment id → offset (-2 earliest, -1 latest); "
        "a listed segment's ancestors count as read, others start at their earliest. "
        "Neither this nor startingTimestampMs: 'latest'",
    )
    starting_timestamp_ms: json_int(ge=0, le=_INT64) | None = Field(
        default=None,
        alias="startingTimestampMs",
        description="start at the first record published at or after this time (epoch ms) "
        "in each segment; not with startingOffsets",
    )


class StreamLatestBody(Body):
    start: StreamPositionDoc
    max_messages: json_int(ge=1, le=_INT64) | None = Field(
        default=None, alias="maxMessages", description="at most this many records in the batch"
    )
    max_bytes: json_int(ge=1, le=_INT64) | None = Field(
        default=None,
        alias="maxBytes",
        description="about this many bytes at most in the batch, estimated from each "
        "segment's mean stored record size (at least one record)",
    )
    until: StreamPositionDoc | None = Field(
        default=None, description="go no further than this earlier answer (Trigger.AvailableNow)"
    )
    fail_on_data_loss: bool = Field(
        default=True,
        alias="failOnDataLoss",
        description="true: records deleted before they were read fail the call; false: "
        "skipped, with a warning",
    )


class StreamRangesBody(Body):
    start: StreamPositionDoc
    end: StreamPositionDoc
    fail_on_data_loss: bool = Field(
        default=True,
        alias="failOnDataLoss",
        description="true: a segment deleted before the batch read it fails the call; false: "
        "its range is left out, with a warning",
    )


_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class SinkRecord(Body):
    key: str | None = Field(default=None, description="routes the record, as a producer's key")
    value: str = Field(pattern=_BASE64, description="the value's bytes, base64")
    properties: dict[str, str] | None = None


class StreamWriteBody(Body):
    """One chunk of one partition of a streaming sink's micro-batch."""

    query_id: str = Field(alias="queryId", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    batch_id: json_int(ge=0, le=_INT64) = Field(alias="batchId")
    partition_id: json_int(ge=0, le=(1 << 31) - 1) = Field(alias="partitionId")
    chunk: json_int(ge=0, le=(1 << 31) - 1) = Field(
        default=0, description="the chunk's place in the partition's rows"
    )
    records: list[SinkRecord]


_HASH = json_int(ge=0, le=MAX_HASH)
MAX_SINK_CHUNK_ROWS = 100_000  # a chunk is one append per segment: a batch's default cap


class _SinkChunkKey(Body):
    query_id: str = Field(alias="queryId", pattern=_PART.pattern)
    partition_id: json_int(ge=0, le=(1 << 31) - 1) = Field(alias="partitionId")
    chunk: json_int(ge=0, le=(1 << 31) - 1) = Field(
        description="the chunk's place in the partition's rows"
    )


class StreamSinkOpenBody(_SinkChunkKey):
    """A chunk a streaming sink's task stores over the data plane, by its records' hashes."""

    batch_id: json_int(ge=0, le=_INT64) = Field(alias="batchId")
    hashes: list[_HASH] = Field(
        description="each record's routing hash, in the chunk's order: its key's (Murmur3), "
        "or for a record without a key, Murmur3 of 'partition:chunk:index'",
        max_length=MAX_SINK_CHUNK_ROWS,
    )


class HashRangeDoc(Body):
    start: _HASH
    end: _HASH


class SinkPartDoc(Body):
    """Which records of a chunk (those hashed into ``hash_range``) go to ``segment``,
    under the chunk's producer id and ``sequence``."""

    segment: json_int(ge=0, le=_INT64)
    sequence: json_int(ge=0, le=_INT64)
    hash_range: HashRangeDoc


class SinkWriteDoc(Body):
    batch: json_int(ge=0, le=_INT64)
    parts: list[SinkPartDoc]
    done: bool = False


class ChunkRecordDoc(Body):
    """A chunk's record as the cluster sent it (``…/stream/sink/open`` or ``reroute``),
    sent back as is: ``version`` is its compare-and-swap token."""

    write: SinkWriteDoc
    version: str = Field(pattern=r"^[0-9a-f]{1,40}:[0-9]{1,18}$")
    segments: dict[_SEGMENT_KEY, str] = Field(
        default_factory=dict, description="segment id → name", json_schema_extra=_ONLY_PATTERNS
    )


class StreamSinkRerouteBody(_SinkChunkKey):
    recorded: ChunkRecordDoc
    part: SinkPartDoc = Field(description="the part its sealed segment refused")
    hashes: list[_HASH] = Field(max_length=MAX_SINK_CHUNK_ROWS)


class StreamSinkFinishBody(_SinkChunkKey):
    recorded: ChunkRecordDoc


class TerminateResult(BaseModel):
    end_offset: int = Field(alias="endOffset", description="offset after the last record")


# path parameters that are segment ids (integers); every other one is a name
ID_PARAMS = ("segmentId", "segmentId1", "segmentId2")
MAX_SEGMENT_ID = (1 << 63) - 1  # ids are int64 wherever they are stored or sent
STRINGS = {"type": "array", "items": {"type": "string"}}
HEALTH = {
    "type": "object",
    "properties": {
        "status": {"const": "ok"},
        "metadata": {
            "type": "object",
            "description": "where the cluster's GCS keeps metadata; durable: survives a "
            "restart of the head",
            "properties": {
                "backend": {"enum": ["rocksdb", "redis", "memory", "unknown"]},
                "durable": {"type": "boolean"},
            },
        },
        "metrics": {
            "type": "array",
            "items": {"type": "string"},
            "description": "each live node's Prometheus endpoint, where the raytopics_* "
            "metrics of the actors on that node are exported",
        },
    },
}
OBJECT = {"type": "object", "additionalProperties": True}
OBJECTS = {"type": "array", "items": OBJECT}
