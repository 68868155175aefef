"""Replicas that stop serving: the followers of a replicated segment put to sleep, moved
to the tier, or deleted. Part of ``ReplicaKeeper`` (which provides what is declared
here): the keeper's rounds start and elect replicas; this closes them and removes their
files.

A sleeping segment's followers are closed and keep their files and record, so that the
rounds start them again once it wakes. A tiered segment's followers are closed and their
copies removed (the tier keeps it from then on), and a deleted segment's replicas all go;
the record goes last in both, so a crash in between leaves what the next attempt finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ray.exceptions import RayError

from actors.guard import guard
from actors.registry import live_nodes, lookup
from actors.segment.directory import SegmentDirectory
from actors.segment.handle import SegmentHandle
from actors.segment.host import close_segment
from runtime.config import topic_settings
from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName
from runtime.segment_hosts import host_name

if TYPE_CHECKING:
    from actors.control.node_disks import NodeDisks
    from storage.replica_sets import ReplicaSets

log = logging.getLogger(__name__)


class RetiringReplicas:
    """The removal part of ``ReplicaKeeper``. Who calls: the topic's ``SegmentFleet``
    (``rest`` when a segment sleeps, ``retire`` once segments are tiered, ``destroy`` when
    one is deleted). What it affects: the replicas open in their nodes' hosts, their files,
    their records, and what the rounds watch."""

    topic: TopicName
    _disks: NodeDisks
    _incarnation: Callable[[], str]
    _watches: dict[int, Any]

    if TYPE_CHECKING:

        def sets(self) -> ReplicaSets: ...

    async def rest(self, name: SegmentName) -> None:
        """Close the followers of a segment put to sleep (sealed and drained; its leader's
        actor ends): left open, each would keep asking its closed leader for entries.
        Their files and the record stay; once the segment wakes, the rounds start them
        again, and elect a leader among them if the leader's node is gone meanwhile."""
        found = self.sets().get(name.segment_id)
        if found is None:
            return
        self._watches.pop(name.segment_id, None)
        for disk in found[0].followers:
            await self._close_replica(name, disk)

    async def retire(self, tiered: Mapping[int, SegmentInfo]) -> None:
        """Segments moved to the tier, which keeps them from now on (any node serves one
        from there): their followers are closed and their files removed, and their
        records go last (a crash in between: the next round does it again). The leader's
        copy is the mover's (``SegmentFleet.hibernate``)."""
        sets = self.sets()
        records = sets.all()
        for segment_id in sorted(tiered.keys() & records.keys()):
            name = tiered[segment_id].name(self.topic)
            for disk in records[segment_id].followers:
                await self._remove_replica(name, disk)
            sets.delete(segment_id)
            self._watches.pop(segment_id, None)
            log.info("%s: segment %d is in the tier: its followers' copies are removed",
                     self.topic, segment_id)  # fmt: skip

    async def destroy(self, name: SegmentName) -> None:
        """Close the segment's replicas in their hosts and remove their files; its record
        goes last (a crash in between: the next attempt finds them again)."""
        sets = self.sets()
        found = sets.get(name.segment_id)
        if found is None:
            return
        for disk in found[0].replicas:
            await self._remove_replica(name, disk)
        sets.delete(name.segment_id)
        self._watches.pop(name.segment_id, None)

    async def _remove_replica(self, name: SegmentName, disk: str) -> None:
        """Close the replica on ``disk`` in its node's host and remove its files there."""
        node = await self._close_replica(name, disk)
        if node is not None:
            try:
                await self._disks.remove(node, self._incarnation(), name)
                return
            except RayError as err:  # the node went meanwhile
                log.debug("%s: files on %s not removed: %r", name, disk, err)
        log.warning("%s: node disk %s is not in the cluster; its replica's files "
                    "stay there", name, disk)  # fmt: skip

    async def _close_replica(self, name: SegmentName, disk: str) -> str | None:
        """Close the replica on ``disk`` in its node's host, if that node is live (its
        node id then; its files stay)."""
        node = await asyncio.to_thread(self._disks.node_of, disk)
        if node is None or node not in await asyncio.to_thread(live_nodes):
            return None
        host = host_name(name, node, 1, topic_settings())
        with contextlib.suppress(ValueError, RayError):
            replica = SegmentHandle(lookup(host), str(name))
            await close_segment(replica, guard().internal_token())
        SegmentDirectory().remove(name, host)
        return node
