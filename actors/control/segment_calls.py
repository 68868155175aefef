"""What a topic's controller asks of its running segments: their stats and retention
for the maintenance rounds, a move to the tier, and their subscriptions' cursors.
Part of ``SegmentFleet``, whose handles and storage records it uses: the fleet
brings segments into being and ends them; these are the calls in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from actors.control.fleet_parts import FleetParts
from actors.guard import guard
from runtime.names import SegmentName
from runtime.remote import ACTOR_GONE
from runtime.subscription import ResetTarget

if TYPE_CHECKING:
    from actors.segment.handle import SegmentHandle
    from runtime.names import TopicName

log = logging.getLogger(__name__)


class SegmentCalls(FleetParts):
    """The calls part of ``SegmentFleet`` (which provides what is declared here)."""

    topic: TopicName
    records_changed: int

    if TYPE_CHECKING:

        def running(self, name: SegmentName) -> SegmentHandle | None: ...
        def watched(self, name: SegmentName) -> SegmentHandle | None: ...
        async def _woken_replicated(self, name: SegmentName) -> bool: ...
        async def _reach(self, name: SegmentName, call: Callable[[SegmentHandle], Any]) -> Any: ...

    # --- what the maintenance rounds ask ----------------------------------------------------

    async def observe(
        self, names: dict[int, SegmentName], on_demand: set[int], wait_s: float
    ) -> dict[int, dict[str, Any]]:
        """The stats of every segment of ``names`` (by id) whose actor runs and answers
        within ``wait_s``. One not running that is in ``on_demand`` (tiered, or sleeping
        drained) is marked hibernating, and not looked up again until started."""
        handles = {}
        for segment_id, name in names.items():
            if self._marks.marked(name):
                continue
            starts = self._marks.starts(name)
            handle = self.watched(name)
            if handle is not None:
                handles[segment_id] = handle
            elif segment_id in on_demand:  # after a controller restart, say
                self._marks.found_without_process(name, starts)
        token = guard().internal_token()
        by_host: dict[ray.actor.ActorHandle, list[int]] = {}
        for segment_id, handle in handles.items():
            by_host.setdefault(handle.host, []).append(segment_id)

        async def ask(host: ray.actor.ActorHandle, ids: list[int]) -> dict[int, Any]:
            """One call per host for all its segments (None: not served there now)."""
            asked = [handles[i].segment for i in ids]
            try:
                answer = await asyncio.wait_for(
                    host.stats_of.remote(asked, credential=token), wait_s
                )
            except ACTOR_GONE:  # its node gone too: looked up afresh next round
                answer = dict.fromkeys(asked)
            except Exception as err:  # noqa: BLE001 - a round goes on without this host
                log.warning("%s: stats of %d segments not read: %r", self.topic, len(ids), err)
                return {}
            return {i: answer[handles[i].segment] for i in ids}

        stats = {}
        for found in await asyncio.gather(*(ask(h, ids) for h, ids in by_host.items())):
            for segment_id, st in found.items():
                if st is not None:
                    stats[segment_id] = st
                else:
                    self.forget(names[segment_id])  # look it up afresh next round
        return stats

    async def retain(
        self, names: list[SegmentName], oldest_ms: int | None, max_bytes: int | None
    ) -> None:
        """Time and size retention on the running ones of ``names`` (whole batches)."""
        watched = [h for h in (self.watched(n) for n in names) if h is not None]
        token = guard().internal_token()
        await asyncio.gather(
            *(h.retain.remote(oldest_ms, max_bytes, credential=token) for h in watched)
        )

    async def offload(self, handle: SegmentHandle, uri: str) -> None:
        """Have the segment behind ``handle`` move itself to the tier at ``uri``."""
        await handle.offload.remote(uri, credential=guard().internal_token())

    # --- subscriptions ---------------------------------------------------------------------

    async def create_subscription(
        self, name: SegmentName, subscription: str, position: str, epoch: int
    ) -> None:
        """A subscription's cursor on the segment: in a hibernating tiered segment's record
        (creating a subscription must not wake every tiered segment), else by its actor,
        reached as a layout operation reaches it (``_reach``): a replicated segment's
        leader may be on a node that is gone, until a round elects another."""
        if self.running(name) is None and self.storage().records.add_cursor(
            name.segment_id, subscription, position, epoch
        ):
            self.records_changed += 1
            return
        token = guard().internal_token()

        def subscribe(seg: SegmentHandle) -> Any:
            return seg.create_subscription.remote(subscription, position, epoch, credential=token)

        await self._woken_replicated(name)
        await self._reach(name, subscribe)

    async def delete_subscription(self, name: SegmentName, subscription: str, epoch: int) -> None:
        if self.running(name) is None and self.storage().records.delete_cursor(
            name.segment_id, subscription, epoch
        ):
            self.records_changed += 1
            return
        token = guard().internal_token()
        await self._reach(
            name, lambda seg: seg.delete_subscription.remote(subscription, epoch, credential=token)
        )

    async def seek(
        self, name: SegmentName, subscription: str, to: ResetTarget, epoch: int
    ) -> dict[str, Any]:
        """Move the subscription's cursor on the segment (``SegmentStore.seek``); a
        hibernating segment is woken for it."""
        token = guard().internal_token()
        return await self._reach(
            name, lambda seg: seg.seek.remote(subscription, to, epoch, credential=token)
        )
