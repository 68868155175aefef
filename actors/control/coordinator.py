"""``SubscriptionCoordinator``: the coordinator of one subscription (or checkpoint group),
served with the topic's others by its ``CoordinatorHost`` (``actors.control.coordinator_host``).

A thin shell over ``runtime.coordination.GroupState``: it persists each
consumer's registration (name and owned shares: segments, or runs of a segment's key
buckets) at its consumer path (``storage.metadata``)
whenever that changes — never per heartbeat — keeps liveness in memory, pushes
assignment changes to consumers' long-polls, follows the topic's layout through
a DAG watch, and evicts consumers whose grace period ran out. After a restart
of its host every registration is restored and every consumer gets a fresh grace period.

Every consumer-facing method checks the caller's ``credential`` for ``consume``
on the topic's namespace before it looks at anything (``actors.guard``); the
coordinator itself reads the layout and the segments with the system's internal
credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from actors.control.dag_watch import DagWatch
from actors.guard import guard
from actors.segment.lookup import LOOKUP_WAIT_S, segment_position
from runtime.assignment import Share
from runtime.auth import Permission
from runtime.coordination import GroupState
from runtime.errors import ConflictError, ConsumerNotRegisteredError
from runtime.names import TopicName, validate_part
from runtime.policy import TopicPolicy
from storage.catalog import Catalog
from storage.records import ConsumerRegistration, SubscriptionKind, SubscriptionMetadata

# Past a session's deadline by this much before looking, so it is found expired then.
_EXPIRY_SLACK_S = 0.05
# How old the topic's key bucket budget (its policy's ``keyShared``) may be when a
# rebalance uses it.
_POLICY_FRESH_S = 5.0


class SubscriptionCoordinator:
    def __init__(self, topic: TopicName, subscription: str) -> None:
        self.topic = topic
        self.subscription = validate_part("subscription", subscription)
        self.catalog = Catalog()
        self._guard = guard()
        # Versions above every earlier incarnation's: its start in µs (JSON-safe).
        self.state = GroupState(version_base=time.time_ns() // 1_000)
        self.meta: SubscriptionMetadata | None = None
        self.watch: DagWatch | None = None
        self._changed = asyncio.Event()
        self._persisted: dict[str, tuple[Share, ...]] = {}
        self._policy_read_at = float("-inf")
        self._tasks: list[asyncio.Task] = []
        self._start_lock = asyncio.Lock()
        self._joined = asyncio.Event()  # a session began: the expiry deadline may be sooner

    # --- consumer API ----------------------------------------------------------------

    async def ensure_group(self, session_grace_s: float, *, credential: str | None = None) -> None:
        """Create this checkpoint group's metadata on its first use; refuse a name that
        is a subscription's."""
        self._check(credential)
        self.catalog.ensure_group(self.topic, self.subscription, session_grace_s)

    async def register(self, consumer: str, *, credential: str | None = None) -> dict[str, Any]:
        """Join (or re-join within the grace period, keeping the same segments)."""
        self._check(credential)
        validate_part("consumer name", consumer)
        await self._start()
        self.state.join(consumer, time.monotonic())
        self._joined.set()
        self._settle()
        return self._assignment(consumer)

    async def poll(
        self,
        consumer: str,
        known_version: int,
        timeout_s: float = 10.0,
        *,
        credential: str | None = None,
    ) -> dict[str, Any] | None:
        """Long-poll: the assignment once it differs from ``known_version``; also a heartbeat."""
        self._check(credential)
        await self._start()
        session = self._session(consumer)
        if self.state.confirmed(consumer, known_version):
            self._settle()
        deadline = time.monotonic() + timeout_s
        while session.version == known_version and time.monotonic() < deadline:
            self.state.seen(consumer, time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            session = self._session(consumer)
        self.state.seen(consumer, time.monotonic())
        return self._assignment(consumer) if session.version != known_version else None

    async def release(
        self,
        consumer: str,
        segment_id: int,
        position: int | None = None,
        *,
        credential: str | None = None,
    ) -> None:
        """Give a segment up (after acknowledging what was delivered from it)."""
        self._check(credential)
        await self._start()
        self._session(consumer)
        self.state.release(consumer, segment_id, position)
        if position is not None:
            self._update_meta(
                lambda m: m.model_copy(
                    update={"positions": {**m.positions, str(segment_id): position}}
                )
            )
        self._settle()

    async def finished(
        self,
        consumer: str,
        segment_id: int,
        position: int | None = None,
        *,
        credential: str | None = None,
    ) -> None:
        """The consumer read (and acknowledged) a sealed segment to its end."""
        self._check(credential)
        await self._start()
        self._session(consumer)
        await self._verify_finished(segment_id, position)
        self.state.finish(segment_id)
        self._update_meta(lambda m: m.finishing(segment_id))
        self._settle()

    async def unregister(self, consumer: str, *, credential: str | None = None) -> None:
        """Leave now (graceful close): the others rebalance immediately."""
        self._check(credential)
        await self._start()
        self._evict(consumer)
        self._settle()

    async def reset(
        self,
        finished: list[int],
        positions: dict[int, int],
        *,
        credential: str | None = None,
    ) -> None:
        """Rewind the group's shared progress (a checkpoint consumer starting from a
        checkpoint): finished segments and released positions become the given ones."""
        self._check(credential)
        await self._start()
        self._update_meta(
            lambda m: m.model_copy(
                update={
                    "finished_segments": tuple(sorted(finished)),
                    "positions": {str(k): v for k, v in positions.items()},
                }
            )
        )
        self.state.finished = set(finished)
        self.state.positions = {int(k): v for k, v in positions.items()}
        self._settle()

    async def snapshot(self, *, credential: str | None = None) -> dict[str, Any]:
        self._check(credential)
        await self._start()
        return {**self.state.snapshot(), "layoutEpoch": self.watch.layout.epoch}

    # --- the host's -----------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether its persisted state is loaded and it follows the layout."""
        return self.watch is not None

    async def shutdown(self) -> None:
        """Stop following the layout and expiring sessions (its subscription is deleted).
        Who calls: its host's ``stop``, which checks the caller's ``admin``."""
        for task in self._tasks:
            task.cancel()
        if self.watch is not None:
            await self.watch.close()

    # --- internals -------------------------------------------------------------------

    def _check(self, credential: str | None) -> None:
        self._guard.check(credential, Permission.CONSUME, self.topic.namespace_path)

    async def _start(self) -> None:
        """Load the persisted sessions once; every consumer gets a fresh grace timer."""
        async with self._start_lock:
            if self.watch is not None:
                return
            self.meta = self._load_meta()
            now = time.monotonic()
            self.state.finished = set(self.meta.finished_segments)
            self.state.positions = {int(k): v for k, v in self.meta.positions.items()}
            for name, owned in self._load_registrations().items():
                self.state.join(name, now)
                for share in owned:
                    self.state.owners[share] = name
                    self.state.handed.add(share)  # it may have been read: released first
                self._persisted[name] = tuple(sorted(owned))
            self.watch = await DagWatch.open(self.topic, self._guard.internal_token())
            self.watch.start()
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._follow()), loop.create_task(self._expire())]
            self._settle()

    async def _follow(self) -> None:
        async for _ in self.watch.updates():
            self._settle()

    async def _expire(self) -> None:
        """Evict each consumer once its grace period has passed unheard: a sleep until the
        first session's deadline (moved later by every consumer heard from meanwhile),
        not a timer that ticks while nothing can expire. With no sessions, a join wakes
        it (``_joined``)."""
        grace_s = self.meta.session_grace_s
        while True:
            due = self.state.next_expiry(grace_s)
            wait_s = grace_s if due is None else max(due - time.monotonic(), 0.0) + _EXPIRY_SLACK_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._joined.wait(), wait_s)
            self._joined.clear()
            for consumer in self.state.expired(time.monotonic(), grace_s):
                self._evict(consumer)
                self._settle()

    def _settle(self) -> None:
        """Rebalance, persist changed registrations, wake long-polls."""
        self._refresh_buckets()
        self.state.rebalance(self.watch.layout)
        for consumer in list(self.state.sessions):
            owned = self.state.owned(consumer)
            if self._persisted.get(consumer) != owned:
                self._persist(consumer, owned)
        self._changed.set()
        self._changed = asyncio.Event()

    def _refresh_buckets(self) -> None:
        """A subscription's segments are shared by key buckets, as its topic's policy
        (or its namespace's) says; a checkpoint group's consumers keep whole segments,
        since each one's positions are its own to commit."""
        if self.meta.kind != SubscriptionKind.SUBSCRIPTION:
            self.state.buckets = 1
            return
        now = time.monotonic()
        if now - self._policy_read_at < _POLICY_FRESH_S:
            return
        self._policy_read_at = now
        record = self.catalog.topic(self.topic)
        if record is not None:
            default = self.catalog.namespace_policy(self.topic.namespace_path)
            self.state.buckets = (record.policy or TopicPolicy()).over(default).key_buckets

    def _persist(self, consumer: str, owned: tuple[Share, ...]) -> None:
        registration = ConsumerRegistration(
            consumer_name=consumer,
            assigned_segments=tuple(s.segment_id for s in owned),
            layout_epoch=self.watch.layout.epoch,
            assigned_buckets={
                s.segment_id: (s.start, s.end, s.count) for s in owned if not s.whole
            },
        )
        self.catalog.put_registration(self.topic, self.subscription, registration)
        self._persisted[consumer] = owned

    def _evict(self, consumer: str) -> None:
        self.state.leave(consumer)
        self._persisted.pop(consumer, None)
        self.catalog.delete_registration(self.topic, self.subscription, consumer)

    def _assignment(self, consumer: str) -> dict[str, Any]:
        session = self._session(consumer)
        self.state.handed_out(consumer)
        layout = self.watch.layout
        segments = []
        for share in session.view:
            segment_id = share.segment_id
            rng = layout.all_segments[segment_id].hash_range
            spec = {
                "segmentId": segment_id,
                "hashRange": {"start": rng.start, "end": rng.end},
                "segmentTopic": str(self.topic.segment(segment_id, rng.start, rng.end)),
                "startPosition": self.state.positions.get(segment_id),
            }
            if not share.whole:
                spec["buckets"] = share.to_dict()
            segments.append(spec)
        return {
            "version": session.version,
            "layoutEpoch": layout.epoch,
            "segments": segments,
            "releasing": list(self.state.releasing(consumer)),
        }

    def _session(self, consumer: str) -> Any:
        session = self.state.sessions.get(consumer)
        if session is None:
            raise ConsumerNotRegisteredError(
                f"consumer {consumer!r} is not registered on {self.subscription!r} "
                "(its session expired or it closed): register again"
            )
        return session

    async def _verify_finished(self, segment_id: int, position: int | None) -> None:
        info = self.watch.layout.all_segments.get(segment_id)
        if info is None or info.is_active:
            raise ConflictError(f"segment {segment_id} is not sealed: it cannot be finished")
        rng = info.hash_range
        segment = self.topic.segment(segment_id, rng.start, rng.end)
        # A sealed segment may hibernate between its lookup and the call: asked again
        subscribed = self.meta.kind == SubscriptionKind.SUBSCRIPTION
        status = await segment_position(
            segment,
            self.subscription if subscribed else None,
            time.monotonic() + LOOKUP_WAIT_S,
            credential=self._guard.internal_token(),
        )
        if subscribed:
            done, detail = status["drained"], f"cursor at {status['position']}"
        else:
            done = status["terminated"] and position is not None and position >= status["endOffset"]
            detail = f"reported position {position}"
        if not done:
            raise ConflictError(
                f"segment {segment_id} is not finished for {self.subscription!r}: {detail}, "
                f"end {status['endOffset']}"
            )

    def _load_meta(self) -> SubscriptionMetadata:
        return self.catalog.require_subscription(self.topic, self.subscription)

    def _update_meta(self, change: Callable[[SubscriptionMetadata], SubscriptionMetadata]) -> None:
        self.meta = self.catalog.update_subscription(self.topic, self.subscription, change)

    def _load_registrations(self) -> dict[str, tuple[Share, ...]]:
        return {
            r.consumer_name: tuple(
                Share(segment, *r.assigned_buckets[segment])
                if segment in r.assigned_buckets
                else Share(segment)
                for segment in r.assigned_segments
            )
            for r in self.catalog.registrations(self.topic, self.subscription)
        }
