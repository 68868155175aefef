"""Streaming reads planned by the cluster: what the admin service answers a Spark
streaming source (``runtime.stream_plan`` decides; this module gathers the facts).

Spark's driver keeps each micro-batch's position in its checkpoint and asks,
through the REST gateway, for a new query's first position, for the next
batch's end, and for the offset ranges between two positions with the address
of each segment's data plane, which its tasks then read directly. The layout
is read before the segments' offsets, so a segment the layout calls sealed has
already reported its final end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayActorError

from actors.guard import guard
from actors.segment.lookup import find_segment_actor, segment_position
from runtime.errors import (
    ConflictError,
    InconsistentRequestError,
    InvalidArgumentError,
    SegmentNotFoundError,
    SubscriptionNotFoundError,
    UnavailableError,
    UnavailableSegmentsError,
)
from runtime.layout import SegmentLayout
from runtime.names import SegmentName, TopicName
from runtime.remote import call
from runtime.stream_plan import (
    SegmentOffsets,
    StreamPosition,
    behind,
    initial_position,
    next_position,
    ranges_between,
)
from runtime.uris import redacted
from storage.catalog import Catalog
from storage.records import TopicRecord
from storage.tier import TieredSegment, open_tier
from storage.tier_records import TieredRecord, tier_records

SEGMENT_TIMEOUT_S = 10.0


async def stream_initial(
    catalog: Catalog,
    name: TopicName,
    starting: str | Mapping[str, int] | None,
    starting_time_ms: int | None = None,
) -> dict[str, Any]:
    """A new query's first position: from ``starting`` (default ``latest``), or at the
    first record published at or after ``starting_time_ms`` in each segment."""
    if starting is not None and starting_time_ms is not None:
        raise InconsistentRequestError(
            "startingOffsets and startingTimestampMs exclude each other: give one of them"
        )
    record = catalog.require_topic(name)
    # From the earliest, a segment that does not answer now starts at 0: whether the
    # query may go on without it is failOnDataLoss's call, at its first batch.
    earliest = starting == "earliest"
    offsets = await _offsets(name, record, required=not earliest)
    if earliest:
        offsets = {s: offsets.get(s, SegmentOffsets(0, 0)) for s in record.layout.all_segments}
    if starting_time_ms is not None:
        chosen: str | dict[int, int] = await _offsets_at_time(name, record, starting_time_ms)
    elif starting is None or isinstance(starting, str):
        chosen = starting or "latest"
    else:
        chosen = _by_id(starting)
    position = initial_position(str(name), record.incarnation, record.layout, offsets, chosen)
    return {"position": position.to_dict()}


async def stream_latest(
    catalog: Catalog,
    name: TopicName,
    start: Mapping[str, Any],
    max_messages: int | None,
    until: Mapping[str, Any] | None,
    fail_on_data_loss: bool,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    record = catalog.require_topic(name)
    first = _position(name, record, start)
    last = _position(name, record, until) if until is not None else None
    offsets = await _offsets(name, record, required=False, skip=first.finished)
    plan = next_position(
        first,
        record.layout,
        offsets,
        max_messages=max_messages,
        max_bytes=max_bytes,
        until=last,
        fail_on_data_loss=fail_on_data_loss,
    )
    return {
        "end": plan.position.to_dict(),
        "warnings": plan.warnings,
        "records": plan.records,
        "segments": plan.segments,
        "available": plan.available,
        "behind": {str(s): n for s, n in behind(plan.position, offsets).items()},
    }


async def stream_ranges(
    catalog: Catalog,
    name: TopicName,
    start: Mapping[str, Any],
    end: Mapping[str, Any],
    fail_on_data_loss: bool = True,
) -> dict[str, Any]:
    record = catalog.require_topic(name)
    first, last = _position(name, record, start), _position(name, record, end)
    offsets = await _offsets(name, record, required=False, skip=first.finished)
    ranges = ranges_between(first, last, offsets)
    gone = [r.segment_id for r in ranges if r.segment_id not in record.layout.all_segments]
    warnings = []
    if gone and fail_on_data_loss:
        raise UnavailableSegmentsError(
            f"{name}: segments {gone} were deleted (retention) before this batch read them "
            "(failOnDataLoss=false skips them)",
            gone,
        )
    if gone:
        warnings.append(f"segments {gone} were deleted before this batch read them: skipped")
        ranges = [r for r in ranges if r.segment_id not in gone]
    endpoints = await asyncio.gather(
        *(_endpoint(name, record.layout, r.segment_id) for r in ranges)
    )
    return {
        "ranges": [
            {
                "segmentId": r.segment_id,
                "descriptor": record.layout.get(r.segment_id).name(name).descriptor,
                "from": r.start,
                "to": r.end,
                "endpoint": endpoint,
            }
            for r, endpoint in zip(ranges, endpoints, strict=True)
        ],
        "warnings": warnings,
    }


async def stream_endpoint(catalog: Catalog, name: TopicName, segment_id: int) -> dict[str, Any]:
    """Where a segment's data plane listens now (a reader reconnecting after a restart)."""
    layout = catalog.require_topic(name).layout
    if segment_id not in layout.all_segments:
        raise SegmentNotFoundError(f"{name} has no segment {segment_id}")
    return await _endpoint(name, layout, segment_id)


