"""Rebuilding a topic's lost metadata from its storage: the controller's ``recover``.

The metadata store can lose a topic's records (an operator's mistake, a Ray started
on an empty store) while the segments' files, their own records and the incarnation's
``topic.json`` survive. ``runtime.recovery`` plans the layout from what each segment
recorded about itself; this module carries the plan out as the topic's leader: the
leader epoch raised above every fence the segments have seen (they would refuse a
lower one), actors left from before replaced, the layout written back (an interrupted
merge stays pending, and the controller's usual recovery then rolls it forward), every
subscription found in the cursors re-created around them (existing cursors keep their
positions, missing ones start at the subscription's position).

With a disk per node (storage scope ``node``) the segments' copies are read on every
live node's disk (``actors.control.node_disks``), merged into one state per segment, and
each segment's disk and replica set are recorded again (``storage.stored_copies``); the
replica rounds then elect each replicated segment's leader among its copies.

Refused while the topic has live metadata: it rebuilds, it never overwrites. The
rebuild that wrote the metadata, sent again under its request id (a caller whose answer
was lost, or a rebuild cut after the record was written), finishes what it left, each
step safe to repeat, and is answered with the same report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actors.capacity import check_capacity
from actors.control.topic_parts import TopicParts
from runtime.errors import SubscriptionAlreadyExistsError, TopicAlreadyExistsError
from runtime.policy import TopicPolicy
from runtime.recovery import RecoveryPlan, plan_recovery
from storage import stored_copies
from storage.records import SubscriptionMetadata, TopicRecord
from storage.stored_copies import StoredCopy, StoredTopic, copies_of, merged_states
from storage.topic_storage import StoredIncarnation, SubscriptionSettings, choose_incarnation


class MetadataRebuild:
    """Who calls: the controller's ``recover``, holding its lock. What it affects: the
    topic's record and subscriptions in the metadata store, the leader epoch (through
    ``raise_epoch``), the segments' actors and the storage of segments the plan drops."""

    def __init__(
        self,
        parts: TopicParts,
        raise_epoch: Callable[[int], int],
        resume: Callable[[], Awaitable[None]],
        write_identity: Callable[[], None],
    ) -> None:
        self._parts = parts
        self._raise_epoch = raise_epoch  # elect at least this epoch; the one now held
        self._resume = resume  # the controller's recovery, from the start
        self._write_identity = write_identity

    async def rebuild(self, incarnation: str | None, request_id: str) -> dict[str, Any]:
        """Rebuild from ``incarnation``'s storage (the only one, or the one named). The
        rebuild of ``request_id`` sent again (its answer lost, or cut half-way) finishes
        what it left and answers as it did; any other is refused once the topic exists."""
        parts = self._parts
        topic, catalog, fleet = parts.topic, parts.catalog, parts.fleet
        existing = catalog.topic(topic)
        if existing is not None:
            if existing.created_by != request_id or existing.recovery is None:
                raise TopicAlreadyExistsError(
                    f"{topic} has live metadata: recover rebuilds only a topic whose "
                    "metadata is lost"
                )
            found = await self._stored()
            stored = choose_incarnation(found.incarnations, topic, existing.incarnation)
            copies = found.copies.get(existing.incarnation, [])
            fleet.incarnation = existing.incarnation  # a restarted controller's too
            self._restore_disks(copies, existing.recovery["discardedSegments"])
            self._recreate_subscriptions(self._plan(stored, copies), stored)
            return await self._finish(existing.recovery, copies)
        found = await self._stored()
        stored = choose_incarnation(found.incarnations, topic, incarnation)
        copies = found.copies.get(stored.incarnation or "", [])
        plan = self._plan(stored, copies)
        starting = len(plan.layout.all_segments) - fleet.leftover_segments()
        check_capacity(f"recovering {topic}", topic, starting)
        epoch = self._raise_epoch(plan.controller_epoch)
        fleet.incarnation = stored.incarnation
        await fleet.clear_leftovers()
        await parts.coordinators.stop_all()
        done = {
            "incarnation": stored.incarnation,
            "subscriptions": list(plan.subscriptions),
            "discardedSegments": list(plan.discarded),
            "finishedOperation": plan.pending.kind if plan.pending else None,
        }
        self._restore_disks(copies, plan.discarded)  # before the record: no round sees it bare
        catalog.create_topic(topic, self._record(plan, stored, epoch, request_id, done))
        self._recreate_subscriptions(plan, stored)
        return await self._finish(done, copies)

    async def _stored(self) -> StoredTopic:
        """The topic name's incarnations and segment copies: under the shared root, or on
        every live node's disk, each read on its node."""
        fleet = self._parts.fleet
        if fleet.node_local:
            return await asyncio.to_thread(fleet.disks.stored)
        found = fleet.stored()
        return StoredTopic(
            found, {s.incarnation: copies_of(s, None) for s in found if s.incarnation}
        )

    def _restore_disks(self, copies: list[StoredCopy], discarded: Sequence[int]) -> None:
        """With a disk per node: each kept segment's disk and each replicated one's replica
        set, recorded again from its copies (one already recorded, by this rebuild's first
        attempt, stays)."""
        fleet = self._parts.fleet
        if not fleet.node_local:
            return
        copies = [copy for copy in copies if copy.segment_id not in discarded]
        placements, sets = fleet.placements(), fleet.replicas.sets()
        found = stored_copies.replica_sets(copies)
        for segment_id, disk in stored_copies.placements(copies, found).items():
            placements.place(segment_id, disk)
        for segment_id, replicas in found.items():
            sets.create(segment_id, replicas)

    async def _discard(self, copies: list[StoredCopy], discarded: list[int]) -> None:
        """Remove every copy of the segments no committed layout names, where it is."""
        fleet, topic = self._parts.fleet, self._parts.topic
        for copy in copies:
            if copy.segment_id not in discarded:
                continue
            name = copy.state.info.name(topic)
            if copy.disk is None:
                fleet.delete_segment_storage(name)
                continue
            node = await asyncio.to_thread(fleet.disks.node_of, copy.disk)
            if node is None:
                raise fleet.disks.unavailable(name, copy.disk)
            await fleet.disks.remove(node, fleet.incarnation or "", name)

    async def _finish(self, done: dict[str, Any], copies: list[StoredCopy]) -> dict[str, Any]:
        """The steps after the record is written, each safe to repeat: the discarded
        segments' storage removed, the controller's recovery (a pending operation rolled
        forward, the subscriptions given their cursors), the segments' actors registered;
        returns the rebuild's report."""
        parts = self._parts
        topic, fleet = parts.topic, parts.fleet
        await self._discard(copies, done["discardedSegments"])
        await self._resume()
        layout = parts.read_record().layout
        tiered = set(fleet.storage().records.segment_ids())  # one read, not one per segment
        for segment in layout.all_segments.values():  # sealed ones serve their backlog
            if segment.segment_id not in tiered:
                fleet.handle(segment.name(topic))
        self._write_identity()
        fleet.announce_layout()
        return {
            "topic": str(topic),
            "incarnation": done["incarnation"],
            "epoch": layout.epoch,
            "segments": len(layout.all_segments),
            "activeSegments": len(layout.active_segments),
            "subscriptions": list(done["subscriptions"]),
            "discardedSegments": list(done["discardedSegments"]),
            "finishedOperation": done["finishedOperation"],
        }

    @staticmethod
    def _plan(stored: StoredIncarnation, copies: list[StoredCopy]) -> RecoveryPlan:
        identity = stored.identity
        return plan_recovery(
            merged_states(copies),
            known_epoch=identity.epoch if identity else 0,
            known_next_segment_id=identity.next_segment_id if identity else 0,
            properties=identity.properties if identity else None,
        )

    @staticmethod
    def _record(
        plan: RecoveryPlan,
        stored: StoredIncarnation,
        epoch: int,
        request_id: str,
        done: dict[str, Any],
    ) -> TopicRecord:
        identity = stored.identity
        policy = identity.policy if identity else None
        return TopicRecord.new(
            plan.layout,
            stored.incarnation,
            epoch,
            pending_operation=plan.pending,
            policy=TopicPolicy.parse(policy) if policy else None,
            created_at_ms=identity.created_at_ms if identity else int(time.time() * 1000),
            created_by=request_id,
            recovery=done,
        )

    def _recreate_subscriptions(self, plan: RecoveryPlan, stored: StoredIncarnation) -> None:
        """Each subscription found in the cursors, CREATING (the controller's recovery
        gives it its cursors); one a cut rebuild already re-created is left as it is."""
        settings = stored.identity.subscriptions if stored.identity else {}
        for name in plan.subscriptions:
            kept = settings.get(name) or SubscriptionSettings()
            meta = SubscriptionMetadata(
                name=name, position=kept.position, session_grace_s=kept.session_grace_s
            )
            with contextlib.suppress(SubscriptionAlreadyExistsError):
                self._parts.catalog.create_subscription(self._parts.topic, meta)
