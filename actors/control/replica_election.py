"""A replicated segment's leader election, as its topic's controller runs it
(``runtime.replica_plan`` decides when; ``runtime.replication`` why each step is safe).

1. fence the candidates at the next epoch: each stops leading or following, refuses
   every older leader from now on (durably), and reports its log's newest epoch and end;
2. choose among the reports (``choose_leader``: at least ``reports_needed`` of them);
3. record the choice in the replica set by compare-and-swap (``storage.replica_sets``):
   losing means another election won, and nothing is told to anyone;
4. only then tell the chosen replica to lead, send clients to it (the directory entry),
   and tell the other fenced replicas to follow it.

Every Ray call goes through ``ReplicaCalls``, so the steps are tested with stand-ins
(``tests/test_replica_election.py``) and on a real cluster
(``tests/test_replicated_topic.py``) alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from ray.exceptions import RayError

from actors.registry import lookup
from actors.segment.directory import SegmentDirectory
from actors.segment.handle import SegmentHandle
from runtime.config import topic_settings
from runtime.errors import ScalableTopicsError, SegmentNotFoundError, UnavailableError
from runtime.names import SegmentName
from runtime.replication import ReplicaReport, Replication, choose_leader
from runtime.segment_hosts import host_name
from storage.replica_sets import ReplicaSet, ReplicaSets

log = logging.getLogger(__name__)

# How long an election waits for a replica to be fenced before it counts as not answering.
FENCE_WAIT_S = 10.0


class ReplicaCalls(Protocol):
    """The calls to one segment's replicas, each named by its disk."""

    async def fence(self, replica: str, epoch: int) -> ReplicaReport | None:
        """The replica's report once fenced at ``epoch``; ``None`` when it does not answer."""
        ...

    async def lead(self, replica: str, epoch: int, replication: Replication) -> None: ...

    async def follow(self, replica: str, epoch: int, leader: str) -> None: ...

    async def route_clients(self, leader: str, followers: tuple[str, ...]) -> None:
        """Send the segment's producers and readers to ``leader`` from now on."""
        ...


async def elect(
    records: ReplicaSets,
    segment_id: int,
    candidates: tuple[str, ...],
    replication: Replication,
    calls: ReplicaCalls,
    also_fenced: tuple[str, ...] = (),
    avoid: frozenset[str] = frozenset(),
) -> ReplicaSet:
    """Run one election among ``candidates`` (replicas of the segment); the replica set it
    recorded. ``also_fenced``: replicas fenced at the new epoch too, never chosen (their
    files are gone); ``avoid``: replicas chosen only when no other is as up to date
    (``choose_leader``). ``NotEnoughReplicasError`` when too few answer; ``BadVersion``
    when another election recorded its choice first."""
    found = records.get(segment_id)
    if found is None:
        raise SegmentNotFoundError(f"segment {segment_id} has no replica set to elect in")
    current, version = found
    epoch = current.epoch + 1
    answers = await asyncio.gather(*(calls.fence(c, epoch) for c in candidates + also_fenced))
    reports = [report for report in answers[: len(candidates)] if report is not None]
    chosen = choose_leader(reports, replication, prefer=current.leader, avoid=avoid).replica
    elected = current.elected(chosen)
    records.change(segment_id, version, elected)
    await calls.lead(chosen, elected.epoch, replication)
    await calls.route_clients(chosen, elected.followers)
    fenced = {report.replica for report in reports}
    await asyncio.gather(
        *(calls.follow(r, elected.epoch, chosen) for r in elected.followers if r in fenced)
    )
    return elected


class HostReplicaCalls:
    """``ReplicaCalls`` to one segment's replicas in the segment hosts of their nodes.
    ``node_of``: the live node that has a disk (``actors.control.node_disks``), ``None``
    when none has it now (a replica that then does not answer)."""

    def __init__(
        self,
        name: SegmentName,
        node_of: Callable[[str], str | None],
        credential: str | None,
        wait_s: float = FENCE_WAIT_S,
    ) -> None:
        self._name, self.node_of, self._credential, self._wait_s = (
            name, node_of, credential, wait_s,
        )  # fmt: skip

    async def fence(self, replica: str, epoch: int) -> ReplicaReport | None:
        handle = await self._handle(replica)
        if handle is None:
            return None
        try:
            answer = await asyncio.wait_for(
                handle.fence.remote(epoch, credential=self._credential), self._wait_s
            )
        except (RayError, TimeoutError, ScalableTopicsError) as err:
            log.warning("%s: replica %s not fenced at epoch %d: %r", self._name, replica,
                        epoch, err)  # fmt: skip
            return None
        return ReplicaReport(
            answer["replica"], answer["lastEpoch"], answer["end"], answer.get("sealed", False)
        )

    async def lead(self, replica: str, epoch: int, replication: Replication) -> None:
        handle = await self._required(replica)
        await handle.lead.remote(
            epoch, replication.factor, replication.ack_quorum, credential=self._credential
        )

    async def follow(self, replica: str, epoch: int, leader: str) -> None:
        leading = await self._required(leader)
        endpoint = await leading.data_endpoint.remote(credential=self._credential)
        handle = await self._handle(replica)
        if handle is not None:
            await handle.follow.remote(epoch, endpoint, credential=self._credential)

    async def hand_over(self, leader: str, to: str, wait_s: float) -> bool:
        """Have ``leader`` stop taking appends until follower ``to`` holds all it holds."""
        handle = await self._required(leader)
        try:
            return await asyncio.wait_for(
                handle.hand_over.remote(to, wait_s, credential=self._credential), wait_s + 5
            )
        except (RayError, TimeoutError, ScalableTopicsError) as err:
            log.warning("%s: %s did not hand its lead to %s: %r", self._name, leader, to, err)
            return False

    async def route_clients(self, leader: str, followers: tuple[str, ...]) -> None:
        node = await asyncio.to_thread(self.node_of, leader)
        if node is None:
            raise UnavailableError(f"{self._name}: its new leader's disk {leader} is not live")
        host = host_name(self._name, node, 1, topic_settings())
        await asyncio.to_thread(SegmentDirectory().promote, self._name, host, time.time_ns())

    async def _handle(self, replica: str) -> SegmentHandle | None:
        node = await asyncio.to_thread(self.node_of, replica)
        if node is None:
            return None
        host = host_name(self._name, node, 1, topic_settings())
        try:
            return SegmentHandle(await asyncio.to_thread(lookup, host), str(self._name))
        except ValueError:  # no host runs there now
            return None

    async def _required(self, replica: str) -> SegmentHandle:
        handle = await self._handle(replica)
        if handle is None:
            raise UnavailableError(f"{self._name}: replica {replica} has no live host")
        return handle