# --- internals ---------------------------------------------------------------------------


def _position(name: TopicName, record: TopicRecord, data: Mapping[str, Any]) -> StreamPosition:
    position = StreamPosition.from_dict(data)
    if position.topic != str(name):
        raise ConflictError(f"the position is of {position.topic}, not of {name}")
    if position.incarnation != record.incarnation:
        raise ConflictError(
            f"the position is of an earlier {name} (incarnation {position.incarnation}), "
            f"deleted since; the topic now is incarnation {record.incarnation}: start the "
            "query afresh (a new checkpoint location)"
        )
    return position


def _by_id(starting: Mapping[str, int]) -> dict[int, int]:
    try:
        return {int(k): v for k, v in starting.items()}
    except ValueError:
        raise InvalidArgumentError(
            f"startingOffsets keys are segment ids, got {sorted(starting)}"
        ) from None


async def _offsets(
    name: TopicName, record: TopicRecord, *, required: bool, skip: Collection[int] = ()
) -> dict[int, SegmentOffsets]:
    """Each segment's retained start and end (but those in ``skip``, already read to their
    end); one that does not answer is left out (the planner decides what that means),
    or, when ``required``, refused here."""
    ids = [s for s in record.layout.all_segments if s not in skip]
    facts = await segment_facts(name, record, ids, timeout_s=SEGMENT_TIMEOUT_S)
    missing = [s for s in ids if s not in facts]
    if missing and required:
        raise UnavailableSegmentsError(
            f"{name}: segments {missing} did not answer (their actors died for good, or "
            f"none ran within {SEGMENT_TIMEOUT_S:g}s)",
            missing,
        )
    return {s: f.offsets for s, f in facts.items()}


@dataclass(frozen=True)
class SegmentFacts:
    """What a planner learns of a segment: the offsets it holds, a subscription's cursor
    in it when one was asked for, and its tier record when it moved to the tier."""

    offsets: SegmentOffsets
    cursor: int | None = None
    tiered: TieredRecord | None = None


async def segment_facts(
    name: TopicName,
    record: TopicRecord,
    ids: Collection[int],
    *,
    timeout_s: float,
    subscription: str | None = None,
) -> dict[int, SegmentFacts]:
    """The facts of each of ``ids``, asked of all at once; one whose actor died for good,
    or did not answer within ``timeout_s`` (restarts ridden out), is left out. A tiered
    segment's come from its record: asking must not wake it."""
    tiered = await _tiered(name, record, ids)
    asked = [s for s in ids if s not in tiered]
    deadline = time.monotonic() + timeout_s
    answers = await asyncio.gather(
        *(_status(record.layout.get(s).name(name), subscription, deadline) for s in asked)
    )
    facts = {s: _recorded(tiered[s], subscription) for s in ids if s in tiered}
    for segment_id, status in zip(asked, answers, strict=True):
        if status is not None:
            offsets = SegmentOffsets(
                status["startOffset"], status["endOffset"], status.get("sizeBytes", 0)
            )
            facts[segment_id] = SegmentFacts(offsets, status.get("position"))
    return facts


