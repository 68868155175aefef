"""The segments of one topic incarnation, as its controller brings them into being and ends them.

The controller decides *what* happens to a layout; this module is *how* one
segment comes and goes: its storage is laid out, identity first, before any
actor opens it; its actor is started (in the background for a split's children);
an actor left running by another incarnation of the same name is replaced, never
served; its storage is removed when it goes. Keeping that in one place is what
makes "a segment opens only storage of its own incarnation" one rule, not a
convention spread over the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.control.dag_watch import ACTOR_NAME as DAG_WATCH
from actors.control.node_disks import NodeDisks
from actors.control.replica_keeper import ReplicaKeeper
from actors.control.resting_segments import RestingSegments
from actors.control.segment_calls import SegmentCalls
from actors.guard import guard
from actors.metrics import ControllerMetrics
from actors.registry import lookup, named_actors
from actors.segment.directory import SegmentDirectory
from actors.segment.handle import SegmentHandle
from actors.segment.host import close_segment, start_segment_actor
from actors.segment.lookup import segment_actor, served_segments
from runtime.errors import SegmentNotFoundError, UnavailableError
from runtime.hibernation import HibernationMarks
from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName
from runtime.remote import ACTOR_GONE, reach
from runtime.replication import Replication
from runtime.segment_hosts import host_prefix, hosts_per_namespace
from storage.asleep import SleepingSegments
from storage.catalog import Catalog
from storage.durability import Durability, node_storage_root, storage_scope
from storage.incarnation_storage import IncarnationStorage
from storage.placements import SegmentPlacements
from storage.segment_store import SealedBy
from storage.topic_storage import StoredIncarnation, TopicIdentity, scan, write_topic_identity

log = logging.getLogger(__name__)

ONE_COPY = Replication()
# How long a layout operation waits for a replicated segment's actor that cannot be
# reached: a lost leader's grace and an election round, with room (a split waits 120 s).
TAKEOVER_WAIT_S = 30.0


class SegmentFleet(SegmentCalls, RestingSegments):
    """Segment actors and storage of ``topic``'s current incarnation (``incarnation``)."""

    def __init__(
        self,
        topic: TopicName,
        storage_root: Path,
        durability: Durability,
        on_start_failure: Callable[[], None],
        catalog: Catalog,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.topic = topic
        self._catalog = catalog
        self.cluster_root = Path(storage_root)  # what the segments' actors are given
        # With a disk per node, each segment is on one node's disk (``actors.control.node_disks``);
        # what the controller keeps itself (``topic.json``) goes to its own node's.
        self.disks = NodeDisks(topic, self.cluster_root, durability, catalog.store.namespace)
        self.node_local = storage_scope() == "node"
        self.replicas = ReplicaKeeper(
            topic, self.disks, catalog.store, self._current, durability, metrics
        )
        self.hosts = hosts_per_namespace()  # the operator's setting, checked when the fleet starts
        self.root = node_storage_root(storage_root) if self.node_local else self.cluster_root
        self.durability = durability
        self.incarnation: str | None = None
        self._on_start_failure = on_start_failure
        self._watch_handles: dict[SegmentName, SegmentHandle] = {}
        self._starting: set[asyncio.Future] = set()
        # Bumped by every change the fleet makes to a tiered segment's record itself, so
        # an observer caching records knows to read them again.
        self.records_changed = 0
        self._marks = HibernationMarks()  # ended (or found without a process), not since started

    # --- handles -------------------------------------------------------------------------

    def handle(self, name: SegmentName) -> SegmentHandle:
        """The segment's actor, started (on its existing storage) if it is not running: on
        the node whose disk has it, when every node keeps its own (``UnavailableError``
        while no live node has that disk). Blocking: GCS round trips; called from a
        worker thread too (a reader's ``wake``), beside ``observe`` (``HibernationMarks``)."""
        self._marks.starting(name)
        try:
            node = None
            if self.node_local:
                running = self.running(name)
                if running is not None:
                    return running
                tiered = self.storage().tiered(name.segment_id) is not None
                node = None if tiered else self.disks.node_of_segment(name, self.placements())
            return start_segment_actor(
                name,
                storage_root=str(self.cluster_root),
                durability=self.durability,
                incarnation=self._current(),
                node=node,
                hosts=self.hosts,
            )
        finally:
            self._marks.started(name)

    def running(self, name: SegmentName) -> SegmentHandle | None:
        """The segment's actor if one runs now (never started by asking)."""
        try:
            return segment_actor(name)
        except ValueError:
            return None

    def watched(self, name: SegmentName) -> SegmentHandle | None:
        """Handles for the maintenance rounds, cached: a lookup per segment per round would
        cost a GCS round trip each. Looked up, never started: observing must not bring back
        a segment an operator stopped (``None`` then, and the round goes on without it)."""
        handle = self._watch_handles.get(name)
        if handle is None:
            try:
                handle = self._watch_handles[name] = segment_actor(name)
            except ValueError:
                return None
        return handle

    def forget(self, name: SegmentName) -> None:
        """Look ``name`` up afresh next time (its actor died or was replaced)."""
        self._watch_handles.pop(name, None)

    # --- creating -----------------------------------------------------------------------

    async def create(
        self,
        name: SegmentName,
        info: SegmentInfo,
        subscriptions: list[str],
        epoch: int,
        *,
        in_layout: bool = True,
        replication: Replication = ONE_COPY,
    ) -> None:
        """Protocol step 2 for one segment: storage with every cursor at Earliest; with
        ``replication`` of more than one copy (a disk per node only), on that many nodes
        (``actors.control.replica_keeper``).

        A new segment's storage is laid out here, directly on the shared storage
        root, so the segment exists (and is fenced) before metadata names it. The
        caller starts its actor: a split's or merge's children only after the
        layout commit, in the background (booting an actor's process costs more
        CPU than the whole protocol). A segment whose actor already runs for this
        incarnation (a resumed operation) is served through the actor; one running
        for another incarnation is stopped first.
        """
        handle = await self._own_actor(name)
        if handle is None and self.node_local:
            replicated = replication.factor > 1
            node = await self.disks.place(
                name, info, self.placements(), lambda: set(self.storage().records.segment_ids()),
                leader=replicated,
            )  # fmt: skip
            await self.disks.lay_out(
                node, self._current(), name, info, subscriptions, epoch, in_layout, replicated
            )
            if replicated:
                leader = self.placements().get(name.segment_id)
                await self.replicas.place(
                    name, info, leader, replication, subscriptions, epoch, in_layout
                )
            return
        if handle is None:
            self.storage().lay_out(name, info, subscriptions, epoch, in_layout=in_layout)
            return
        await handle.check_epoch.remote(epoch, credential=guard().internal_token())
        await asyncio.gather(
            *(
                handle.create_subscription.remote(
                    s, "earliest", epoch, credential=guard().internal_token()
                )
                for s in subscriptions
            )
        )

    def start_in_background(self, names: list[SegmentName]) -> None:
        """Start committed segments' actors without making the operation wait: registering
        an actor is a blocking GCS round trip per segment, and nothing in the operation
        needs it. A crash before they are started is repaired by the next incarnation's
        recovery, which starts every active segment's actor."""
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(None, lambda: [self.handle(n) for n in names])
        self._starting.add(starting)
        starting.add_done_callback(self._started)

    async def settle(self) -> None:
        """Wait for background starts (a late start must not outlive a deletion)."""
        await asyncio.gather(*self._starting, return_exceptions=True)

    async def terminate(self, name: SegmentName, epoch: int, sealed: SealedBy) -> int:
        """Seal a segment naming its successors (``_reach``)."""
        token = guard().internal_token()
        return await self._reach(
            name, lambda handle: handle.terminate.remote(epoch, tuple(sealed), credential=token)
        )

    async def seal(self, name: SegmentName, epoch: int) -> int:
        """Seal a segment with no successors named (the Segments API's terminate)."""
        token = guard().internal_token()
        return await self._reach(
            name, lambda handle: handle.terminate.remote(epoch, credential=token)
        )

    async def _reach(self, name: SegmentName, call: Callable[[SegmentHandle], Any]) -> Any:
        """``call`` of the segment's actor; ``UnavailableError`` if it cannot be reached. A
        replicated segment's is asked again for ``TAKEOVER_WAIT_S``: a leader whose node
        is gone is replaced by the next maintenance round, which runs beside layout
        operations and recovery (its host is pinned to the lost node until then). An
        operation refused stays recorded, and the next call resumes it."""
        try:
            return await reach(str(name), lambda: call(self.handle(name)))
        except UnavailableError:
            if not self._replicated(name):
                raise
        return await reach(str(name), lambda: call(self.handle(name)), TAKEOVER_WAIT_S)

    def _replicated(self, name: SegmentName) -> bool:
        return self.node_local and self.replicas.sets().get(name.segment_id) is not None

    async def fence(self, names: list[SegmentName], epoch: int) -> None:
        """Announce a new leader's ``epoch`` to the segments: each refuses older ones
        (a replicated one whose leader is being replaced is waited for: ``_reach``)."""
        token = guard().internal_token()
        await asyncio.gather(*(
            self._reach(n, lambda handle: handle.check_epoch.remote(epoch, credential=token))
            for n in names
        ))  # fmt: skip

    async def subscriptions_of(self, names: list[SegmentName]) -> set[str]:
        """The subscriptions that have a cursor on any of ``names`` (``_reach``)."""
        token = guard().internal_token()
        found = await asyncio.gather(*(
            self._reach(n, lambda handle: handle.subscriptions.remote(credential=token))
            for n in names
        ))  # fmt: skip
        return {subscription for names in found for subscription in names}

    def announce_layout(self) -> None:
        """Tell the DAG watch the layout changed (pushed to its watchers; not waited for).
        No DAG watch running: nobody is watching, and none is started for this."""
        try:
            watch = lookup(DAG_WATCH)
        except ValueError:
            return
        watch.notify.remote(str(self.topic), credential=guard().internal_token())

    # --- removing -----------------------------------------------------------------------

    async def destroy(self, name: SegmentName, epoch: int) -> None:
        """Stop the segment's actor (if any) and remove its storage; safe to repeat."""
        await self.settle()
        self.forget(name)
        with contextlib.suppress(ValueError):
            handle = segment_actor(name)
            with contextlib.suppress(*ACTOR_GONE, SegmentNotFoundError):
                await handle.delete.remote(epoch, credential=guard().internal_token())
            with contextlib.suppress(*ACTOR_GONE):
                await close_segment(handle, guard().internal_token())
        self.sleeping().woken(name.segment_id)
        if not self.node_local:
            self.storage().delete_segment(name)
            return
        self.storage().delete_tiered(name)
        await self.replicas.destroy(name)
        disk = self.placements().get(name.segment_id)
        node = disk and await asyncio.to_thread(self.disks.node_of, disk)
        if node:
            await self.disks.remove(node, self._current(), name)
        elif disk:
            log.warning("%s: node disk %s is not in the cluster; its files stay there", name, disk)
        self.placements().delete(name.segment_id)

    def leftover_segments(self) -> int:
        """How many segments of this topic's name are served (what ``clear_leftovers``
        would stop, so the room they hold counts as free for the incarnation starting)."""
        return len(served_segments(self.topic))

    async def clear_leftovers(self) -> None:
        """Close every segment of this topic's name in its namespace's hosts, and forget
        where its segments were served (its coordinators: ``TopicCoordinators.stop_all``).

        Called when an incarnation starts (create, recover): no segment can belong
        to it yet, so any that is served was left by an earlier incarnation whose
        metadata is gone, and must not be found by clients looking up names.
        """
        await self._stop_serving()
        self.replicas.forget()

    async def delete_incarnation(self) -> None:
        """Close the topic's segments in their hosts (they are gone) and remove what is left
        of the incarnation's directory (its ``topic.json``), on every live node's disk when
        each node keeps its own."""
        await self._stop_serving()
        self.storage().delete()
        self.sleeping().delete_all()
        if self.node_local:
            nodes = await asyncio.to_thread(self.disks.live)
            current = self._current()
            await asyncio.gather(*(self.disks.remove(n, current, None) for n in nodes.values()))
            self.placements().delete_all()

    def delete_segment_storage(self, name: SegmentName) -> None:
        """Storage no actor serves (a recovery's discarded, never committed segment)."""
        self.storage().delete_segment(name)

    # --- the incarnation's own records ----------------------------------------------------

    def write_identity(self, identity: TopicIdentity) -> None:
        write_topic_identity(self.root, identity)

    def stored(self) -> list[StoredIncarnation]:
        """Every incarnation of this topic name found under the storage root."""
        return scan(self.root, self.topic)

    def storage(self) -> IncarnationStorage:
        """The current incarnation's storage: every layout and removal goes through it."""
        return IncarnationStorage(self.root, self.topic, self._current(), self.durability)

    def sleeping(self) -> SleepingSegments:
        """The drained sealed segments whose actors exited, with their last stats."""
        return SleepingSegments(self._catalog.store, self.topic, self._current())

    def placements(self) -> SegmentPlacements:
        """Which node disk holds each local segment (storage scope ``node``)."""
        return SegmentPlacements(self._catalog.store, self.topic, self._current())

    # --- internals ----------------------------------------------------------------------

    def _current(self) -> str:
        if self.incarnation is None:
            raise UnavailableError(f"{self.topic}: no incarnation known yet (metadata not read)")
        return self.incarnation

    async def _own_actor(self, name: SegmentName) -> SegmentHandle | None:
        """The served segment ``name`` if it serves this incarnation; any other is closed,
        and so is an entry whose storage is not there (registered by an attempt that
        did not lay it out)."""
        try:
            handle = segment_actor(name)
        except ValueError:
            return None
        try:
            status = await handle.ready.remote(credential=guard().internal_token())
        except (*ACTOR_GONE, SegmentNotFoundError):
            status = None
        if status is not None and status.get("incarnation") == self.incarnation:
            return handle
        self.forget(name)
        with contextlib.suppress(*ACTOR_GONE, SegmentNotFoundError):
            await close_segment(handle, guard().internal_token())
        return None

    async def _stop_serving(self) -> None:
        """Have the namespace's segment hosts close every segment of this topic's name (they
        serve other topics too), and forget where its segments were served."""
        await self.settle()
        self._watch_handles.clear()
        token, at = guard().internal_token(), time.time_ns()
        hosts = []
        for name in named_actors(host_prefix(self.topic)):
            with contextlib.suppress(ValueError):
                hosts.append(lookup(name))
        closing = [h.close_topic.remote(str(self.topic), at, credential=token) for h in hosts]
        for result in await asyncio.gather(*closing, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, ACTOR_GONE):
                log.warning("%s: a segment host did not close the topic: %r", self.topic, result)
        SegmentDirectory().remove_topic(self.topic)

    def _started(self, starting: asyncio.Future) -> None:
        self._starting.discard(starting)
        if starting.cancelled() or starting.exception() is None:
            return
        log.error("%s: starting new segments' actors failed: %s", self.topic, starting.exception())
        self._on_start_failure()
