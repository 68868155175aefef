"""The scalable topic controller: the only writer of one topic's layout.

Leadership is owning the named actor plus a fencing epoch: every incarnation
compare-and-swap-increments the epoch at the topic's ``.../controller`` path,
stamps it into the topic record and announces it to every active segment. All
later writes carry it, so an older incarnation is refused by the metadata store
(its stamp no longer matches) and by segments (they saw a newer epoch).

Every layout change is first written down as a ``PendingOperation``; a new
incarnation finishes whatever its predecessor left half-done before serving
anything else (roll forward, never back).

Its only callers are the admin service and its own maintenance loop, both
presenting the cluster's internal credential. Every entry point checks the
credential it is given all the same (``actors.guard``): a handle that reaches
a client by some other path does not get it around the cluster's policy.

A topic's storage belongs to one topic incarnation, named when the topic is
created (``storage.topic_storage``); the controller keeps that incarnation's
``topic.json`` current, and can rebuild lost metadata from it and from what
every segment records about itself (``recover``, ``runtime.recovery``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.capacity import check_capacity
from actors.control.coordinators import TopicCoordinators
from actors.control.layout_operations import LayoutOperations, Step, describe
from actors.control.maintenance import TopicMaintenance
from actors.control.metadata_rebuild import MetadataRebuild
from actors.control.node_disks import check_replication
from actors.control.segment_admin import SegmentAdministration
from actors.control.segment_fleet import SegmentFleet
from actors.control.subscription_reset import reset_subscription
from actors.control.tiering import check_policy_tier
from actors.control.topic_parts import LayoutCommands, TopicParts
from actors.control.topic_subscriptions import TopicSubscriptions
from actors.guard import guard
from actors.metrics import ControllerMetrics
from runtime.auth import Permission
from runtime.config import ray_namespace
from runtime.errors import InvalidArgumentError, TopicAlreadyExistsError
from runtime.layout import SegmentLayout
from runtime.limits import check_room
from runtime.names import SegmentName, TopicName, validate_part
from runtime.operations import (
    OperationKind,
    PendingOperation,
    checked_request_id,
    new_request_id,
    plan_merge,
    plan_prune,
    plan_split,
)
from runtime.policy import TopicPolicy
from runtime.subscription import DEFAULT_GRACE_S, StartPosition, reset_target
from storage.catalog import Catalog, fenced
from storage.durability import Durability
from storage.records import SubscriptionMetadata, TopicRecord
from storage.topic_storage import (
    TopicIdentity,
    new_incarnation,
)

log = logging.getLogger(__name__)


class ScalableTopicController:
    """Leader logic for one topic; its host runs it as ``ScalableTopicControllerActor``
    (``actors.control.controller_host``)."""

    def __init__(self, topic: str, storage_root: str, durability: dict[str, Any]) -> None:
        self.topic = TopicName.parse(topic)
        self.storage_root = storage_root
        self.durability = Durability(**durability)
        self.catalog = Catalog()
        self.epoch = self.catalog.elect(self.topic)
        self.metrics = ControllerMetrics(self.topic)
        self.metrics.leader(self.epoch)
        self._lock = asyncio.Lock()
        self.fleet = SegmentFleet(
            self.topic,
            Path(storage_root),
            self.durability,
            self._forget_recovery,
            self.catalog,
            self.metrics,
        )
        self.coordinators = TopicCoordinators(self.topic)
        self._recovered = False
        self._fault_after_step: int | None = None
        self.subscriptions = TopicSubscriptions(self.parts, self._write_identity)
        self.segments = SegmentAdministration(self.parts)
        self.rebuild = MetadataRebuild(
            self.parts, self._raise_epoch, self._recover_from_start, self._write_identity
        )
        self.operations = LayoutOperations(
            self.parts,
            self.subscriptions,
            self._update_record,
            self._write_identity,
            self._step_done,
        )

    @property
    def parts(self) -> TopicParts:
        """What this controller's helpers are given (``actors.control.topic_parts``)."""
        return TopicParts(
            self.topic,
            self.catalog,
            self.fleet,
            self.coordinators,
            self.metrics,
            leader_epoch=lambda: self.epoch,
            read_record=self.catalog_record,
        )

    def catalog_record(self) -> TopicRecord:
        """The topic's record (it must exist)."""
        return self.catalog.require_topic(self.topic)

    def _forget_recovery(self) -> None:
        """The next call's ``_recover`` starts every active segment's actor again."""
        self._recovered = False

    # --- leadership --------------------------------------------------------------

    def _check(self, credential: str | None, action: Permission = Permission.ADMIN) -> None:
        guard().check(credential, action, self.topic.namespace_path)

    async def ready(self, *, credential: str | None = None) -> dict[str, Any]:
        """Finish recovery; returns who leads and at which epoch."""
        self._check(credential, Permission.LOOKUP)
        return await self._ready()

    async def wake_segment(self, segment_id: int, *, credential: str | None = None) -> bool:
        """Start the actor of a tiered segment of the layout whose process exited while
        idle (``SegmentFleet.wake``); False when the segment does not hibernate."""
        self._check(credential, Permission.LOOKUP)
        record = self._read_record()
        info = record.layout.all_segments.get(segment_id)
        if info is None:
            return False
        if record.incarnation != self.fleet.incarnation:
            await self._ready()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.fleet.wake, info.name(self.topic))

    async def check_replicas(self, *, credential: str | None = None) -> None:
        """A follower lost its connection to its leader: the next replica round comes at
        once (``actors.segment.replication``)."""
        self._check(credential, Permission.ADMIN)
        self.fleet.replicas.due.set()

    async def _ready(self) -> dict[str, Any]:
        async with self._lock:
            await self._recover()
        return {"topic": str(self.topic), "leaderEpoch": self.epoch, "pid": os.getpid()}

    async def _recover(self) -> None:
        """Stamp our epoch, fence the segments, finish interrupted work. Idempotent."""
        record = self._read_record(required=False)
        if record is None:
            return
        if record.incarnation != self.fleet.incarnation:
            self.fleet.incarnation, self._recovered = record.incarnation, False
        if self._recovered and record.pending_operation is None:
            return
        record = self._update_record(lambda r: r)
        pending = record.pending_operation
        if pending is None or pending.kind != OperationKind.DELETE:
            # a delete's segments may be gone already; its steps pass the epoch themselves
            active = [s.name(self.topic) for s in record.layout.active_segments.values()]
            await self.fleet.fence(active, self.epoch)
        if record.pending_operation is not None:
            await self.operations.carry_out(record.pending_operation)
        await self.subscriptions.finish_all()
        self._recovered = True

    # --- topic lifecycle -----------------------------------------------------------

    async def create(
        self,
        num_segments: int,
        properties: dict[str, str] | None = None,
        *,
        request_id: str | None = None,
        credential: str | None = None,
    ) -> dict:
        """Write the epoch-0 layout (with the create recorded) and its segments' storage, then
        register their actors with Ray without waiting for them to boot (``readiness``).
        The create of ``request_id`` sent again is answered with the topic it made (a
        pending one finished first); any other create of an existing topic is refused."""
        self._check(credential)
        rid = checked_request_id(request_id)
        if self.catalog.topic_exists(self.topic):
            return await self._created_by(rid)
        layout = SegmentLayout.initial(num_segments, properties)
        check_room(self.catalog, self.topic, num_segments, new_topic=True)
        check_capacity(f"creating {self.topic}", self.topic, num_segments)
        await self._check_replication(self._namespace_policy())
        op = PendingOperation(kind=OperationKind.CREATE, request_id=rid, base_epoch=0)
        record = TopicRecord.new(
            layout, new_incarnation(), self.epoch, pending_operation=op, created_by=rid
        )
        async with self._lock:
            self.catalog.create_topic(self.topic, record)
            self.fleet.incarnation = record.incarnation
            await self.fleet.clear_leftovers()
            await self.coordinators.stop_all()
            self._write_identity(record)
            await self.operations.carry_out(op)
            self._recovered = True
        return self._read_record().layout.to_dict()

    async def _created_by(self, request_id: str) -> dict:
        """The topic, if ``request_id``'s create made it; else ``TopicAlreadyExistsError``."""
        async with self._lock:
            await self._recover()
            record = self._read_record()
        if record.created_by != request_id:
            raise TopicAlreadyExistsError(f"topic {self.topic} already exists")
        return record.layout.to_dict()

    async def delete(self, *, credential: str | None = None) -> None:
        self._check(credential)
        async with self._lock:
            await self._recover()
            op = PendingOperation(
                kind=OperationKind.DELETE, request_id=new_request_id(), base_epoch=0
            )
            self._update_record(lambda r: r.model_copy(update={"pending_operation": op}))
            await self.operations.carry_out(op)

    async def recover(
        self,
        incarnation: str | None = None,
        *,
        request_id: str | None = None,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Rebuild the lost metadata of this topic from its storage
        (``actors.control.metadata_rebuild``); refused while the topic has live metadata,
        but for the rebuild of ``request_id`` sent again, which is finished and answered."""
        self._check(credential)
        async with self._lock:
            return await self.rebuild.rebuild(incarnation, checked_request_id(request_id))

    def _namespace_policy(self) -> TopicPolicy:
        return self.catalog.namespace_policy(self.topic.namespace_path) or TopicPolicy()

    async def _check_replication(self, policy: TopicPolicy) -> None:
        """Refuse a replication factor the cluster's nodes cannot hold, before any change."""
        await asyncio.to_thread(
            check_replication, policy, self.topic.namespace_path, str(self.fleet.cluster_root)
        )

    def _raise_epoch(self, at_least: int) -> int:
        """Lead at an epoch of at least ``at_least`` (a rebuild's: above every fence)."""
        self.epoch = self.catalog.elect(self.topic, at_least=at_least)
        self.metrics.leader(self.epoch)
        return self.epoch

    async def _recover_from_start(self) -> None:
        self._recovered = False
        await self._recover()

    # --- split / merge ---------------------------------------------------------------

    async def split_segment(
        self,
        segment_id: int,
        request_id: str | None = None,
        at: int | list[int] | None = None,
        parts: int | None = None,
        *,
        credential: str | None = None,
    ) -> dict:
        """``at``: where the children after the first start; ``parts``: how many near-equal
        children (default: two halves)."""
        self._check(credential)
        return await self._change_layout(
            request_id, lambda layout, rid: plan_split(layout, segment_id, rid, at, parts)
        )

    async def merge_segments(
        self,
        segment_id1: int,
        segment_id2: int,
        request_id: str | None = None,
        more_segment_ids: list[int] | None = None,
        *,
        credential: str | None = None,
    ) -> dict:
        """``more_segment_ids``: further neighbours merged in the same operation."""
        self._check(credential)
        more = more_segment_ids or ()
        return await self._change_layout(
            request_id,
            lambda layout, rid: plan_merge(layout, segment_id1, segment_id2, rid, more),
        )

    async def prune_segments(
        self, segment_ids: list[int], *, credential: str | None = None
    ) -> list[int]:
        """Retention: delete sealed root segments' storage, then drop them from the DAG.

        Storage goes first: a crash in between leaves the plan pending and the
        next incarnation deletes (idempotently) and prunes; the other order
        could leave files that no record names any more.
        """
        self._check(credential)
        async with self._lock:
            await self._recover()
            op = plan_prune(self._read_record().layout, segment_ids, new_request_id())
            await self.operations.run(op)
        return list(op.parents)

    async def set_policy(
        self, policy: dict[str, Any], *, credential: str | None = None
    ) -> dict[str, Any]:
        """Replace the topic's policy (validated first, so nothing is half-applied)."""
        self._check(credential)
        parsed = TopicPolicy.parse(policy)
        await check_policy_tier(parsed)
        default = self.catalog.namespace_policy(self.topic.namespace_path)
        await self._check_replication(parsed.over(default))
        async with self._lock:
            await self._recover()
            self._write_identity(
                self._update_record(lambda r: r.model_copy(update={"policy": parsed}))
            )
        self.fleet.replicas.due.set()  # the next maintenance round applies it at once
        return parsed.shown()

    async def _change_layout(
        self, request_id: str | None, plan: Callable[[SegmentLayout, str], PendingOperation]
    ) -> dict:
        request_id = checked_request_id(request_id)
        async with self._lock:
            await self._recover()
            record = self._read_record()
            done = record.completed_operation(request_id)
            if done is not None:
                return done.model_dump(by_alias=True)  # a retry of what already happened
            op = plan(record.layout, request_id)
            added = len(op.children) - len(op.parents)
            if added > 0:
                active_now = len(record.layout.active_segments)
                check_room(self.catalog, self.topic, added, active_now=active_now)
            # Sealed parents keep their actors (they serve their backlog), so every child
            # is a new process.
            check_capacity(describe(op, self.topic), self.topic, len(op.children))
            committed = await self.operations.run(op)
            return committed.last_operation.model_dump(by_alias=True)

    # --- subscriptions ---------------------------------------------------------------

    async def create_subscription(
        self,
        name: str,
        position: StartPosition = "earliest",
        session_grace_s: float = DEFAULT_GRACE_S,
        *,
        owner: str | None = None,
        request_id: str | None = None,
        credential: str | None = None,
    ) -> None:
        """``owner``: the principal creating it (``SubscriptionMetadata.owner``); the create
        of ``request_id`` sent again finishes the subscription it made."""
        self._check(credential, Permission.CONSUME)
        validate_part("subscription", name)
        if position not in ("earliest", "latest"):
            raise InvalidArgumentError(f"position must be 'earliest' or 'latest', not {position!r}")
        if not isinstance(session_grace_s, int | float) or session_grace_s <= 0:
            raise InvalidArgumentError(f"session_grace_s must be > 0, got {session_grace_s!r}")
        async with self._lock:
            await self._recover()
            self._read_record()
            meta = SubscriptionMetadata(
                name=name, position=position, session_grace_s=session_grace_s, owner=owner,
                created_by=checked_request_id(request_id),
            )  # fmt: skip
            await self.subscriptions.create(meta)

    async def delete_subscription(
        self, name: str, *, only_of: str | None = None, credential: str | None = None
    ) -> None:
        """``only_of``: delete only if principal ``only_of`` created it (the admin service
        asks so for a caller that may consume but not administer)."""
        self._check(credential)
        async with self._lock:
            await self._recover()
            await self.subscriptions.delete(name, only_of)

    async def reset_subscription(
        self, name: str, to: object, *, credential: str | None = None
    ) -> dict[str, Any]:
        """Move subscription ``name`` to ``to`` on every segment (``actors.
        subscription_reset``): ``"earliest"``, ``"latest"`` or a publish time (ms)."""
        self._check(credential, Permission.CONSUME)
        target = reset_target(to)
        async with self._lock:
            await self._recover()
            return await reset_subscription(self.parts, name, target)

    # --- segment administration (docs/reference/admin.md) --------------------------

    async def create_segment(
        self, segment: str, subscriptions: list[str], *, credential: str | None = None
    ) -> None:
        """Create a segment outside the layout (the internal Segments API)."""
        self._check(credential)
        name = self._own_segment(segment)
        async with self._lock:
            await self._recover()
            await self.segments.create(name, subscriptions)

    async def terminate_segment(
        self, segment: str, force: bool = False, *, credential: str | None = None
    ) -> int:
        """Seal a segment of the layout; an ACTIVE one only with ``force`` (producers to
        its range then wait for a layout change, so this is an operator's last resort)."""
        self._check(credential)
        name = self._own_segment(segment)
        async with self._lock:
            await self._recover()
            return await self.segments.terminate(name, force)

    async def delete_segment(
        self, segment: str, force: bool = False, *, credential: str | None = None
    ) -> None:
        self._check(credential)
        name = self._own_segment(segment)
        async with self._lock:
            await self._recover()
            await self.segments.delete(name, force)

    # --- fault injection (crash tests and chaos) -------------------------------------

    def inject_fault_after_step(self, step: int | None, *, credential: str | None = None) -> None:
        """Make this process die right after protocol step ``step`` of the next operation."""
        self._check(credential)
        self._fault_after_step = step

    def _step_done(self, step: Step) -> None:
        if self._fault_after_step == step:
            os._exit(1)

    # --- internals -------------------------------------------------------------------

    def _read_record(self, required: bool = True) -> TopicRecord | None:
        if required:
            return self.catalog.require_topic(self.topic)
        return self.catalog.topic(self.topic)

    def _update_record(self, mutate: Callable[[TopicRecord], TopicRecord]) -> TopicRecord:
        """Fenced read-modify-CAS of the topic record, retried on lost races."""
        return self.catalog.update_topic(self.topic, fenced(self.epoch, self.topic, mutate))

    def _own_segment(self, segment: str) -> SegmentName:
        name = SegmentName.parse(segment)
        if name.topic != self.topic:
            raise InvalidArgumentError(f"{segment} does not belong to {self.topic}")
        return name

    def _write_identity(self, record: TopicRecord | None = None) -> None:
        """Rewrite the incarnation's ``topic.json``: what recovery needs beyond the
        segments' own records (properties, policy, the layout epoch, subscription
        settings). Written after the metadata change it mirrors, so it may lag one
        change behind, never run ahead."""
        record = record or self._read_record()
        subscriptions = self.subscriptions.settings()
        self.fleet.write_identity(
            TopicIdentity(
                topic=str(self.topic),
                incarnation=record.incarnation,
                ray_namespace=ray_namespace(),
                created_at_ms=record.created_at_ms,
                epoch=record.epoch,
                next_segment_id=record.next_segment_id,
                properties=dict(record.properties),
                policy=record.policy.to_dict() if record.policy is not None else None,
                subscriptions=subscriptions,
            )
        )


class ScalableTopicControllerActor(ScalableTopicController):
    """The controller as its host runs it (``actors.control.controller_host``): it also
    runs the maintenance loop from the start, so a restarted incarnation keeps scaling and
    retaining without being called."""

    def __init__(self, topic: str, storage_root: str, durability: dict[str, Any]) -> None:
        super().__init__(topic, storage_root, durability)
        # Made in its host's event loop. A restarted incarnation recovers at once
        # (finishes its predecessor's operation, starts missing segment actors) instead
        # of waiting for a call: producers and consumers never call the controller.
        self._recovery = asyncio.get_running_loop().create_task(self._recover_in_background())

        token = guard().internal_token  # the cluster's own credential, read at each call
        commands = LayoutCommands(
            split=lambda i: self.split_segment(i, credential=token()),
            merge=lambda i, j: self.merge_segments(i, j, credential=token()),
            prune=lambda ids: self.prune_segments(ids, credential=token()),
        )
        self.maintenance = TopicMaintenance(self.parts, commands)
        self._maintenance = self.maintenance.start()

    def autoscale_status(self, *, credential: str | None = None) -> dict[str, Any]:
        """What the autoscaler could not do (``heldBack``: the last split or merge the
        policy wanted that the cluster had no room for, until one succeeds), and the last
        time it kept the layout for more stream consumers than segments (``rebucket``:
        they share segments by key bucket instead); and each replicated active segment's
        replicas as the last round saw them (``replicas``, by segment id)."""
        self._check(credential, Permission.LOOKUP)
        replicas = self.fleet.replicas.views()
        return {
            "heldBack": self.maintenance.held_back,
            "rebucket": self.maintenance.rebucket,
            "replicas": replicas,
        }

    async def stop(self) -> None:
        """End this controller's background work: its topic was deleted, and its host
        stops running it. A layout change under way is not cut: it holds the lock."""
        self.maintenance.stop()
        for task in (self._maintenance, self._recovery):
            task.cancel()
        async with self._lock:
            pass

    async def _recover_in_background(self) -> None:
        try:
            await self._ready()
        except Exception:  # the next call recovers (and reports) instead
            log.exception("%s: recovery at start failed", self.topic)
