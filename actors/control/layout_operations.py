"""Carrying out a topic's layout operations, step by step, each step safe to repeat.

The controller writes every layout change down first, as the topic record's
``PendingOperation`` (``LayoutOperations.run``, under the controller's lock); then
its steps run. A controller that dies midway leaves the operation pending, and its
next incarnation runs it again from the first step (``carry_out``): roll forward,
never back. So each step is idempotent: creating a child that exists changes
nothing, sealing a sealed parent answers its end offset again, and the one commit
is a compare-and-swap that applies the operation and clears it as pending together.

A split or merge has five steps (``Step``); crash tests and chaos end the process
right after any one of them (``inject_fault_after_step``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from actors.control.topic_parts import TopicParts
from actors.control.topic_subscriptions import TopicSubscriptions
from runtime.errors import ConflictError, OperationInProgressError, SegmentNotFoundError
from runtime.layout import HashRange, SegmentInfo, SegmentLayout
from runtime.names import SegmentName
from runtime.operations import (
    OperationKind,
    PendingOperation,
    PlannedSegment,
    apply_operation,
    completed,
    remembered,
)
from runtime.policy import TopicPolicy
from runtime.replication import Replication
from storage.records import TopicRecord
from storage.segment_store import SealedBy


class Step(IntEnum):
    """The protocol steps after which a controller may die (``inject_fault_after_step``):
    a split's or merge's first five, in order; a create's second (its segments made, the
    create still pending); a delete's last (its storage gone, its record not yet)."""

    SUBSCRIPTIONS_FOUND = 1  # the parents' subscriptions and the topic's, for the children
    CHILDREN_CREATED = 2  # the children's storage and actors, not in the layout yet
    PARENTS_SEALED = 3  # each parent terminated, its successors named
    COMMITTED = 4  # the CAS: the layout has the children, nothing is pending
    ANNOUNCED = 5  # the DAG watch told (not waited for)
    STORAGE_DELETED = 6  # a delete: every segment and the incarnation's files gone


