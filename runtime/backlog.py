"""How far behind a subscription is in time: the age of its oldest unacknowledged
message (``backlog_age_seconds``), per segment and over the whole topic, beside the
counts. Segments report when that message was published (``oldestUnackedMs``, which
does not change while nobody acknowledges), and the age is taken at the moment it is
shown, so a report read late is not younger than the truth. Pure: ``actors.topic_stats``
and the controller's metrics use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def age_s(oldest_unacked_ms: int | None, now_ms: int) -> float:
    """Seconds since ``oldest_unacked_ms`` (0 with nothing unacknowledged)."""
    if oldest_unacked_ms is None:
        return 0.0
    return max(now_ms - oldest_unacked_ms, 0) / 1000


def subscription_ages(segments: Mapping[Any, Mapping[str, Any]], now_ms: int) -> dict[str, float]:
    """Each subscription's backlog age over ``segments`` (segment → its stats): the
    oldest of its segments' oldest unacknowledged messages."""
    ages: dict[str, float] = {}
    for stats in segments.values():
        for name, cursor in stats["subscriptions"].items():
            age = age_s(cursor.get("oldestUnackedMs"), now_ms)
            ages[name] = max(ages.get(name, 0.0), age)
    return ages
