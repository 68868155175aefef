"""The state of one subscription's consumer group: sessions, ownership, handovers.

Modelled on Pravega's reader-group state. What is owned is a *share*
(``runtime.assignment.Share``): a whole segment, or, in a stream subscription with
more consumers than readable segments, a run of a segment's key buckets. A bucket
has at most one *owner*, the only consumer allowed to read it. When the balance
wants a share elsewhere (or cut differently) its owner is asked to give it up (it
disappears from the owner's view) and no share overlapping it is handed out until
the owner *releases* it — after acknowledging what it delivered — so a rebalance
never hands the same message to two consumers and a key's messages never reach
two consumers at once. A consumer that stops talking keeps its session for a grace
period, then is evicted and its shares move. Pure logic: the coordinator actor
persists and pushes what this decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.assignment import Share, assign_shares, readable_segments
from runtime.layout import SegmentLayout

# Answered views a session remembers: a consumer holds one of its last few answers.
_ANSWERS_KEPT = 8


@dataclass
class Session:
    last_seen: float
    version: int = 0
    view: tuple[Share, ...] = ()
    # The versions answered to this consumer, until it polls holding a later one.
    answered: set[int] = field(default_factory=set)


@dataclass
class GroupState:
    sessions: dict[str, Session] = field(default_factory=dict)
    owners: dict[Share, str] = field(default_factory=dict)
    revoked: set[Share] = field(default_factory=set)  # owned, to be released
    # Owned shares an assignment handed to their owner carried: only those can be read,
    # so only those wait for a release when revoked. A share granted and taken back
    # before its owner heard of it is free at once (it would wait for a release that
    # its owner, never reading it, has no reason to send).
    handed: set[Share] = field(default_factory=set)
    # The version of the first answer that carried each handed share: a consumer that
    # polls holding an older version never received it (``confirmed``).
    handed_at: dict[Share, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    positions: dict[int, int] = field(default_factory=dict)  # released read positions
    # Where this state's assignment versions start. A consumer asks for its assignment
    # once it differs from the version it holds, so a coordinator that restarts (and
    # builds this state anew) must not hand out a version a consumer may hold from before:
    # it would take a new assignment for the one it has, and wait forever.
    version_base: int = 0
    # Key buckets a segment may be cut into (1: whole segments only, as a checkpoint
    # group and a subscription whose policy says so).
    buckets: int = 1

    # --- membership ------------------------------------------------------------------

    def join(self, consumer: str, now: float) -> None:
        session = self.sessions.get(consumer)
        if session is None:
            self.sessions[consumer] = Session(last_seen=now, version=self.version_base)
        else:
            session.last_seen = now

    def leave(self, consumer: str) -> None:
        """Who calls: the coordinator, on a graceful close or an expired session; what
        it held is free at once (whatever it delivered unacknowledged goes again)."""
        self.sessions.pop(consumer, None)
        for share in [s for s, o in self.owners.items() if o == consumer]:
            self._drop(share)

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
        """The owner gave its share of ``segment`` up (it acknowledged what it delivered).
        A consumer owns at most one share of a segment."""
        for share in [s for s, o in self.owners.items() if o == consumer]:
            if share.segment_id == segment:
                if position is not None and share.whole:
                    self.positions[segment] = position
                self._drop(share)

    def finish(self, segment: int) -> None:
        """``segment`` is sealed and read to its end: its children may become readable."""
        self.finished.add(segment)
        for share in [s for s in self.owners if s.segment_id == segment]:
            self._drop(share)
        self.positions.pop(segment, None)

    # --- balancing ------------------------------------------------------------------------

    def rebalance(self, layout: SegmentLayout) -> list[str]:
        """Recompute ownership; returns the consumers whose view changed. Who calls: the
        coordinator after every change (a join, a release, a finish, a layout update)."""
        readable = readable_segments(layout, self.finished)
        readable_ids = {info.segment_id for info in readable}
        for share in [s for s in self.owners if s.segment_id not in readable_ids]:
            self._drop(share)
        for share in [s for s, o in self.owners.items() if o not in self.sessions]:
            self._drop(share)
        desired = assign_shares(readable, self.sessions, self.owners, self.buckets)
        for share in [s for s, o in self.owners.items() if desired.get(s) != o]:
            if share not in self.handed:
                self._drop(share)  # never read: nothing to wait for
        self.revoked = {s for s, o in self.owners.items() if desired.get(s) != o}
        for share, wanted in desired.items():
            if self.owners.get(share) == wanted:
                continue
            if not any(_blocks(held, owner, share, wanted) for held, owner in self.owners.items()):
                self.owners[share] = wanted
        return self._refresh_views()

    def handed_out(self, consumer: str) -> None:
        """Who calls: the coordinator, as it answers ``consumer`` with its view (a
        registration or a poll): what the view holds may be read from now on."""
        session = self.sessions.get(consumer)
        if session is None:
            return
        session.answered.add(session.version)
        session.answered.difference_update(sorted(session.answered)[:-_ANSWERS_KEPT])
        for share in session.view:
            if share in self.owners:
                self.handed.add(share)
                self.handed_at.setdefault(share, session.version)

    def confirmed(self, consumer: str, known_version: int) -> bool:
        """Who calls: the coordinator, when ``consumer`` polls holding the assignment of
        ``known_version``. What it affects: the answers after that version were lost on
        their way (a consumer polls with the version it applied last), so what only they
        carried was never read, and waits for no release: a share of them being taken
        back is free at once. A version this state never answered (-1, or one from before
        a restart of the coordinator) tells nothing. Returns whether a share was freed."""
        session = self.sessions.get(consumer)
        if session is None or known_version not in session.answered:
            return False
        session.answered = {v for v in session.answered if v >= known_version}
        freed = False
        for share in [s for s, o in self.owners.items() if o == consumer]:
            if share in self.handed and self.handed_at.get(share, known_version) > known_version:
                self.handed.discard(share)
                self.handed_at.pop(share, None)
                if share in self.revoked:
                    self._drop(share)
                    freed = True
        return freed

    def _drop(self, share: Share) -> None:
        del self.owners[share]
        self.revoked.discard(share)
        self.handed.discard(share)
        self.handed_at.pop(share, None)

    def view(self, consumer: str) -> tuple[Share, ...]:
        return tuple(
            sorted(s for s, o in self.owners.items() if o == consumer and s not in self.revoked)
        )

    def releasing(self, consumer: str) -> tuple[int, ...]:
        """The segments of ``consumer``'s shares being taken back. Who calls: the
        coordinator, in every answer. What it affects: the consumer releases each once it
        acknowledged what it delivered from it, and at once one it does not read. Only the
        owner can release a share, and an owner may hold one it never heard of: an answer
        carrying it was lost, and then the coordinator restarted and restored it as
        possibly read; without this, it would wait for that release for good."""
        taken = {s.segment_id for s in self.revoked if self.owners.get(s) == consumer}
        return tuple(sorted(taken))

    def owned(self, consumer: str) -> tuple[Share, ...]:
        """What ``consumer`` holds, being given up included: what it must not lose on a
        restart of the coordinator."""
        return tuple(sorted(s for s, o in self.owners.items() if o == consumer))

    def snapshot(self) -> dict[str, Any]:
        return {
            "consumers": {
                c: [_shown(s) for s in session.view] for c, session in sorted(self.sessions.items())
            },
            "owners": [
                {**_shown(s), "consumer": o, "releasing": s in self.revoked}
                for s, o in sorted(self.owners.items())
            ],
            "finished": sorted(self.finished),
        }

    def _refresh_views(self) -> list[str]:
        changed = []
        for consumer, session in self.sessions.items():
            view = self.view(consumer)
            if view != session.view:
                session.view = view
                session.version += 1
                changed.append(consumer)
        return changed


def _blocks(held: Share, owner: str, share: Share, wanted: str) -> bool:
    """Whether ``held`` keeps ``share`` from going to ``wanted`` yet: it holds some of its
    buckets, or it is another run of the same segment held by ``wanted`` itself (a
    consumer reads one run of a segment at a time: the old one is released first)."""
    return held.overlaps(share) or (owner == wanted and held.segment_id == share.segment_id)


def _shown(share: Share) -> dict[str, Any]:
    if share.whole:
        return {"segmentId": share.segment_id}
    return {"segmentId": share.segment_id, "buckets": share.to_dict()}