@dataclass(frozen=True)
class LayoutOperations:
    """One topic's layout operations, given the controller's parts.

    ``update_record``: the controller's fenced read-modify-CAS of the topic record;
    ``write_identity``: rewrite the incarnation's ``topic.json`` after a commit;
    ``step_done``: called after each ``Step`` (the controller's fault injection).
    """

    parts: TopicParts
    subscriptions: TopicSubscriptions
    update_record: Callable[[Callable[[TopicRecord], TopicRecord]], TopicRecord]
    write_identity: Callable[[TopicRecord], None]
    step_done: Callable[[Step], None]

    async def run(self, op: PendingOperation) -> TopicRecord | None:
        """Record ``op`` as the pending operation (refused if another one is, or the
        layout moved since it was planned), carry it out, and time it for the metrics.
        Who calls: the controller, holding its lock."""
        started = time.monotonic()
        self.update_record(lambda r: _with_pending(r, op))
        committed = await self.carry_out(op)
        self.parts.metrics.operation(op.kind, time.monotonic() - started)
        return committed

    async def carry_out(self, op: PendingOperation) -> TopicRecord | None:
        """Run, or resume, the pending ``op``; returns the record it committed (none
        after a delete). Who calls: ``run``, and a new incarnation's recovery."""
        steps = {
            OperationKind.CREATE: self._create,
            OperationKind.DELETE: self._delete,
            OperationKind.PRUNE: self._prune,
        }
        return await steps.get(OperationKind(op.kind), self._split_or_merge)(op)

    # --- one method per kind ---------------------------------------------------------

    async def _create(self, op: PendingOperation) -> TopicRecord:
        """Create the initial segments' storage and register their actors; their
        processes boot in the background (``actors.control.readiness``)."""
        fleet, topic, epoch = self.parts.fleet, self.parts.topic, self.parts.leader_epoch()
        active = list(self.parts.read_record().layout.active_segments.values())
        copies = self._replication()
        await asyncio.gather(
            *(fleet.create(s.name(topic), s, [], epoch, replication=copies) for s in active)
        )
        for segment in active:  # registered now, so admission counts them at once
            fleet.handle(segment.name(topic))
        fleet.replicas.due.set()  # their replicas are started and given roles now
        self.step_done(Step.CHILDREN_CREATED)
        record = self.update_record(lambda r: _cleared(r, op, r.layout))
        fleet.announce_layout()  # watchers of a name deleted before learn it is back
        return record

    async def _delete(self, op: PendingOperation) -> None:
        """Storage goes before metadata: a crash in between leaves the delete pending, and
        the next incarnation finishes it; the other order could leave files no record
        names."""
        catalog, fleet, topic = self.parts.catalog, self.parts.fleet, self.parts.topic
        await self.parts.coordinators.stop_all()
        segments = self.parts.read_record().layout.all_segments.values()
        epoch = self.parts.leader_epoch()
        await asyncio.gather(*(fleet.destroy(s.name(topic), epoch) for s in segments))
        await fleet.delete_incarnation()
        self.step_done(Step.STORAGE_DELETED)
        catalog.delete_topic(topic)
        fleet.announce_layout()  # watchers learn it is gone

    async def _prune(self, op: PendingOperation) -> TopicRecord:
        """Retention: the sealed roots' storage goes first, then the commit drops them
        from the DAG (a crash in between: the next incarnation deletes again, then
        prunes)."""
        layout = self.parts.read_record().layout
        for segment_id in op.parents:
            if segment_id in layout.all_segments:
                name = layout.get(segment_id).name(self.parts.topic)
                await self.parts.fleet.destroy(name, self.parts.leader_epoch())
        committed = self._commit(op)
        self.parts.fleet.announce_layout()
        return committed

    async def _split_or_merge(self, op: PendingOperation) -> TopicRecord:
        fleet, topic, epoch = self.parts.fleet, self.parts.topic, self.parts.leader_epoch()
        parents = [self._segment_name(p) for p in op.parents]
        found = await fleet.subscriptions_of(parents)
        subscriptions = self.subscriptions.with_cursors(found)
        self.step_done(Step.SUBSCRIPTIONS_FOUND)
        copies = self._replication()
        await asyncio.gather(
            *(
                fleet.create(
                    c.name(topic), _child_info(c, op), subscriptions, epoch, replication=copies
                )
                for c in op.children
            )
        )
        self.step_done(Step.CHILDREN_CREATED)
        sealed = SealedBy(tuple(c.segment_id for c in op.children), op.base_epoch + 1)
        for parent in parents:  # one after the other, as the merge protocol requires
            await fleet.terminate(parent, epoch, sealed)
        self.step_done(Step.PARENTS_SEALED)
        committed = self._commit(op)
        self.step_done(Step.COMMITTED)
        fleet.announce_layout()  # push, don't wait
        self.step_done(Step.ANNOUNCED)
        fleet.start_in_background([c.name(topic) for c in op.children])
        fleet.replicas.due.set()
        return committed

    # --- internals -------------------------------------------------------------------

    def _commit(self, op: PendingOperation) -> TopicRecord:
        """The one CAS that applies ``op`` to the layout and clears it as pending; the
        incarnation's ``topic.json`` follows it."""
        record = self.update_record(lambda r: _cleared(r, op, apply_operation(r.layout, op)))
        self.write_identity(record)
        return record

    def _replication(self) -> Replication:
        """The copies new segments get: the topic's policy over its namespace's default."""
        parts = self.parts
        default = parts.catalog.namespace_policy(parts.topic.namespace_path)
        return (parts.read_record().policy or TopicPolicy()).over(default).replicas

    def _segment_name(self, segment_id: int) -> SegmentName:
        info = self.parts.read_record().layout.all_segments.get(segment_id)
        if info is None:
            raise SegmentNotFoundError(
                f"segment {segment_id} is not in the layout of {self.parts.topic}"
            )
        return info.name(self.parts.topic)


def describe(op: PendingOperation, topic: object) -> str:
    """What ``op`` is, for a refusal: "splitting segment 3 of topic://a/b/c"."""
    ids = " and ".join(str(i) for i in op.parents)
    verb = {"split": "splitting", "merge": "merging"}.get(op.kind, op.kind)
    return f"{verb} segment{'s' if len(op.parents) > 1 else ''} {ids} of {topic}"


def _with_pending(record: TopicRecord, op: PendingOperation) -> TopicRecord:
    if record.pending_operation is not None:
        raise OperationInProgressError(
            f"a {record.pending_operation.kind} is still in progress on this topic"
        )
    if record.epoch != op.base_epoch:
        raise ConflictError("the layout changed while the operation was planned; retry")
    return record.model_copy(update={"pending_operation": op})


def _cleared(record: TopicRecord, op: PendingOperation, layout: SegmentLayout) -> TopicRecord:
    if record.pending_operation != op:
        raise OperationInProgressError(f"operation {op.request_id} is no longer the pending one")
    # Only split/merge results are what a client's retry is matched against.
    if op.kind in (OperationKind.CREATE, OperationKind.PRUNE):
        return record.with_layout(layout, pending_operation=None)
    done = completed(op, layout.epoch)
    recent = remembered(record.recent_operations, done)
    return record.with_layout(
        layout, pending_operation=None, last_operation=done, recent_operations=recent
    )


def _child_info(child: PlannedSegment, op: PendingOperation) -> SegmentInfo:
    """A split's or merge's child as the layout will name it once the operation commits."""
    rng = HashRange(start=child.start, end=child.end)
    return SegmentInfo.active(child.segment_id, rng, op.base_epoch + 1, op.parents)
