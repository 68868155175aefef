"""Segments on each node's own disk (storage scope ``node``): laying a segment out on
the node chosen for it, finding that node again, and removing what is left there.

With one shared storage root the controller lays segments out itself and an actor
opens its segment on any node. With a disk per node neither holds: a new segment is
laid out by a task pinned to the node whose disk was chosen (``runtime.placement.
choose_disk``), its actor is pinned there too (Ray restarts it on that node, and
nowhere else), and its disk is recorded in the metadata store (``storage.placements``)
so that the node is found again after any restart, Ray's included, by asking the live
nodes which disk each has. The work runs in small tasks (pooled workers, no new
actor process), each bound to its node with hard node affinity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from actors.registry import live_nodes, on_each_node, on_node
from runtime.errors import NotEnoughNodesError, UnavailableError
from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName
from runtime.placement import choose_disk, namespace_resources, placement_from_env
from runtime.policy import TopicPolicy
from storage.durability import Durability, node_storage_root, storage_scope
from storage.incarnation_storage import IncarnationStorage
from storage.metadata import MetadataStore
from storage.placements import SegmentPlacements, disk_id
from storage.replica_state import ReplicaStateFile
from storage.stored_copies import StoredCopy, StoredTopic, copies_of
from storage.tier_records import TierRecords
from storage.topic_storage import (
    StoredIncarnation,
    delete_storage,
    incarnation_directory,
    merge_incarnations,
    scan,
    segment_directory,
)

log = logging.getLogger(__name__)

# How long a node may take to say which disk it has before it counts as not there.
ASK_WAIT_S = 30.0


@ray.remote(num_cpus=0, max_retries=0)
def _disk(cluster_root: str) -> str:
    return disk_id(node_storage_root(cluster_root))


# A worker that dies while laying out (its node stays) is retried: laying out again
# opens what the first try made.
@ray.remote(num_cpus=0, max_retries=2)
def _lay_out(
    cluster_root: str,
    metadata_namespace: str,
    incarnation: str,
    durability: dict[str, Any],
    segment: str,
    info: SegmentInfo,
    subscriptions: list[str],
    epoch: int,
    in_layout: bool,
    replicated: bool,
) -> str:
    root = node_storage_root(cluster_root)
    name = SegmentName.parse(segment)
    records = TierRecords(MetadataStore(metadata_namespace), name.topic, incarnation)
    storage = IncarnationStorage(root, name.topic, incarnation, Durability(**durability), records)
    storage.lay_out(name, info, subscriptions, epoch, in_layout=in_layout)
    if replicated:
        directory = segment_directory(root, name, incarnation)
        ReplicaStateFile(directory, Durability(**durability)).mark_replicated()
    return disk_id(root)


@ray.remote(num_cpus=0, max_retries=0)
def _remove(cluster_root: str, topic: str, incarnation: str, segment: str | None) -> None:
    root = node_storage_root(cluster_root)
    if segment is None:
        delete_storage(incarnation_directory(root, TopicName.parse(topic), incarnation))
    else:
        delete_storage(segment_directory(root, SegmentName.parse(segment), incarnation))


@ray.remote(num_cpus=0, max_retries=0)
def _stored_here(cluster_root: str, topic: str) -> tuple[str, list[StoredIncarnation], dict]:
    """This node's disk: its id, ``topic``'s incarnations on it, and their segment copies."""
    root = node_storage_root(cluster_root)
    disk = disk_id(root)
    found = scan(root, TopicName.parse(topic))
    return disk, found, {s.incarnation: copies_of(s, disk) for s in found if s.incarnation}


def check_replication(policy: TopicPolicy, namespace_path: str, cluster_root: str) -> None:
    """Refuse a policy whose replication factor the cluster cannot hold (one replica per
    node, each on its own disk): with one shared storage root every replica would be on
    the same disk; with a disk per node, fewer live nodes that the namespace may place
    on than the factor. ``NotEnoughNodesError`` says how many there are. Blocking: one
    small task per live node."""
    replication = policy.replicas
    if replication.factor == 1:
        return
    if storage_scope() != "node":
        raise NotEnoughNodesError(
            f"replication factor {replication.factor} needs a storage root per node "
            f"(RAYTOPICS_STORAGE_SCOPE=node): with one shared root every replica would be "
            "on the same disk, so this cluster holds 1 copy"
        )
    replication.check_nodes(len(_ask_disks(_candidates(namespace_path), cluster_root, None)))


class NodeDisks:
    """The disks of the live nodes that may hold ``topic``'s segments, and the work done
    on them. Who calls: the topic's ``SegmentFleet``, in storage scope ``node`` only."""

    def __init__(
        self, topic: TopicName, cluster_root: Path, durability: Durability, metadata_namespace: str
    ) -> None:
        self.topic, self.cluster_root, self.durability = topic, str(cluster_root), durability
        self._metadata_namespace = metadata_namespace  # what the laying-out task opens
        self._nodes: dict[str, str] = {}  # disk id → Ray node id, as last asked
        self._placing = asyncio.Lock()

    def node_of_segment(self, name: SegmentName, placements: SegmentPlacements) -> str | None:
        """The node a local segment's actor must run on: ``None`` (any) for a segment laid
        out before each node kept its own disk; ``UnavailableError`` while no live node
        has its disk."""
        disk = placements.get(name.segment_id)
        if disk is None:
            return None
        node = self.node_of(disk)
        if node is None:
            raise self.unavailable(name, disk)
        return node

    async def place(
        self,
        name: SegmentName,
        info: SegmentInfo,
        placements: SegmentPlacements,
        tiered: Callable[[], set[int]],
        leader: bool = False,
    ) -> str:
        """Choose the new segment's disk (one choice at a time, so a split's children see
        each other), record it, and return the node that has it. The load of a disk is
        the segments placed on it that are not ``tiered`` (ids) now. A replicated
        segment's ``leader`` is placed off this controller's node when another may hold
        it (``own_disks``)."""
        async with self._placing:
            disk = placements.get(name.segment_id)
            if disk is None:
                nodes = await asyncio.to_thread(self.live)
                placed = placements.all()
                off_disk = tiered()
                load = {d: 0 for d in sorted(nodes)}
                for segment_id, d in placed.items():
                    if d in load and segment_id not in off_disk:
                        load[d] += 1
                if not load:
                    raise UnavailableError(f"{self.topic}: no live node may hold its segments")
                avoid = {placed[p] for p in info.parent_ids if p in placed}
                own = self.own_disks() if leader else set()
                elsewhere = {d: n for d, n in load.items() if d not in own} or load
                disk = placements.place(name.segment_id, choose_disk(elsewhere, avoid))
            node = await asyncio.to_thread(self.node_of, disk)
            if node is None:
                raise self.unavailable(name, disk)
            return node

    def own_disks(self) -> set[str]:
        """The disks of the node this controller runs on, as the nodes last said: a
        replicated segment's leader goes elsewhere when it can (``place``, elections), so
        that losing one node takes a leader or the controller, rarely both."""
        node = _own_node()
        return {disk for disk, held_by in self._nodes.items() if held_by == node}

    def node_of(self, disk: str) -> str | None:
        """The live node that has ``disk`` (the nodes are asked again when none is known
        to); ``None`` when none has it now. Blocking: one task per node when asking."""
        if disk not in self._nodes:
            self.refresh()
        return self._nodes.get(disk)

    def known(self) -> dict[str, str]:
        """Disk id → node id as the nodes last said, without asking (some may be gone)."""
        return dict(self._nodes)

    def live(self) -> dict[str, str]:
        """Every live candidate node's disk → node id, asked afresh."""
        self.refresh()
        return dict(self._nodes)

    def refresh(self) -> None:
        candidates = _candidates(self.topic.namespace_path)
        self._nodes = _ask_disks(candidates, self.cluster_root, self.topic)

    def stored(self) -> StoredTopic:
        """The topic's incarnations and segment copies on every live node's disk, each
        disk read on its node; ``UnavailableError`` naming the nodes that did not answer,
        since a recovery planned without a disk would miss its segments. Blocking."""
        answers, missing = on_each_node(
            live_nodes(), _stored_here, self.cluster_root, str(self.topic), wait_s=ASK_WAIT_S
        )
        if missing:
            raise UnavailableError(
                f"{self.topic}: the disks of nodes {sorted(missing)} could not be read "
                f"({'; '.join(sorted(set(missing.values())))}): recovery needs every disk"
            )
        incarnations: list[StoredIncarnation] = []
        copies: dict[str, list[StoredCopy]] = {}
        by_disk = {disk: (found, held) for disk, found, held in answers.values()}  # shared: once
        for found, held in by_disk.values():
            incarnations += found
            for incarnation, segment_copies in held.items():
                copies.setdefault(incarnation, []).extend(segment_copies)
        return StoredTopic(merge_incarnations(incarnations), copies)

    async def lay_out(
        self,
        node: str,
        incarnation: str,
        name: SegmentName,
        info: SegmentInfo,
        subscriptions: list[str],
        epoch: int,
        in_layout: bool,
        replicated: bool = False,
    ) -> None:
        """Lay ``name`` out on ``node``'s disk; ``replicated``: as one replica of it, which
        serves nobody until its controller gives it a role."""
        await _lay_out.options(scheduling_strategy=on_node(node)).remote(
            self.cluster_root,
            self._metadata_namespace,
            incarnation,
            asdict(self.durability),
            str(name),
            info,
            subscriptions,
            epoch,
            in_layout,
            replicated,
        )

    async def remove(self, node: str, incarnation: str, name: SegmentName | None) -> None:
        """Remove a segment's directory (or, ``name`` None, the incarnation's) on ``node``."""
        await _remove.options(scheduling_strategy=on_node(node)).remote(
            self.cluster_root, str(self.topic), incarnation, str(name) if name else None
        )

    def unavailable(self, name: SegmentName, disk: str) -> UnavailableError:
        return UnavailableError(
            f"{name}: its files are on node disk {disk}, which no live node of the cluster "
            "has now (the node is down or gone); the segment serves again when that node is "
            "back, and is never re-created empty elsewhere"
        )


def _own_node() -> str | None:
    """This process's Ray node; ``None`` outside Ray (no node is then avoided)."""
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _candidates(namespace_path: str) -> list[str]:
    """Live nodes with the resources the namespace's placement asks for."""
    wanted = namespace_resources(namespace_path, placement_from_env()) or {}
    return sorted(
        node["NodeID"]
        for node in ray.nodes()
        if node.get("Alive") and all(k in node.get("Resources", {}) for k in wanted)
    )


def _ask_disks(nodes: list[str], cluster_root: str, topic: TopicName | None) -> dict[str, str]:
    """Which disk each of ``nodes`` has: disk id → node id (a node that does not say in
    ``ASK_WAIT_S`` is left out, logged; two nodes sharing one disk count once)."""
    answers, missing = on_each_node(nodes, _disk, cluster_root, wait_s=ASK_WAIT_S)
    for node, why in missing.items():
        log.warning("%s: node %s did not say which disk it has: %s", topic or "placement",
                    node, why)  # fmt: skip
    return {disk: node for node, disk in sorted(answers.items(), reverse=True)}
