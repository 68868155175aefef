"""How far behind a subscription is in time: the age of its oldest unacknowledged
message (``backlog_age_seconds``), per segment and over the whole topic, beside the
counts. Segments report when that message was published (``oldestUnackedMs``, which
does not change while nobody acknowledges), and the age is taken at the moment it is
shown, so a report read late is not younger than the truth. Pure: ``actors.control.topic_stats``
and the controller's metrics use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


class BacklogAges:
    """The oldest unacknowledged publish times of the last stats round, from which the
    ages are taken again between rounds without asking any segment: while nobody
    acknowledges, an age grows with the clock alone. The controller's maintenance
    observes each round's stats and re-exports the ages every fraction of a second,
    so a Prometheus scrape at any moment sees an age at most one export old.

    Who calls: ``actors.control.maintenance`` only (``observe`` per round, the ages per refresh).
    """

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()
        self._segments: dict[tuple[str, str], int] = {}
        self._cleared: set[tuple[str, str]] = set()

    def observe(self, stats: Mapping[str, Mapping[str, Any]], subscriptions: Iterable[str]) -> None:
        """Take a round's stats (segment descriptor → its stats) for the topic's
        ``subscriptions``."""
        segments: dict[tuple[str, str], int] = {}
        for segment, st in stats.items():
            for name, cursor in st["subscriptions"].items():
                oldest = cursor.get("oldestUnackedMs")
                if oldest is not None:
                    segments[(segment, name)] = oldest
        self._cleared |= self._segments.keys() - segments.keys()
        self._cleared -= segments.keys()
        self._segments = segments
        self._names = tuple(subscriptions)

    def subscription_ages(self, now_ms: int) -> dict[str, float]:
        """Every subscription's age: its oldest segment's (0 with nothing unacknowledged)."""
        ages = dict.fromkeys(self._names, 0.0)
        for (_, name), oldest in self._segments.items():
            ages[name] = max(ages.get(name, 0.0), age_s(oldest, now_ms))
        return ages

    def growing(self) -> bool:
        """Whether an export now would differ from the last one: some message is still
        unacknowledged (its age grows with the clock), or a pair was cleared since. A
        topic with nothing owed exports nothing between rounds."""
        return bool(self._segments or self._cleared)

    def segment_ages(self, now_ms: int) -> dict[tuple[str, str], float]:
        """(segment descriptor, subscription) → age, for the pairs with a backlog, and 0 once for
        each pair whose backlog was acknowledged since the last call (a pair with none
        is not re-exported every time)."""
        ages = {key: age_s(oldest, now_ms) for key, oldest in self._segments.items()}
        ages |= dict.fromkeys(self._cleared, 0.0)
        self._cleared = set()
        return ages
