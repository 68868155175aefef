"""Snapshot reads planned by the cluster: what Spark's ``read_topic`` and Ray Data's
``read_topic_dataset`` ask the admin service for (``clients.read_plan``), decided by
``runtime.stream_plan`` from the same facts as a streaming query's micro-batches
(``actors.admin.stream_reads``).

The layout is read from the metadata store first, then every segment the snapshot
needs is asked at once for its offsets (and a subscription's cursor), so a segment the
layout calls active but a split sealed meanwhile is read to its final end, and a child
registered after the layout read is not read at all. A tiered segment's facts come from
its record, so planning wakes no hibernating segment, and its ranges name the tier's
file, which the reader opens with its own access to the tier.

Completeness (no silent partial results): a listed segment whose actor died for good,
or did not answer within the caller's ``unavailable_timeout_s`` (restarts are waited
through), is *missing*, unless the layout no longer lists it when planning ends (pruned
by retention meanwhile, so no longer part of the topic). Missing segments refuse the
plan with ``UnavailableSegmentsError`` naming each of them, unless the caller allows a
partial read; the plan then names them, and the reader says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.admin.stream_reads import SegmentFacts, segment_facts
from runtime.errors import InvalidArgumentError, UnavailableSegmentsError
from runtime.names import TopicName
from runtime.stream_plan import (
    StreamPosition,
    initial_position,
    snapshot_ranges,
    snapshot_segments,
)
from storage.catalog import Catalog
from storage.records import TopicRecord
from storage.tier import RECORDS_FILE
from storage.tier_records import TieredRecord


async def plan_snapshot(
    catalog: Catalog,
    name: TopicName,
    start: Any,
    end: Any,
    subscription: str | None,
    timeout_s: float,
    allow_partial: bool,
) -> dict[str, Any]:
    """The ranges of a snapshot from ``start`` (``"earliest"``, a position, or a
    subscription's cursors) to ``end`` (``"latest"``: what each segment holds now, or
    a position): ``{"epoch", "ranges": [{"segmentId", "segment", "from", "to",
    "tier"}], "missing": [segment ids]}``."""
    if subscription is not None and start != "earliest":
        raise InvalidArgumentError("pass either subscription= or start=, not both")
    record = catalog.require_topic(name)
    layout = record.layout
    first = _bound(name, record, "start", start, "earliest")
    last = _bound(name, record, "end", end, "latest")
    wanted = snapshot_segments(layout, first, last)
    facts = await segment_facts(
        name, record, wanted, timeout_s=timeout_s, subscription=subscription
    )
    missing = _still_listed(catalog, name, [s for s in wanted if s not in facts])
    if missing and not allow_partial:
        raise UnavailableSegmentsError(
            f"{name}: segments {missing} are listed in the layout (epoch {layout.epoch}) but "
            f"no segment actor served them within {timeout_s:g}s; pass allow_partial=True "
            "to read the others",
            missing,
        )
    offsets = {s: f.offsets for s, f in facts.items()}
    if subscription is not None:
        cursors = {s: f.cursor for s, f in facts.items() if f.cursor is not None}
        first = StreamPosition(str(name), record.incarnation, cursors)
    elif first is None:
        first = initial_position(str(name), record.incarnation, layout, offsets, "earliest")
    ranges = snapshot_ranges(first, last, layout, offsets)
    return {
        "epoch": layout.epoch,
        "ranges": [
            {
                "segmentId": r.segment_id,
                "segment": str(layout.get(r.segment_id).name(name)),
                "from": r.start,
                "to": r.end,
                "tier": _tier_file(facts[r.segment_id]),
            }
            for r in ranges
        ],
        "missing": missing,
    }


def _bound(
    name: TopicName, record: TopicRecord, label: str, bound: Any, word: str
) -> StreamPosition | None:
    """``None`` for ``word``; else the position ``bound`` gives (``{"next": {segment id:
    offset}, "finished": [segment ids]}``, a checkpoint's), in this incarnation."""
    if bound == word:
        return None
    if not isinstance(bound, Mapping):
        raise InvalidArgumentError(
            f"{label} must be {word!r} or a position {{'next': ..., 'finished': ...}}, "
            f"got {bound!r}"
        )
    return StreamPosition.from_dict(
        {**bound, "topic": str(name), "incarnation": record.incarnation}
    )


def _still_listed(catalog: Catalog, name: TopicName, silent: list[int]) -> list[int]:
    """Of the segments that did not answer, those the layout still lists."""
    if not silent:
        return []
    current = catalog.require_topic(name).layout.all_segments
    return sorted(s for s in silent if s in current)


def _tier_file(facts: SegmentFacts) -> dict[str, Any] | None:
    record: TieredRecord | None = facts.tiered
    if record is None:
        return None
    return {
        "uri": record.uri,
        "path": f"{record.directory}/{RECORDS_FILE}",
        "start": record.start_offset,
        "end": record.end_offset,
        "format": record.tier_format,
    }
