"""Read planning over a topic's segment DAG: Spark Structured Streaming's micro-batches,
and the snapshot reads of Spark's ``read_topic`` and Ray Data.

A streaming query reads a topic as a sequence of micro-batches, each from one
``StreamPosition`` to the next. Spark keeps the positions in its checkpoint
location as opaque JSON and asks the cluster (through the REST gateway) for the
next one, then for the offset ranges between two of them; this module decides
both, from the layout and each segment's offsets, without touching Ray.

The rules that keep every key's order across splits and merges:

- A segment becomes *readable* only once every parent is *finished* in the
  batch's start position (read to its sealed end). So a child is never read in
  the batch that finishes its parents, only in a later one: ordering batches
  orders each key.
- A sealed segment read to its end becomes finished; an active one never does.
- A segment not yet in a position starts at offset 0 when it becomes readable
  (the ``earliest`` start resolves every segment it sees to what is retained).
  Anything missing before where a read must start (retention deleted it), or a
  segment that cannot be reached, is *data loss*: refused with
  ``UnavailableSegmentsError`` when ``fail_on_data_loss``, else skipped for good
  with a warning (an unreachable segment then counts as read), as Spark's Kafka
  source does.

A snapshot read is planned with the same positions: it reads from a start
position (``earliest``, a checkpoint, a subscription's cursors) to where every
segment stands when it is planned (``snapshot_end``) or to an end checkpoint,
parents and children in one batch of ranges: every key's records in it are a prefix
of the key's history, since the parents of every child the layout lists are sealed,
so read to their final end.

Positions name the topic's incarnation: a topic deleted and created again under
the same name is another topic, and an old query's position does not apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import (
    ConflictError,
    InconsistentRequestError,
    InvalidArgumentError,
    SegmentNotFoundError,
    UnavailableSegmentsError,
)
from runtime.layout import SegmentLayout

EARLIEST, LATEST = -2, -1  # in a JSON of per-segment starting offsets, as Kafka's


@dataclass(frozen=True)
class SegmentOffsets:
    """What a segment holds now: ``[start, end)`` (``start`` moves with retention), in
    ``bytes`` as stored (0: not known)."""

    start: int
    end: int
    bytes: int = 0


@dataclass(frozen=True)
class StreamPosition:
    """Where a query stands: the next offset of each segment it reads, and the sealed
    segments it has read to their end."""

    topic: str
    incarnation: str
    next: Mapping[int, int] = field(default_factory=dict)
    finished: frozenset[int] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "incarnation": self.incarnation,
            "next": {str(k): v for k, v in sorted(self.next.items())},
            "finished": sorted(self.finished),
        }

    def to_json(self) -> str:
        """Canonical: equal positions have equal JSON (Spark compares offsets as text)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> StreamPosition:
        try:
            if set(data) != {"topic", "incarnation", "next", "finished"}:
                raise ValueError("fields topic, incarnation, next, finished")
            position = cls(
                str(data["topic"]),
                str(data["incarnation"]),
                {_id(k): _offset(v) for k, v in data["next"].items()},
                frozenset(_id(s) for s in data["finished"]),
            )
        except (TypeError, ValueError, AttributeError) as err:
            raise InvalidArgumentError(f"not a stream position: {err}") from None
        if set(position.next) & position.finished:
            raise InconsistentRequestError(
                "not a stream position: a segment both read and finished"
            )
        return position

    def offset(self, segment_id: int) -> int:
        """Where reading ``segment_id`` resumes (0 for one not reached yet)."""
        return self.next.get(segment_id, 0)


@dataclass(frozen=True)
class Range:
    """Records ``[start, end)`` of one segment, read by one Spark task."""

    segment_id: int
    start: int
    end: int


@dataclass
class Plan:
    """A micro-batch's end position (or ranges), and what it had to skip. ``records``: how
    many the batch reads, from ``segments`` segments; ``available``: how many it would
    read under no record limit (Spark's ``minOffsetsPerTrigger`` waits on it)."""

    position: StreamPosition
    ranges: list[Range] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    records: int = 0
    segments: int = 0
    available: int = 0


