"""The replicas of a topic's replicated segments, as its controller keeps them.

A segment created under a replication policy is laid out on ``factor`` node disks, each
of a node of its own (``place``), recorded in its replica set (``storage.replica_sets``)
before any of it runs, and served by a host on each node: the leader's entry is the one
clients find, the followers' are replica entries. Every replica starts without a role and
serves nobody (``storage.replica_state``) until the controller gives it one.

Each maintenance round (``round``) asks every replica of every replicated active segment
what it is, and carries out what ``runtime.replica_plan`` decides: the first election of a
new segment (it keeps the placement's leader; followers lost before it are replaced), a
failover when the leader's node is lost, a follower told its role again after its host
restarted, a lost follower replaced by a new one on a free node, which copies the
leader's log from its start. Elections are
``actors.control.replica_election``'s. A replica that stays silent past its grace
(``RAYTOPICS_REPLICA_GRACE_S``) counts as lost even while Ray still lists its node: a
stopped process holds no lease, and when it resumes it is fenced.

Who calls: the topic's ``SegmentFleet`` (placing, starting, removing) and its maintenance
(``round``). What it affects: which replica leads, where clients are sent, and the
replication part of stats and metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.control.node_disks import NodeDisks
from actors.control.replica_asks import Asked, ask_replicas
from actors.control.replica_election import HostReplicaCalls, elect
from actors.control.replica_retirement import RetiringReplicas
from actors.control.replica_views import replica_view, replication_gauges
from actors.guard import guard
from actors.metrics import ControllerMetrics
from actors.registry import live_nodes
from actors.segment.handle import SegmentHandle
from actors.segment.host import start_segment_actor
from runtime.config import env_float
from runtime.errors import BadVersion, ScalableTopicsError
from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName
from runtime.placement import choose_disks
from runtime.replica_plan import (
    Elect,
    HandOver,
    Rebuild,
    Replace,
    Resize,
    RoleAnswer,
    Step,
    Tell,
    Unavailable,
    hand_over_steps,
    next_steps,
    resize_steps,
)
from runtime.replication import FIRST_EPOCH, Replication
from storage.durability import Durability
from storage.metadata import MetadataStore
from storage.placements import SegmentPlacements
from storage.replica_sets import ReplicaSet, ReplicaSets

log = logging.getLogger(__name__)

GRACE_ENV = "RAYTOPICS_REPLICA_GRACE_S"
DEFAULT_GRACE_S = 5.0
# A replica started by a round is given this long to open before it is started again.
START_WAIT_S = 10.0
# How often the nodes are asked for their disks again while one of them is gone.
ASK_AGAIN_S = 5.0
# A lead on the controller's own node is handed to an in-sync follower elsewhere; the
# leader waits this long for it to hold everything, and a failed try is not repeated
# for a while (each try sends the segment's producers and readers away for a moment).
HAND_OVER_WAIT_S = 2.0
HAND_OVER_EVERY_S = 30.0


@dataclass
class _Watch:
    """What the rounds remember of one segment."""

    descriptor: str = ""  # as metrics tag a segment (0000-7fff-3)
    silent_since: dict[str, float] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    view: list[dict[str, Any]] = field(default_factory=list)
    endpoints: dict[str, tuple[str, int]] = field(default_factory=dict)  # data planes
    committed: int | None = None  # the leader's high watermark, as the last round saw it
    hand_over_after: float = 0.0  # when a lead on the controller's node may move again
    unavailable: str | None = None


class ReplicaKeeper(RetiringReplicas):
    """The replicas of one topic incarnation's replicated segments."""

    def __init__(
        self,
        topic: TopicName,
        disks: NodeDisks,
        store: MetadataStore,
        incarnation: Callable[[], str],
        durability: Durability,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.topic, self._disks, self._store = topic, disks, store
        self._incarnation, self._durability = incarnation, durability
        self.metrics = metrics
        self._watches: dict[int, _Watch] = {}
        self._asked_at = float("-inf")  # when the nodes were last asked for their disks
        # Set when segments were created or the policy changed: the next maintenance
        # round comes at once, so that new replicas start and a leader is elected (or a
        # new policy's pace holds) without waiting out a round's pause.
        self.due = asyncio.Event()

    def sets(self) -> ReplicaSets:
        return ReplicaSets(self._store, self.topic, self._incarnation())

    # --- placing and starting -------------------------------------------------------

    async def place(
        self,
        name: SegmentName,
        info: SegmentInfo,
        leader: str,
        replication: Replication,
        subscriptions: list[str],
        epoch: int,
        in_layout: bool,
    ) -> ReplicaSet:
        """Choose the followers' disks (each of another node than ``leader``'s and of each
        other, the least loaded first), record the replica set, and lay the followers out
        on their nodes. A resumed operation finds the set recorded and lays out the same."""
        sets = self.sets()
        found = sets.get(name.segment_id)
        if found is None:
            live = await asyncio.to_thread(self._disks.live)
            load = {disk: 0 for disk in sorted(live) if disk != leader}
            for segment_id in sets.segment_ids():
                held = sets.get(segment_id)
                for disk in held[0].replicas if held else ():
                    if disk in load:
                        load[disk] += 1
            replication.check_nodes(len(load) + 1)
            followers = choose_disks(load, replication.factor - 1)
            recorded = sets.create(name.segment_id, ReplicaSet(FIRST_EPOCH, (leader, *followers)))
        else:
            recorded = found[0]
        await asyncio.gather(
            *(
                self._lay_out(disk, name, info, subscriptions, epoch, in_layout)
                for disk in recorded.followers
            )
        )
        return recorded

    async def _lay_out(
        self,
        disk: str,
        name: SegmentName,
        info: SegmentInfo,
        subscriptions: list[str],
        epoch: int,
        in_layout: bool,
    ) -> None:
        node = await asyncio.to_thread(self._disks.node_of, disk)
        if node is None:
            raise self._disks.unavailable(name, disk)
        await self._disks.lay_out(
            node, self._incarnation(), name, info, subscriptions, epoch, in_layout, True
        )

    def _start(self, name: SegmentName, node: str, leader: bool) -> SegmentHandle:
        """Open the replica on ``node``'s disk in that node's host: the leader's entry is
        the one clients find. Blocking: GCS round trips."""
        return start_segment_actor(
            name,
            storage_root=self._disks.cluster_root,
            durability=self._durability,
            incarnation=self._incarnation(),
            node=node,
            hosts=1,
            replica=not leader,
        )

    # --- the rounds -----------------------------------------------------------------

    async def round(
        self,
        segments: Mapping[int, SegmentInfo],
        replication: Replication,
        sealed: Mapping[int, SegmentInfo] | None = None,
    ) -> None:
        """One look at every replicated segment of ``segments`` (the active ones) and of
        ``sealed`` (sealed ones whose replicas still serve their readers), and the steps
        each needs; the replicas' view is kept for stats. A sealed segment's lost leader
        is replaced, and its factor restored, as an active one's: its backlog stays
        readable. Only active segments that have one copy are given more."""
        sets = self.sets()
        records = sets.all()
        if replication.factor > 1:  # a live topic's segments that have one copy get more
            one_copy = sorted(segments.keys() - records.keys())
            for segment_id in one_copy:
                await self._replicate(segments[segment_id], replication)
            if one_copy:
                records = sets.all()
        kept = {**(sealed or {}), **segments}
        replicated = sorted(records.keys() & kept.keys())
        for segment_id in list(self._watches):
            if segment_id not in replicated:
                del self._watches[segment_id]
        if not replicated:
            return
        nodes = await asyncio.to_thread(self._live_disks)
        endpoints = {(i, disk): endpoint for i, watch in self._watches.items()
                     for disk, endpoint in watch.endpoints.items()}  # fmt: skip
        asked = await ask_replicas(
            self.topic, {i: (kept[i], records[i]) for i in replicated}, nodes, endpoints
        )
        results = await asyncio.gather(
            *(self._keep(sets, kept[i], records[i], replication, nodes, asked)
              for i in replicated),
            return_exceptions=True,
        )  # fmt: skip
        for segment_id, result in zip(replicated, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("%s: replicas of segment %d not kept this round: %r",
                            self.topic, segment_id, result)  # fmt: skip
        self._publish()

    async def _replicate(self, info: SegmentInfo, replication: Replication) -> None:
        """Followers for a segment created with one copy (its topic's policy asked for
        more since): recorded and laid out empty; the rounds start them, and elect the
        segment's replica (the longest log) at a new epoch, after which they copy it."""
        name = info.name(self.topic)
        leader = SegmentPlacements(self._store, self.topic, self._incarnation()).get(
            info.segment_id
        )
        if leader is None:  # laid out before each node kept its own disk
            return
        try:
            await self.place(name, info, leader, replication, [], 0, True)
        except ScalableTopicsError as err:  # too few nodes now: the next round tries again
            log.warning("%s: not replicated yet: %s", name, err)
            return
        log.info("%s: replicated on %d nodes from now on", name, replication.factor)

    def _live_disks(self) -> dict[str, str]:
        """Disk id → live node id: the nodes last asked, asked again (at most every
        ``ASK_AGAIN_S``) when one of them is no longer alive, so a node that came back
        with its disk is found again. Blocking: GCS round trips."""
        alive = set(live_nodes())
        known = self._disks.known()
        stale = any(node not in alive for node in known.values())
        if (stale or not known) and time.monotonic() - self._asked_at >= ASK_AGAIN_S:
            self._asked_at = time.monotonic()
            known = self._disks.live()
        return {disk: node for disk, node in known.items() if node in alive}

    async def _keep(
        self,
        sets: ReplicaSets,
        info: SegmentInfo,
        record: ReplicaSet,
        replication: Replication,
        nodes: dict[str, str],
        asked: Asked,
    ) -> None:
        """One segment's step of a round, from its replicas' answers (``asked``). A
        replica is lost when its node is, when it stayed silent past the
        grace, or, for the leader, at once when its data plane refuses connections
        (``actors.control.replica_asks``): a follower's host that crashed is waited for,
        as Ray restarts it, rather than replaced by a copy of the whole log."""
        name = info.name(self.topic)
        watch = self._watches.setdefault(name.segment_id, _Watch(descriptor=name.descriptor))
        calls = HostReplicaCalls(name, nodes.get, guard().internal_token())
        statuses = {r: asked.statuses.get((name.segment_id, r)) for r in record.replicas}
        dead_leader = (name.segment_id, record.leader) in asked.refused
        now = time.monotonic()
        gone = set()
        for replica, status in statuses.items():
            if status is not None:
                watch.silent_since.pop(replica, None)
                if status.get("endpoint"):
                    watch.endpoints[replica] = tuple(status["endpoint"])
                continue
            since = watch.silent_since.setdefault(replica, now)
            refused = dead_leader and replica == record.leader
            if replica not in nodes or refused or now - since >= _grace_s():
                gone.add(replica)
            elif now - watch.started_at.get(replica, -START_WAIT_S) >= START_WAIT_S:
                watch.started_at[replica] = now  # its host has not opened it (yet)
                leads = replica == record.leader
                await asyncio.to_thread(self._start, name, nodes[replica], leads)
        answers = {r: _answer(s) for r, s in statuses.items()}
        watch.view = replica_view(record, statuses, nodes, watch.committed)
        leading = statuses.get(record.leader)
        watch.committed = leading["highWatermark"] if leading else None
        free = [d for d in sorted(nodes) if d not in record.replicas]
        watch.unavailable = None
        steps = next_steps(record.replicas, record.epoch, answers, gone, free, replication)
        if not steps:  # the leader leads its epoch: the policy may ask for another shape
            leading = statuses.get(record.leader) or {}
            answering = tuple(r for r in record.replicas if statuses.get(r) is not None)
            steps = resize_steps(record.replicas, answering, leading.get("ackQuorum"), free,
                                 replication)  # fmt: skip
        if not steps and now >= watch.hand_over_after:
            in_sync = {replica["replica"] for replica in watch.view if replica.get("inSync")}
            steps = hand_over_steps(record.replicas, record.epoch, answers, in_sync,
                                    self._disks.own_disks())  # fmt: skip
        for step in steps:
            await self._carry_out(step, sets, info, record, replication, calls, watch)

    async def _carry_out(
        self,
        step: Step,
        sets: ReplicaSets,
        info: SegmentInfo,
        record: ReplicaSet,
        replication: Replication,
        calls: HostReplicaCalls,
        watch: _Watch,
    ) -> None:
        name = info.name(self.topic)
        if isinstance(step, Unavailable):
            watch.unavailable = step.why
            log.warning("%s: %s", name, step.why)
        elif isinstance(step, Tell):
            await calls.follow(step.replica, record.epoch, record.leader)
        elif isinstance(step, HandOver):
            watch.hand_over_after = time.monotonic() + HAND_OVER_EVERY_S
            if await calls.hand_over(record.leader, step.to, HAND_OVER_WAIT_S):
                log.info("%s: lead handed from %s to %s", name, record.leader, step.to)
                elect_all = Elect(record.replicas)
                await self._carry_out(elect_all, sets, info, record, replication, calls, watch)
        elif isinstance(step, Elect):
            try:
                elected = await elect(
                    sets, name.segment_id, step.candidates, replication, calls, step.also_fenced,
                    avoid=frozenset(self._disks.own_disks()),
                )  # fmt: skip
            except BadVersion:
                return  # another election won: the next round reads its record
            SegmentPlacements(self._store, self.topic, self._incarnation()).move(
                name.segment_id, elected.leader
            )
            log.info("%s: replica %s leads epoch %d", name, elected.leader, elected.epoch)
            if self.metrics is not None:
                self.metrics.leader_changed()
        elif isinstance(step, Resize):
            await self._resize(step, sets, info, record, calls)
        elif isinstance(step, Rebuild):
            await self._rebuild(step.replica, info, calls)
        else:
            await self._replace(step, sets, info, record, calls)

    async def _resize(
        self,
        step: Resize,
        sets: ReplicaSets,
        info: SegmentInfo,
        record: ReplicaSet,
        calls: HostReplicaCalls,
    ) -> None:
        """The topic's policy asks for another factor: a follower added on a free node
        (laid out empty: it copies the leader's log), or the last ones dropped (recorded
        first, then closed and their files removed)."""
        name = info.name(self.topic)
        found = sets.get(name.segment_id)
        if found is None or found[0] != record:
            return
        resized = record.resized(step.factor, step.new)
        for disk in step.new:
            await self._lay_out(disk, name, info, [], 0, True)
        sets.change(name.segment_id, found[1], resized)
        log.info("%s: replicas %s → %s", name, record.replicas, resized.replicas)
        for disk in step.new:
            node = calls.node_of(disk)
            if node is not None:
                await asyncio.to_thread(self._start, name, node, False)
        for disk in set(record.replicas) - set(resized.replicas):
            await self._remove_replica(name, disk)

    async def _replace(
        self,
        step: Replace,
        sets: ReplicaSets,
        info: SegmentInfo,
        record: ReplicaSet,
        calls: HostReplicaCalls,
    ) -> None:
        """A new follower on ``step.new``: laid out empty (it copies the leader's log and
        cursors from the start), recorded, then opened; the next round tells it its role."""
        name = info.name(self.topic)
        found = sets.get(name.segment_id)
        node = calls.node_of(step.new)
        if found is None or found[0] != record or node is None:
            return  # changed since this round read it
        await self._lay_out(step.new, name, info, [], 0, True)
        sets.change(name.segment_id, found[1], record.replaced(step.gone, step.new))
        log.info("%s: follower %s is lost; %s replaces it", name, step.gone, step.new)
        await asyncio.to_thread(self._start, name, node, False)

    async def _rebuild(self, replica: str, info: SegmentInfo, calls: HostReplicaCalls) -> None:
        """A follower whose files were removed under it: closed, removed and laid out empty
        on its disk again, reopened; the next round tells it to follow, and it copies the
        leader's log and cursors from their start."""
        name = info.name(self.topic)
        node = calls.node_of(replica)
        if node is None:
            return
        log.warning("%s: replica %s lost its files; it is rebuilt from its leader", name, replica)
        await self._remove_replica(name, replica)
        await self._lay_out(replica, name, info, [], 0, True)
        await asyncio.to_thread(self._start, name, node, False)

    # --- what observers see ------------------------------------------------------------

    def views(self) -> dict[str, dict[str, Any]]:
        """Each replicated active segment's replicas as the last round saw them (by
        segment id, as stats name segments): node, role, epoch, lag, in sync; and why
        nothing can be done for it now, if so."""
        return {
            str(segment_id): {"replicas": watch.view, "unavailable": watch.unavailable}
            for segment_id, watch in self._watches.items()
        }

    def forget(self) -> None:
        """Drop what the rounds saw: an incarnation is starting (create, recover), and any
        replica seen before was closed with it. Who calls: the fleet's ``clear_leftovers``.
        What it affects: stats and metrics show no replica until the next round saw it."""
        self._watches.clear()
        self._publish()

    def _publish(self) -> None:
        if self.metrics is None:
            return
        under, lag = replication_gauges({i: watch.view for i, watch in self._watches.items()})
        descriptors = {str(i): watch.descriptor for i, watch in self._watches.items()}
        self.metrics.replicas(under, {descriptors[i]: entries for i, entries in lag.items()})


def _grace_s() -> float:
    return env_float(GRACE_ENV, DEFAULT_GRACE_S)


def _answer(status: dict[str, Any] | None) -> RoleAnswer | None:
    if status is None:
        return None
    return RoleAnswer(status["role"], status.get("epoch", 0), bool(status.get("filesLost")))
