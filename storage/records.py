"""The records the metadata store holds, one model each, and how each is (de)serialized.

Where each is stored is ``storage.catalog``'s business (its path table); who may
change one, and how, too. These are the shapes: a record's fields change here
and only here, and every reader of the store sees the same one.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runtime.auth import AuthPolicy
from runtime.layout import ScalableTopicMetadata, SegmentLayout
from runtime.operations import CompletedOperation, PendingOperation, find_completed
from runtime.policy import TopicPolicy
from runtime.subscription import DEFAULT_GRACE_S, StartPosition


class TopicRecord(ScalableTopicMetadata):
    """What is stored at ``/topics/{tenant}/{namespace}/{topic}``.

    The public ``ScalableTopicMetadata`` fields, plus the topic's incarnation
    (which storage is its own), the fencing epoch of the controller that last
    wrote it and the operation it is carrying out: the last two must change in
    the same compare-and-swap as the layout they guard.
    """

    incarnation: str = Field(min_length=1)
    created_at_ms: int = Field(
        default_factory=lambda: int(time.time() * 1000), alias="createdAtMs", ge=0
    )
    controller_epoch: int = Field(default=0, alias="controllerEpoch", ge=0)
    pending_operation: PendingOperation | None = Field(default=None, alias="pendingOperation")
    last_operation: CompletedOperation | None = Field(default=None, alias="lastOperation")
    # the latest splits and merges (``runtime.operations.REMEMBERED_OPERATIONS``), so a
    # retry is answered with its result after other operations committed too
    recent_operations: tuple[CompletedOperation, ...] = Field(default=(), alias="recentOperations")
    policy: TopicPolicy | None = None
    # the request id of the create that made this incarnation: the same create sent again
    # (a retry whose answer was lost) is answered with the topic instead of a conflict
    created_by: str | None = Field(default=None, alias="createdBy")
    # a rebuilt record (``recover_topic``): what the rebuild found (incarnation,
    # subscriptions, discarded segments, the operation it finished), so the same
    # rebuild sent again is answered as the first was
    recovery: dict[str, Any] | None = None

    @property
    def layout(self) -> SegmentLayout:
        return SegmentLayout.from_metadata(self)

    def completed_operation(self, request_id: str) -> CompletedOperation | None:
        """The remembered split or merge of ``request_id`` (records written before
        ``recent_operations`` existed remember their last one only)."""
        last = (self.last_operation,) if self.last_operation is not None else ()
        return find_completed((*last, *self.recent_operations), request_id)

    def with_layout(self, layout: SegmentLayout, **changes: object) -> TopicRecord:
        meta = layout.to_metadata()
        return self.model_copy(
            update={
                "epoch": meta.epoch,
                "next_segment_id": meta.next_segment_id,
                "segments": meta.segments,
                "properties": meta.properties,
                **changes,
            }
        )

    @classmethod
    def new(
        cls,
        layout: SegmentLayout,
        incarnation: str,
        controller_epoch: int,
        **changes: object,
    ) -> TopicRecord:
        return cls.model_validate(
            {
                **layout.to_dict(),
                "incarnation": incarnation,
                "controllerEpoch": controller_epoch,
            }
        ).model_copy(update=changes)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> TopicRecord:
        return cls.model_validate_json(data)


class SubscriptionState(StrEnum):
    """How far creating or deleting a subscription across its segments got."""

    CREATING = "CREATING"
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


class SubscriptionKind(StrEnum):
    """A subscription proper (cursors in the segments, consumers registered with its
    coordinator), or a checkpoint group (positions its consumers commit here)."""

    SUBSCRIPTION = "subscription"
    CHECKPOINT_GROUP = "checkpoint_group"


class SubscriptionMetadata(BaseModel):
    """What is stored at ``.../subscriptions/{subscription}``.

    A subscription is created and deleted across many segments; ``state``
    records how far that got, so a controller restart can finish the job.
    """

    # states and kinds held as their plain values, as stored and as callers are answered
    model_config = ConfigDict(
        frozen=True,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    name: str
    state: SubscriptionState = SubscriptionState.CREATING
    position: StartPosition = "earliest"
    kind: SubscriptionKind = SubscriptionKind.SUBSCRIPTION
    session_grace_s: float = Field(default=DEFAULT_GRACE_S, alias="sessionGraceS", gt=0)
    finished_segments: tuple[int, ...] = Field(default=(), alias="finishedSegments")
    positions: dict[str, int] = Field(default_factory=dict)
    created_at_ms: int = Field(default_factory=lambda: int(time.time() * 1000), alias="createdAtMs")
    # the principal that created it, when authentication was on: it may delete it with
    # ``consume`` alone (a console consumer's temporary subscription), others need admin
    owner: str | None = None
    # the request id of the create that made it: that create sent again (a retry whose
    # answer was lost) finishes it instead of being refused as a duplicate
    created_by: str | None = Field(default=None, alias="createdBy")

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    def finishing(self, segment: int) -> SubscriptionMetadata:
        done = tuple(sorted({*self.finished_segments, segment}))
        positions = {k: v for k, v in self.positions.items() if k != str(segment)}
        return self.model_copy(update={"finished_segments": done, "positions": positions})

    @classmethod
    def from_bytes(cls, data: bytes) -> SubscriptionMetadata:
        return cls.model_validate_json(data)


class ConsumerRegistration(BaseModel):
    """A stream consumer's durable session: its name and the segments it owns."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    consumer_name: str = Field(alias="consumerName")
    assigned_segments: tuple[int, ...] = Field(alias="assignedSegments")
    layout_epoch: int = Field(alias="layoutEpoch")
    # Of the assigned segments, those it holds only some key buckets of:
    # segment id -> (first bucket, bucket after the last, buckets per segment).
    assigned_buckets: dict[int, tuple[int, int, int]] = Field(
        default_factory=dict, alias="assignedBuckets"
    )


class AuthRecord(BaseModel):
    """The cluster's authentication policy: token digests and grants, never tokens.

    ``version`` grows with every change, so a process holding a copy can tell in
    one read whether it is current (and apply a rotation or revocation)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    version: int = Field(ge=1)
    updated_at_ms: int = Field(alias="updatedAtMs")
    # AuthPolicy.to_config(): digests only; None once authentication was turned off
    policy: dict[str, Any] | None = None

    def auth_policy(self) -> AuthPolicy:
        return AuthPolicy.from_config(self.policy) if self.policy is not None else AuthPolicy()


class LeaderRecord(BaseModel):
    """Who leads a topic's controller and at which fencing epoch."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    leader_epoch: int = Field(alias="leaderEpoch", ge=1)
    host: str = ""
    pid: int = 0
    since: float = 0.0
