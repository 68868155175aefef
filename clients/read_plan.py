"""Snapshot reads of a whole topic, planned once and read range by range: what Spark's
``read_topic`` (``clients.spark``) and Ray Data's ``read_topic_dataset``
(``clients.ray_data``) share.

The plan
    ``read_topic`` / ``read_topic_dataset`` plan a *snapshot*: one read of the
    layout says which segments exist, and each of them is asked for its end
    offset once, so the result is fixed when the call returns however long
    Spark takes to run it (re-evaluating the DataFrame re-reads the same
    immutable offset ranges). A segment created by a split after that layout
    read is not part of the snapshot, and its sealed parent is read to its
    final end, so every record is read exactly once and every key's records
    form a prefix of its history. Each offset range is read straight from its
    segment actor as Arrow batches, by Ray Data read tasks or by Spark tasks
    on the executors (Ray actors themselves), never through the driver.

Completeness (no silent partial results)
    Every segment the layout lists must be served. A listed segment whose
    actor cannot be reached within ``unavailable_timeout_s`` (dead and not
    restarting, or restarting too slowly) makes the read raise
    ``UnavailableSegmentsError`` naming every such segment; one that was pruned
    from the layout meanwhile is no longer required. Reading never creates a
    segment actor: a recreated actor over lost storage would serve an empty
    log as if it were the data. A segment that answers with fewer records
    than its snapshot end also raises, while the read runs.
    ``allow_partial=True`` returns what can be served, warns
    (``PartialReadWarning``) and records the missing ids on the result as
    ``result.missing_segments`` (an empty tuple on a complete read);
    ``result.read_plan`` is the whole plan.

Tiered segments
    A segment moved to the tier is planned from its record in the metadata store
    (``storage.tier_records``), not by asking its actor, so a hibernating segment is
    not woken: its range names the tier's Parquet file, and is read from there,
    by a Parquet scan in Spark or with ``pyarrow`` elsewhere, with no segment actor
    involved. The cluster still authorizes the read (the plan's layout read needs
    ``consume``); the files are then read with the reader's own access to the tier.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from actors.admin.caller import AdminServiceCaller
from actors.control.dag_watch import fetch_layout
from actors.segment.lookup import find_segment_actor
from clients._ray import background_loop
from clients.checkpoint_consumer import Checkpoint
from clients.range_reads import RESTART_ERRORS, RETRY_PAUSE_S, SegmentRange, TierFile
from runtime.auth import Permission, client_credential
from runtime.config import env_float
from runtime.connect import connect
from runtime.errors import (
    InvalidArgumentError,
    SegmentNotFoundError,
    SubscriptionNotFoundError,
    UnavailableSegmentsError,
)
from runtime.layout import SegmentInfo, SegmentLayout
from runtime.names import SegmentName, TopicName
from runtime.remote import call
from storage.tier import RECORDS_FILE
from storage.tier_records import TieredRecord

# How long a listed segment may stay unreachable (restarting) before a read gives up on it.
DEFAULT_UNAVAILABLE_TIMEOUT_S = env_float("RAYTOPICS_UNAVAILABLE_TIMEOUT_S", 20.0)
# Rows per read task / Spark partition: big enough to amortize a task, small enough
# that a large segment is read by several executors at once.
DEFAULT_ROWS_PER_PARTITION = 1_000_000
ROW_BYTES_ESTIMATE = 160  # ~100 B value plus key, offset, time, hash

Bound = Literal["earliest", "latest"] | Checkpoint | datetime | int


class PartialReadWarning(UserWarning):
    """A read asked for ``allow_partial=True`` and some listed segments were not served."""


# --- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadPlan:
    """What a snapshot read covers, fixed before any record is read."""

    topic: str
    epoch: int
    ranges: tuple[SegmentRange, ...]
    missing_segments: tuple[int, ...] = ()
    unavailable_timeout_s: float = DEFAULT_UNAVAILABLE_TIMEOUT_S

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranges)


@dataclass(frozen=True)
class _Wanted:
    """A segment the snapshot must read, with the bounds known before probing it."""

    info: SegmentInfo
    start: int
    end: int | None  # None: up to the end offset the probe reports


def plan_read(
    topic: str,
    *,
    start: Bound = "earliest",
    end: Bound = "latest",
    subscription: str | None = None,
    allow_partial: bool = False,
    unavailable_timeout_s: float | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    token: str | None = None,
) -> ReadPlan:
    """Fix the snapshot: one layout read, then every needed segment probed concurrently.

    Raises ``UnavailableSegmentsError`` naming every listed segment that did not
    answer, unless ``allow_partial``; then they are in ``missing_segments``. The
    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume``.
    """
    credential = client_credential(token)
    name = TopicName.parse(topic)
    start, end = (_at_time(name, bound, token) for bound in (start, end))
    _check_bounds(name, start, end, subscription, rows_per_partition)
    timeout_s = float(
        DEFAULT_UNAVAILABLE_TIMEOUT_S if unavailable_timeout_s is None else unavailable_timeout_s
    )
    connect()
    layout = checked_layout(name, credential, Permission.CONSUME)
    wanted = _wanted_segments(layout.all_segments.values(), start, end)
    tiered = _tiered_records(name, wanted, credential)
    asked = [w for w in wanted if w.info.segment_id not in tiered]
    answers = background_loop().run(_probe_all(name, asked, subscription, timeout_s, credential))
    found = dict(zip((w.info.segment_id for w in asked), answers, strict=True))
    found |= {i: _recorded_status(r, subscription) for i, r in tiered.items()}
    probes = [found[w.info.segment_id] for w in wanted]
    silent = [w.info.segment_id for w, p in zip(wanted, probes, strict=True) if p is None]
    missing = _still_listed(name, silent, credential)
    if missing and not allow_partial:
        raise UnavailableSegmentsError(
            f"{name}: segments {missing} are listed in the layout (epoch {layout.epoch}) but "
            f"no segment actor served them within {timeout_s:g}s; pass allow_partial=True "
            "to read the others",
            missing,
        )
    ranges = [
        piece
        for w, probe in zip(wanted, probes, strict=True)
        if probe is not None
        for piece in _split(
            _range_of(name, w, probe, subscription, tiered.get(w.info.segment_id)),
            rows_per_partition,
        )
    ]
    return ReadPlan(str(name), layout.epoch, tuple(ranges), tuple(missing), timeout_s)


def _at_time(name: TopicName, bound: Any, token: str | None) -> Any:
    """A time bound (an aware ``datetime``, epoch milliseconds) as the checkpoint of the
    first message published at or after it; any other bound as it is."""
    if isinstance(bound, datetime) or (isinstance(bound, int) and not isinstance(bound, bool)):
        return Checkpoint.at_timestamp(str(name), bound, token=token)
    return bound


def _check_bounds(
    name: TopicName, start: Any, end: Any, subscription: str | None, rows_per_partition: int
) -> None:
    for label, bound, word in (("start", start, "earliest"), ("end", end, "latest")):
        if isinstance(bound, Checkpoint):
            if bound.topic != str(name):
                raise InvalidArgumentError(f"{label} checkpoint is for {bound.topic}, not {name}")
        elif bound != word:
            raise InvalidArgumentError(
                f"{label} must be {word!r}, a Checkpoint or a time (an aware datetime, epoch "
                f"milliseconds), got {bound!r}"
            )
    if subscription is not None and start != "earliest":
        raise InvalidArgumentError("pass either subscription= or start=, not both")
    if rows_per_partition < 1:
        raise InvalidArgumentError(f"rows_per_partition must be positive: {rows_per_partition}")


def _wanted_segments(segments: Iterable[SegmentInfo], start: Bound, end: Bound) -> list[_Wanted]:
    """Segments with something to read between the bounds, parents before children.

    A start checkpoint's finished segments are done; an end checkpoint reads its
    in-progress segments up to its positions, its finished ones to their end,
    and nothing of segments it had not reached.
    """
    wanted = []
    for info in sorted(segments, key=lambda s: s.segment_id):  # ids grow down the DAG
        sid = info.segment_id
        if isinstance(start, Checkpoint) and sid in start.finished:
            continue
        first = start.positions.get(sid, 0) if isinstance(start, Checkpoint) else 0
        last: int | None = None
        if isinstance(end, Checkpoint):
            if sid in end.positions:
                last = end.positions[sid]
            elif sid not in end.finished:
                continue
        if last is None or last > first:
            wanted.append(_Wanted(info, first, last))
    return wanted


def checked_layout(name: TopicName, credential: str | None, purpose: Permission) -> SegmentLayout:
    """The topic's layout from the DAG watch (checked there for ``purpose``)."""
    return background_loop().run(fetch_layout(name, credential, purpose))


