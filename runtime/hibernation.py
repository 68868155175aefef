"""Which segments' processes may exit (hibernate) because nothing needs them running.

A segment actor costs a process (~85 MB) whether or not anyone uses it, and a long-lived
elastic topic accumulates sealed segments. Two kinds need none while idle: a tiered
segment (its records are in the object store, its state in its record) and a sealed
segment every subscription has drained (nothing is owed to anyone; its files stay where
they are). Either is started again, on demand, by the next reader. Pure: the
controller's maintenance acts on it, from the stats of one round.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any


def idle_tiered(stats: Mapping[int, Mapping[str, Any]], idle_s: float) -> list[int]:
    """Tiered segments whose running actor no reader has used for ``idle_s`` seconds: their
    process may exit (hibernate); the next reader starts it again."""
    return sorted(
        segment_id
        for segment_id, st in stats.items()
        if st.get("tiered") and not st.get("hibernating") and st.get("idleS", 0.0) >= idle_s
    )


def idle_drained(stats: Mapping[int, Mapping[str, Any]], idle_s: float) -> list[int]:
    """Sealed segments on local disk with nothing unacknowledged for any subscription and
    no reader or writer for ``idle_s`` seconds: their process may exit."""
    return sorted(
        segment_id
        for segment_id, st in stats.items()
        if st.get("terminated")
        and not st.get("tiered")
        and not st.get("hibernating")
        and st.get("idleS", 0.0) >= idle_s
        and all(sub["backlog"] == 0 for sub in st.get("subscriptions", {}).values())
    )


class HibernationMarks:
    """Which segments a controller's fleet ended (or found without a process) and nobody has
    started since: its maintenance rounds skip looking those up, one GCS round trip each.

    A start may run in a worker thread (a reader's wake) beside a round that looks the
    segment up: a round that found no process while a start was under way must not mark
    it, or no round would observe it again once it runs, and it would never end when
    idle. So a round reads ``starts`` before its lookup and ``found_without_process``
    marks only if no start began or ended since; a start clears the mark when it begins
    and again when it ends.

    Who calls: ``actors.control.segment_fleet`` only. Keys: segment names (any hashable).
    """

    def __init__(self) -> None:
        self._marked: set[Hashable] = set()
        self._starts: dict[Hashable, int] = {}  # starts begun or ended, per segment

    def ended(self, segment: Hashable) -> None:
        """The fleet ended the segment's process (it hibernates)."""
        self._marked.add(segment)

    def starting(self, segment: Hashable) -> None:
        self._starts[segment] = self._starts.get(segment, 0) + 1
        self._marked.discard(segment)

    def started(self, segment: Hashable) -> None:
        """The start ended (whether or not it succeeded)."""
        self.starting(segment)

    def marked(self, segment: Hashable) -> bool:
        return segment in self._marked

    def starts(self, segment: Hashable) -> int:
        """What a round reads before it looks the segment up."""
        return self._starts.get(segment, 0)

    def found_without_process(self, segment: Hashable, starts: int) -> None:
        """A round's lookup, made after reading ``starts``, found no process: mark it
        unless a start began or ended since."""
        if self._starts.get(segment, 0) == starts:
            self._marked.add(segment)
