"""The state of one subscription's consumer group: sessions, ownership, handovers.

Modelled on Pravega's reader-group state. A segment has at most one *owner*,
the only consumer allowed to read it. When the balance wants it elsewhere the
owner is asked to give it up (it disappears from the owner's view) and the new
consumer gets it only after the owner *releases* it — after acknowledging what
it delivered — so a rebalance never hands the same message to two consumers.
A consumer that stops talking keeps its session for a grace period, then is
evicted and its segments move. Pure logic: the coordinator actor persists and
pushes what this decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.assignment import assign, readable_segments
from runtime.layout import SegmentLayout


@dataclass
class Session:
    last_seen: float
    version: int = 0
    view: tuple[int, ...] = ()


@dataclass
class GroupState:
    sessions: dict[str, Session] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)
    handover: dict[int, str] = field(default_factory=dict)  # segment -> next owner
    finished: set[int] = field(default_factory=set)
    positions: dict[int, int] = field(default_factory=dict)  # released read positions
    # Where this state's assignment versions start. A consumer asks for its assignment
    # once it differs from the version it holds, so a coordinator that restarts (and
    # builds this state anew) must not hand out a version a consumer may hold from before:
    # it would take a new assignment for the one it has, and wait forever.
    version_base: int = 0

    # --- membership ------------------------------------------------------------------

    def join(self, consumer: str, now: float) -> None:
        session = self.sessions.get(consumer)
        if session is None:
            self.sessions[consumer] = Session(last_seen=now, version=self.version_base)
        else:
            session.last_seen = now

    def leave(self, consumer: str) -> None:
        self.sessions.pop(consumer, None)
        for segment in [s for s, o in self.owners.items() if o == consumer]:
            del self.owners[segment]
            self._complete_handover(segment)
        for segment in [s for s, o in self.handover.items() if o == consumer]:
            del self.handover[segment]

    def seen(self, consumer: str, now: float) -> None:
        if consumer in self.sessions:
            self.sessions[consumer].last_seen = now

    def expired(self, now: float, grace_s: float) -> list[str]:
        return sorted(c for c, s in self.sessions.items() if now - s.last_seen > grace_s)

    def next_expiry(self, grace_s: float) -> float | None:
        """When the first session expires if no consumer is heard from before (a consumer
        heard from only moves its own later); ``None`` without sessions."""
        if not self.sessions:
            return None
        return min(s.last_seen for s in self.sessions.values()) + grace_s

    # --- progress ----------------------------------------------------------------------

    def release(self, consumer: str, segment: int, position: int | None = None) -> None:
        """The owner gave ``segment`` up (it acknowledged what it delivered)."""
        if self.owners.get(segment) != consumer:
            return
        if position is not None:
            self.positions[segment] = position
        del self.owners[segment]
        self._complete_handover(segment)

    def finish(self, segment: int) -> None:
        """``segment`` is sealed and read to its end: its children may become readable."""
        self.finished.add(segment)
        self.owners.pop(segment, None)
        self.handover.pop(segment, None)
        self.positions.pop(segment, None)

    # --- balancing ------------------------------------------------------------------------

    def rebalance(self, layout: SegmentLayout) -> list[str]:
        """Recompute ownership; returns the consumers whose view changed."""
        readable = readable_segments(layout, self.finished)
        readable_ids = {info.segment_id for info in readable}
        for segment in [s for s in self.owners if s not in readable_ids]:
            del self.owners[segment]
        desired = assign(readable, self.sessions, self.owners)
        self.handover = {}
        for segment, wanted in desired.items():
            owner = self.owners.get(segment)
            if owner is None or owner not in self.sessions:
                self.owners[segment] = wanted
            elif owner != wanted:
                self.handover[segment] = wanted
        return self._refresh_views()

    def view(self, consumer: str) -> tuple[int, ...]:
        return tuple(
            sorted(s for s, o in self.owners.items() if o == consumer and s not in self.handover)
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "consumers": {c: list(s.view) for c, s in sorted(self.sessions.items())},
            "owners": dict(sorted(self.owners.items())),
            "handover": dict(sorted(self.handover.items())),
            "finished": sorted(self.finished),
        }

    def _complete_handover(self, segment: int) -> None:
        wanted = self.handover.pop(segment, None)
        if wanted is not None and wanted in self.sessions:
            self.owners[segment] = wanted

    def _refresh_views(self) -> list[str]:
        changed = []
        for consumer, session in self.sessions.items():
            view = self.view(consumer)
            if view != session.view:
                session.view = view
                session.version += 1
                changed.append(consumer)
        return changed