async def _probe_all(
    name: TopicName,
    wanted: list[_Wanted],
    subscription: str | None,
    timeout_s: float,
    credential: str | None,
) -> list[dict[str, Any] | None]:
    deadline = time.monotonic() + timeout_s
    probes = (
        _probe(_segment_name(name, w.info), subscription, deadline, credential) for w in wanted
    )
    return list(await asyncio.gather(*probes))


async def _probe(
    segment: SegmentName, subscription: str | None, deadline: float, credential: str | None
) -> dict[str, Any] | None:
    """The end offset (and the subscription's cursor) of a running actor; None when it did
    not answer by ``deadline``. Looks the actor up again after each failure, never creates
    it (a hibernating tiered segment's is started by its controller)."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            handle = await find_segment_actor(segment, max(remaining, 0.001), credential=credential)
            status = handle.position.remote(subscription, credential=credential)
            return await asyncio.wait_for(call(status), max(remaining, 0.001))
        except (SegmentNotFoundError, TimeoutError, *RESTART_ERRORS):
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                return None
            await asyncio.sleep(RETRY_PAUSE_S)


def _still_listed(name: TopicName, missing: list[int], credential: str | None) -> list[int]:
    """Of the segments that did not answer, those the layout still lists: a segment pruned
    by retention while we probed it is no longer part of the topic, hence not required."""
    if not missing:
        return []
    current = checked_layout(name, credential, Permission.CONSUME).all_segments
    return sorted(sid for sid in missing if sid in current)


def _range_of(
    name: TopicName,
    wanted: _Wanted,
    probe: dict[str, Any],
    subscription: str | None,
    record: TieredRecord | None,
) -> SegmentRange:
    first = probe["position"] if subscription is not None else wanted.start
    last = probe["endOffset"] if wanted.end is None else wanted.end
    tier = None
    if record is not None:  # its file starts where retention had left the segment
        first = max(first, record.start_offset)
        path, end = f"{record.directory}/{RECORDS_FILE}", record.end_offset
        tier = TierFile(record.uri, path, record.start_offset, end, record.tier_format)
    segment = str(_segment_name(name, wanted.info))
    return SegmentRange(segment, wanted.info.segment_id, first, max(first, last), tier)


def _split(whole: SegmentRange, rows: int) -> list[SegmentRange]:
    return [
        SegmentRange(whole.segment, whole.segment_id, lo, min(lo + rows, whole.end), whole.tier)
        for lo in range(whole.start, whole.end, rows)
    ]


def _tiered_records(
    name: TopicName, wanted: list[_Wanted], credential: str | None
) -> dict[int, TieredRecord]:
    """The records of the wanted segments that moved to the tier, as the cluster holds
    them (planning must not wake a hibernating segment)."""
    ids = [w.info.segment_id for w in wanted]
    found = AdminServiceCaller().call_blocking(
        "tiered_records", str(name), ids, credential=credential
    )
    return {int(i): TieredRecord.model_validate(r) for i, r in found.items()}


def _recorded_status(record: TieredRecord, subscription: str | None) -> dict[str, Any]:
    """What a probe of the segment's actor would answer, from its record."""
    status: dict[str, Any] = {"startOffset": record.start_offset, "endOffset": record.end_offset}
    if subscription is not None:
        cursor = record.cursors.get(subscription)
        if cursor is None:
            raise SubscriptionNotFoundError(f"subscription {subscription!r} does not exist")
        status["position"] = max(cursor["mark_delete"], record.start_offset)
    return status


def _segment_name(name: TopicName, info: SegmentInfo) -> SegmentName:
    return name.segment(info.segment_id, info.hash_range.start, info.hash_range.end)


def annotate(result: Any, plan: ReadPlan) -> Any:
    """Record what was read on the result itself, and say so loudly when it is partial."""
    result.missing_segments = plan.missing_segments
    result.read_plan = plan
    if plan.missing_segments:
        warnings.warn(
            f"{plan.topic}: partial read, segments {list(plan.missing_segments)} are missing "
            "(allow_partial=True); see .missing_segments",
            PartialReadWarning,
            stacklevel=3,
        )
    return result