def initial_position(
    topic: str,
    incarnation: str,
    layout: SegmentLayout,
    offsets: Mapping[int, SegmentOffsets],
    starting: str | Mapping[int, int],
) -> StreamPosition:
    """A new query's start: ``earliest`` (all that is retained), ``latest`` (only what is
    produced from now on), or per-segment offsets (``EARLIEST``/``LATEST`` allowed;
    a listed segment's ancestors count as read, any other segment starts at its
    earliest)."""
    if starting == "earliest":
        return StreamPosition(topic, incarnation, {s: offsets[s].start for s in offsets})
    if starting == "latest":
        done = {s for s, info in layout.all_segments.items() if not info.is_active}
        return StreamPosition(
            topic, incarnation, {s: offsets[s].end for s in offsets if s not in done}, done
        )
    if isinstance(starting, str):
        raise InvalidArgumentError(
            f"startingOffsets must be 'earliest', 'latest' or a JSON object of segment id to "
            f"offset, got {starting!r}"
        )
    return _from_offsets(topic, incarnation, layout, offsets, starting)


def _from_offsets(
    topic: str,
    incarnation: str,
    layout: SegmentLayout,
    offsets: Mapping[int, SegmentOffsets],
    starting: Mapping[int, int],
) -> StreamPosition:
    unknown = sorted(set(starting) - set(layout.all_segments))
    if unknown:
        raise SegmentNotFoundError(
            f"startingOffsets names segments {unknown} that {topic} does not have; "
            f"it has {sorted(layout.all_segments)}"
        )
    chosen: dict[int, int] = {}
    for segment_id, offset in starting.items():
        held = offsets[segment_id]
        if offset == EARLIEST:
            offset = held.start
        elif offset == LATEST:
            offset = held.end
        if not held.start <= offset <= held.end:
            raise ConflictError(
                f"startingOffsets: segment {segment_id} holds offsets {held.start} to {held.end}, "
                f"not {offset} (-2: earliest, -1: latest)"
            )
        chosen[segment_id] = offset
    done = set().union(*(_ancestors(layout, s) for s in chosen)) - set(chosen)
    rest = {s: offsets[s].start for s in offsets if s not in chosen and s not in done}
    return StreamPosition(topic, incarnation, {**rest, **chosen}, frozenset(done))


def next_position(
    start: StreamPosition,
    layout: SegmentLayout,
    offsets: Mapping[int, SegmentOffsets],
    *,
    max_messages: int | None = None,
    max_bytes: int | None = None,
    until: StreamPosition | None = None,
    fail_on_data_loss: bool = True,
) -> Plan:
    """The end of the micro-batch that starts at ``start``: every readable segment up to
    what it holds now (or up to ``until``, a position captured earlier, for Spark's
    ``Trigger.AvailableNow``), at most ``max_messages`` records in all, and about
    ``max_bytes`` bytes (``_byte_budget``)."""
    warnings: list[str] = []
    planned: dict[int, tuple[int, int]] = {}
    unreachable: list[int] = []
    for segment_id in _readable(start, layout):
        first = _first_offset(start, segment_id, offsets, fail_on_data_loss, warnings)
        if first is None:
            unreachable.append(segment_id)  # skipped for good (failOnDataLoss=false)
            continue
        last = offsets[segment_id].end
        if until is not None:
            last = min(last, _limit_in(until, segment_id, offsets))
        planned[segment_id] = (first, max(first, last))
    available = _records(planned)
    if max_bytes is not None:
        records = _byte_budget(planned, offsets, max_bytes)
        max_messages = records if max_messages is None else min(max_messages, records)
    if max_messages is not None:
        planned = _capped(planned, max_messages)
    next_offsets = dict(start.next)
    finished = set(start.finished)
    for segment_id, (_, last) in planned.items():
        if _read_to_end(layout, offsets, segment_id, last):
            next_offsets.pop(segment_id, None)
            finished.add(segment_id)
        else:
            next_offsets[segment_id] = last
    for segment_id in [*_vanished(start, layout), *unreachable]:  # nothing more to read
        next_offsets.pop(segment_id, None)
        finished.add(segment_id)
    position = StreamPosition(start.topic, start.incarnation, next_offsets, frozenset(finished))
    return Plan(
        position,
        warnings=warnings,
        records=_records(planned),
        segments=sum(1 for first, last in planned.values() if last > first),
        available=available,
    )


