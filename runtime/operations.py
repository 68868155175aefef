"""Layout operations as data: planned, recorded, then carried out step by step.

The controller writes the operation into the topic record *before* touching
any segment, so a controller that dies half-way has a written plan that its
next incarnation can finish. Every step is idempotent; the final step is the
one compare-and-swap that applies the layout change and clears the plan in
the same write, so "applied" and "no longer pending" can never disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import InvalidArgumentError
from runtime.layout import SegmentLayout
from runtime.names import SegmentName, TopicName


class OperationKind(StrEnum):
    """What a topic's controller carries out, recorded before its first step."""

    CREATE = "create"
    SPLIT = "split"
    MERGE = "merge"
    DELETE = "delete"
    PRUNE = "prune"


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )


class PlannedSegment(_Model):
    segment_id: int = Field(alias="segmentId")
    start: int
    end: int

    def name(self, topic: TopicName) -> SegmentName:
        return topic.segment(self.segment_id, self.start, self.end)


class PendingOperation(_Model):
    kind: OperationKind
    request_id: str = Field(alias="requestId")
    parents: tuple[int, ...] = ()
    children: tuple[PlannedSegment, ...] = ()
    base_epoch: int = Field(alias="baseEpoch")


class CompletedOperation(_Model):
    kind: OperationKind
    request_id: str = Field(alias="requestId")
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    epoch: int


def plan_split(
    layout: SegmentLayout,
    segment_id: int,
    request_id: str,
    at: int | Sequence[int] | None = None,
    parts: int | None = None,
) -> PendingOperation:
    """Validate against ``layout`` (raising the layout's typed errors) and plan; the
    children's ranges (``at``: where the children after the first start; ``parts``: how
    many near-equal ones) are part of the plan."""
    after = layout.split_segment(segment_id, at, parts)
    return _plan(OperationKind.SPLIT, layout, after, (segment_id,), request_id)


def plan_merge(
    layout: SegmentLayout,
    segment_id1: int,
    segment_id2: int,
    request_id: str,
    more: Sequence[int] = (),
) -> PendingOperation:
    """``more``: further neighbours merged with the two in the same operation."""
    after = layout.merge_segments(segment_id1, segment_id2, *more)
    parents = tuple(
        sorted((segment_id1, segment_id2, *more), key=lambda i: layout.get(i).hash_range.start)
    )
    return _plan(OperationKind.MERGE, layout, after, parents, request_id)


def plan_prune(layout: SegmentLayout, segment_ids: list[int], request_id: str) -> PendingOperation:
    """Plan retention's removal of sealed roots, in the order they can go."""
    _prune_all(layout, tuple(segment_ids))  # validates every step now, before anything runs
    return PendingOperation(
        kind=OperationKind.PRUNE,
        request_id=request_id,
        parents=tuple(segment_ids),
        base_epoch=layout.epoch,
    )


def _prune_all(layout: SegmentLayout, segment_ids: tuple[int, ...]) -> SegmentLayout:
    for segment_id in segment_ids:
        layout = layout.prune_segment(segment_id)
    return layout


def apply_operation(layout: SegmentLayout, op: PendingOperation) -> SegmentLayout:
    """The layout after ``op``; refuses to apply a plan made for another epoch."""
    if layout.epoch != op.base_epoch:
        raise InvalidArgumentError(
            f"operation {op.request_id} was planned at epoch {op.base_epoch}, "
            f"the layout is at {layout.epoch}"
        )
    if op.kind == OperationKind.SPLIT:  # where the plan starts each child, not a midpoint
        starts = [child.start for child in op.children[1:]]
        return layout.split_segment(op.parents[0], starts or None)
    if op.kind == OperationKind.MERGE:
        return layout.merge_segments(*op.parents)
    if op.kind == OperationKind.PRUNE:
        return _prune_all(layout, op.parents)
    return layout


def new_request_id() -> str:
    """A fresh id for one caller's create, split or merge: every retry of it carries the
    same id, so it is applied once (the clients make it; the admin service and the
    controller only when a caller sent none)."""
    return uuid.uuid4().hex


def checked_request_id(given: object) -> str:
    """A caller's request id as given (1 to 64 characters), else a fresh one."""
    if given is None:
        return new_request_id()
    if not isinstance(given, str) or not 1 <= len(given) <= 64:
        raise InvalidArgumentError("request_id must be a string of 1 to 64 characters")
    return given


# How many completed splits and merges a topic remembers for retries: a caller whose
# answer was lost retries within seconds, while other callers may split meanwhile.
REMEMBERED_OPERATIONS = 64


def remembered(
    earlier: tuple[CompletedOperation, ...], done: CompletedOperation
) -> tuple[CompletedOperation, ...]:
    """``earlier`` with ``done`` added last, the oldest dropped beyond the bound."""
    return (*earlier, done)[-REMEMBERED_OPERATIONS:]


def find_completed(
    operations: tuple[CompletedOperation, ...], request_id: str
) -> CompletedOperation | None:
    """The completed operation of ``request_id``, if it is remembered: a retry of it is
    answered with it instead of being applied again."""
    return next((op for op in reversed(operations) if op.request_id == request_id), None)


def completed(op: PendingOperation, epoch: int) -> CompletedOperation:
    return CompletedOperation(
        kind=op.kind,
        request_id=op.request_id,
        parents=op.parents,
        children=tuple(c.segment_id for c in op.children),
        epoch=epoch,
    )


def _plan(
    kind: OperationKind,
    before: SegmentLayout,
    after: SegmentLayout,
    parents: tuple[int, ...],
    request_id: str,
) -> PendingOperation:
    new_ids = sorted(set(after.all_segments) - set(before.all_segments))
    children = tuple(
        PlannedSegment(
            segment_id=i,
            start=after.all_segments[i].hash_range.start,
            end=after.all_segments[i].hash_range.end,
        )
        for i in new_ids
    )
    return PendingOperation(
        kind=kind,
        request_id=request_id,
        parents=parents,
        children=children,
        base_epoch=before.epoch,
    )
