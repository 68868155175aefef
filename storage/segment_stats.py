"""What a segment reports about itself: each subscription's backlog and position, and the
stats of a tiered segment whose actor is not running, from its record alone.

Stats are read far more often than segments change (the console, ``top``, every
maintenance round), and observing a hibernating segment must not start its process:
so the same numbers come from a live store (``SegmentStore.stats``) or from a
record, by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from runtime.names import SegmentName
from storage.cursors import Cursor
from storage.tier_records import TieredRecord


def hibernated_stats(name: SegmentName, record: TieredRecord) -> dict[str, Any]:
    """The stats of a tiered segment with no running actor, as its store would give
    them, from its record alone (observing a segment must not wake it)."""
    cursors = [Cursor.from_dict(c) for c in record.cursors.values()]
    return {
        "segment": str(name),
        "segmentId": name.segment_id,
        "terminated": True,
        "startOffset": record.start_offset,
        "endOffset": record.end_offset,
        "stableEnd": record.end_offset,  # a resting segment is read to its end
        "records": record.end_offset - record.start_offset,
        "sizeBytes": record.size_bytes,
        "lastPublishTimeMs": record.last_publish_time_ms,
        "sealedAtMs": record.sealed_at_ms,
        "tiered": True,
        "hibernating": True,
        "fenceEpoch": record.fence_epoch,
        "subscriptions": subscription_stats(cursors, record.start_offset, record.end_offset),
    }


def subscription_stats(
    cursors: Iterable[Cursor],
    start_offset: int,
    end_offset: int,
    publish_time_at: Callable[[int], int | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each subscription's backlog (unacknowledged records still stored), position, and
    when its oldest unacknowledged record was published (``oldestUnackedMs``: ``None``
    with no backlog, or when ``publish_time_at`` cannot tell)."""
    found = {}
    for c in sorted(cursors, key=lambda c: c.name):
        backlog = c.backlog(end_offset) - c.backlog(start_offset)
        oldest = None
        if backlog and publish_time_at is not None:
            oldest = publish_time_at(_first_unacked(c, start_offset))
        found[c.name] = {"backlog": backlog, "markDelete": c.mark_delete, "oldestUnackedMs": oldest}
    return found


def _first_unacked(cursor: Cursor, start_offset: int) -> int:
    """The cursor's first unacknowledged offset still stored."""
    first = max(cursor.mark_delete, start_offset)
    for low, high in cursor.acked_ranges:
        if low <= first < high:
            first = high
    return first