def behind(position: StreamPosition, offsets: Mapping[int, SegmentOffsets]) -> dict[int, int]:
    """The records each segment holds past ``position`` (Spark's "offsets behind latest"):
    every segment it has not finished, one not reached yet from its first retained record,
    children waiting for their parents included, since the query reads them all in the
    end."""
    return {
        s: max(0, held.end - max(position.offset(s), held.start))
        for s, held in sorted(offsets.items())
        if s not in position.finished
    }


def _byte_budget(
    planned: Mapping[int, tuple[int, int]], offsets: Mapping[int, SegmentOffsets], max_bytes: int
) -> int:
    """The records that ``max_bytes`` buys in the planned segments, at their mean stored
    record size (what a segment's bytes and records say); never fewer than one, so a
    record larger than the budget still gets read. An estimate, as a file source's
    ``maxBytesPerTrigger`` is: records differ in size, and a segment's size counts its
    framing and compression."""
    held = [offsets[s] for s in planned if offsets[s].end > offsets[s].start]
    records = sum(o.end - o.start for o in held)
    stored = sum(o.bytes for o in held)
    if records == 0 or stored == 0:
        return max(1, _records(planned))  # nothing to go by: the byte cap does not apply
    return max(1, max_bytes * records // stored)


def _records(planned: Mapping[int, tuple[int, int]]) -> int:
    return sum(last - first for first, last in planned.values())


def ranges_between(
    start: StreamPosition, end: StreamPosition, offsets: Mapping[int, SegmentOffsets]
) -> list[Range]:
    """The records one micro-batch reads: each segment from where ``start`` has it to where
    ``end`` has it; a segment ``end`` finished is read to its sealed (so fixed) end in
    ``offsets``. Where retention deleted the start, the reader finds the gap."""
    if (start.topic, start.incarnation) != (end.topic, end.incarnation):
        raise InconsistentRequestError("the two positions are of different topics or incarnations")
    behind = sorted(s for s in start.finished - end.finished) + sorted(
        s for s, last in end.next.items() if last < start.offset(s)
    )
    if behind:
        raise InconsistentRequestError(f"the end position is behind the start on segments {behind}")
    ends = dict(end.next)
    ends.update({s: offsets[s].end for s in end.finished - start.finished if s in offsets})
    return [
        Range(s, start.offset(s), last)
        for s, last in sorted(ends.items())
        if last > start.offset(s)
    ]


# --- snapshots: a read between two positions fixed when it is planned -------------------


def snapshot_segments(
    layout: SegmentLayout, start: StreamPosition | None, end: StreamPosition | None
) -> list[int]:
    """The segments a snapshot from ``start`` to ``end`` may read (``None``: from the
    earliest, to what the topic holds now): those ``start`` has not finished, and of
    those, with an ``end``, only what it reached beyond ``start``."""
    wanted = []
    for segment_id in sorted(layout.all_segments):  # ids grow down the DAG
        if start is not None and segment_id in start.finished:
            continue
        first = start.offset(segment_id) if start is not None else 0
        if end is None or segment_id in end.finished or end.next.get(segment_id, 0) > first:
            wanted.append(segment_id)
    return wanted


def snapshot_end(
    start: StreamPosition, layout: SegmentLayout, offsets: Mapping[int, SegmentOffsets]
) -> StreamPosition:
    """Where a snapshot taken now ends: every segment that answered at its end offset, a
    sealed one finished (its end is final). A child that a split registers after the
    layout was read is not in it, and its parent, sealed by then, is read to its final
    end, so each key's records in the snapshot are a prefix of its history."""
    sealed = {s for s in offsets if not layout.get(s).is_active}
    finished = start.finished | sealed
    ends = {s: held.end for s, held in offsets.items() if s not in finished}
    return StreamPosition(start.topic, start.incarnation, ends, frozenset(finished))


def snapshot_ranges(
    start: StreamPosition,
    end: StreamPosition | None,
    layout: SegmentLayout,
    offsets: Mapping[int, SegmentOffsets],
) -> list[Range]:
    """The records of a snapshot from ``start`` to ``end`` (``None``: ``snapshot_end``)
    in the segments of ``offsets`` (those that answered; the others are the caller's to
    report missing), each segment's range from where ``start`` has it or, when retention
    has deleted that, from what it still holds: a snapshot reads what is retained (the
    readers skip deleted offsets alike), where a streaming query calls the gap data loss."""
    past = sorted(s for s, held in offsets.items() if start.offset(s) > held.end)
    if past:
        raise ConflictError(
            f"the start is past the end of segments {past} (a checkpoint of another topic, "
            "or of an earlier topic of this name)"
        )
    last = snapshot_end(start, layout, offsets) if end is None else end
    retained = []
    for r in ranges_between(start, last, offsets):
        held = offsets.get(r.segment_id)
        first = r.start if held is None else max(r.start, held.start)
        if held is not None and r.end > first:
            retained.append(Range(r.segment_id, first, r.end))
    return retained


# --- internals ---------------------------------------------------------------------------


def _readable(start: StreamPosition, layout: SegmentLayout) -> list[int]:
    """``SegmentLayout.readable`` once ``start``'s finished segments are read."""
    return [info.segment_id for info in layout.readable(start.finished)]


def _vanished(start: StreamPosition, layout: SegmentLayout) -> list[int]:
    return [s for s in start.next if s not in layout.all_segments]


def _first_offset(
    start: StreamPosition,
    segment_id: int,
    offsets: Mapping[int, SegmentOffsets],
    fail_on_data_loss: bool,
    warnings: list[str],
) -> int | None:
    """Where the segment's next read starts; data it should have had but no longer has is
    refused or skipped with a warning."""
    wanted = start.offset(segment_id)
    held = offsets.get(segment_id)
    if held is None:
        _lost(f"segment {segment_id} did not answer", segment_id, fail_on_data_loss, warnings)
        return None
    if wanted > held.end:
        raise ConflictError(
            f"the position is past the end of segment {segment_id}: offset {wanted}, "
            f"end {held.end} (a position of another topic, or made up)"
        )
    if wanted < held.start:
        _lost(
            f"segment {segment_id} no longer holds offsets {wanted} to {held.start - 1} "
            "(deleted by retention)",
            segment_id,
            fail_on_data_loss,
            warnings,
        )
        return held.start
    return wanted


def _lost(why: str, segment_id: int, fail: bool, warnings: list[str]) -> None:
    if fail:
        raise UnavailableSegmentsError(
            f"{why}; the query cannot read what it must (failOnDataLoss=false skips it)",
            [segment_id],
        )
    warnings.append(f"{why}: skipped (failOnDataLoss=false)")


def _limit_in(until: StreamPosition, segment_id: int, offsets: Mapping[int, SegmentOffsets]) -> int:
    """How far ``until`` had got in the segment (nothing of one it had not reached)."""
    if segment_id in until.finished:
        return offsets[segment_id].end
    return until.next.get(segment_id, 0)


def _capped(planned: dict[int, tuple[int, int]], budget: int) -> dict[int, tuple[int, int]]:
    """At most ``budget`` records, shared evenly (lowest segment ids first for the rest),
    so no segment starves while another has a large backlog."""
    wanting = {s: last - first for s, (first, last) in planned.items()}
    granted = dict.fromkeys(planned, 0)
    while budget > 0 and any(wanting.values()):
        takers = sorted(s for s, n in wanting.items() if n > 0)
        share = max(budget // len(takers), 1)
        for segment_id in takers:
            take = min(share, wanting[segment_id], budget)
            granted[segment_id] += take
            wanting[segment_id] -= take
            budget -= take
            if budget == 0:
                break
    return {s: (first, first + granted[s]) for s, (first, _) in planned.items()}


def _read_to_end(
    layout: SegmentLayout, offsets: Mapping[int, SegmentOffsets], segment_id: int, last: int
) -> bool:
    return not layout.get(segment_id).is_active and last >= offsets[segment_id].end


def _ancestors(layout: SegmentLayout, segment_id: int) -> set[int]:
    found: set[int] = set()
    pending = list(layout.get(segment_id).parent_ids)
    while pending:
        parent = pending.pop()
        if parent in found or parent not in layout.all_segments:
            continue
        found.add(parent)
        pending.extend(layout.get(parent).parent_ids)
    return found


def _id(value: Any) -> int:
    number = int(value)
    if str(number) != str(value) or number < 0:
        raise ValueError(f"segment id {value!r}")
    return number


def _offset(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"offset {value!r}")
    return value