async def _tiered(
    name: TopicName, record: TopicRecord, ids: Collection[int]
) -> dict[int, TieredRecord]:
    """The records of those of ``ids`` that are tiered (one listing, then one read each)."""
    records = tier_records(name, record.incarnation)
    found = set(await asyncio.to_thread(records.segment_ids)) & set(ids)
    read = await asyncio.gather(*(asyncio.to_thread(records.get, s) for s in found))
    return {s: r for s, r in zip(found, read, strict=True) if r is not None}


def _recorded(record: TieredRecord, subscription: str | None) -> SegmentFacts:
    """What the segment's actor would answer, from its tier record."""
    offsets = SegmentOffsets(record.start_offset, record.end_offset, record.size_bytes)
    if subscription is None:
        return SegmentFacts(offsets, tiered=record)
    cursor = record.cursors.get(subscription)
    if cursor is None:
        raise SubscriptionNotFoundError(f"subscription {subscription!r} does not exist")
    return SegmentFacts(offsets, max(cursor["mark_delete"], record.start_offset), record)


async def _status(
    segment: SegmentName, subscription: str | None, deadline: float
) -> dict[str, Any] | None:
    """The segment actor's ``position`` answer; None once it died for good or did not
    answer by ``deadline`` (restarts waited through). None is ever created: a recreated
    actor over lost storage would answer for data it does not have."""
    try:
        return await segment_position(
            segment, subscription, deadline, unless_dead=True, credential=guard().internal_token()
        )
    except (SegmentNotFoundError, TimeoutError, RayActorError):
        return None


async def _offsets_at_time(name: TopicName, record: TopicRecord, time_ms: int) -> dict[int, int]:
    """Each segment's first offset published at or after ``time_ms``: a sealed segment
    that ended before it starts at its end, so it is finished at the first batch. A
    tiered segment's is sought in its file (its row groups' last times first)."""
    layout = record.layout
    tiered = await _tiered(name, record, list(layout.all_segments))

    async def ask(segment_id: int) -> int:
        if segment_id in tiered:
            return await asyncio.to_thread(_offset_in_tier, tiered[segment_id], time_ms)
        handle = await find_segment_actor(
            layout.get(segment_id).name(name),
            SEGMENT_TIMEOUT_S,
            unless_dead=True,
            credential=guard().internal_token(),
        )
        answer = handle.offset_at_time.remote(time_ms, credential=guard().internal_token())
        return await call(answer)

    ids = list(layout.all_segments)
    found = await asyncio.gather(*(ask(s) for s in ids))
    return dict(zip(ids, found, strict=True))


def _offset_in_tier(record: TieredRecord, time_ms: int) -> int:
    try:
        filesystem, _ = open_tier(record.uri)
        return TieredSegment(filesystem, record.directory).offset_at_time(time_ms)
    except (OSError, UnavailableError) as err:
        segment_id = record.info.segment_id
        reason = str(err).replace(record.uri, redacted(record.uri))
        raise UnavailableSegmentsError(
            f"segment {segment_id}'s tier could not be read: {reason}", [segment_id]
        ) from None


async def _endpoint(name: TopicName, layout: SegmentLayout, segment_id: int) -> dict[str, Any]:
    """A segment of the layout whose actor does not answer now (it is restarting, or
    starting after a split) is unavailable (503, asked again), not unknown (404)."""
    try:
        handle = await find_segment_actor(
            layout.get(segment_id).name(name),
            SEGMENT_TIMEOUT_S,
            unless_dead=True,
            credential=guard().internal_token(),
        )
        endpoint = await call(handle.data_endpoint.remote(credential=guard().internal_token()))
    except (SegmentNotFoundError, RayActorError) as err:
        raise UnavailableError(f"segment {segment_id} of {name} is not served now: {err}") from None
    return {"host": endpoint.host, "port": endpoint.port, "tls": endpoint.tls}
