"""How a topic's segments at rest hibernate and wake: a tiered one (its records in the tier,
any node can open it) and a drained sealed one put to sleep (its files stay on its disk).
Part of ``SegmentFleet``, whose handles, storage records and replica keeper it uses: the
fleet owns the segments' actors; this is when they end and start again on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from actors.control.fleet_parts import FleetParts
from actors.guard import guard
from actors.segment.host import close_segment
from actors.segment.lookup import segment_actor
from runtime.errors import UnavailableError
from runtime.names import SegmentName
from runtime.remote import ACTOR_GONE

if TYPE_CHECKING:
    from actors.control.replica_keeper import ReplicaKeeper
    from storage.asleep import SleepingSegments
    from storage.placements import SegmentPlacements


class RestingSegments(FleetParts):
    """The hibernation part of ``SegmentFleet`` (which provides what is declared here)."""

    node_local: bool
    replicas: ReplicaKeeper

    if TYPE_CHECKING:

        def sleeping(self) -> SleepingSegments: ...
        def placements(self) -> SegmentPlacements: ...
        def _replicated(self, name: SegmentName) -> bool: ...

    def wake(self, name: SegmentName) -> bool:
        """Start a hibernating segment's actor: a tiered one opens from its record on any
        node, a sleeping drained one from its files. False when the segment is neither.
        Blocking: GCS round trips."""
        tiered = self.storage().tiered(name.segment_id) is not None
        if not tiered and self.sleeping().get(name.segment_id) is None:
            return False
        if not tiered and self._replicated(name):
            # Awake, its replicas are kept by the rounds again: they start the followers,
            # and elect one of them when the leader's node is gone (the reader retries
            # until a leader serves).
            self.sleeping().woken(name.segment_id)
            with contextlib.suppress(UnavailableError, *ACTOR_GONE):
                self.handle(name)
            return True
        self.handle(name)
        return True

    def hibernate(self, name: SegmentName) -> None:
        """Close a tiered segment in its host: nothing of it is on a node, so the next
        reader opens it again anywhere (``wake``). A call in flight fails and is retried
        by its client, which wakes it."""
        self.forget(name)
        self._marks.ended(name)
        with contextlib.suppress(ValueError):
            # Not waited for: a later open of it wins over this close (``Opening.at``).
            close_segment(segment_actor(name), guard().internal_token())
        if self.node_local and self.storage().tiered(name.segment_id) is not None:
            self.placements().delete(name.segment_id)  # its files left the node's disk

    async def put_to_sleep(self, name: SegmentName, stats: dict) -> None:
        """End a drained sealed segment's actor (a replicated one's followers too), its
        ``stats`` kept for observers; its files stay, and the next reader starts it again
        where they are (``wake``)."""
        self.sleeping().put_to_sleep(name.segment_id, stats)
        self.hibernate(name)
        if self._replicated(name):
            await self.replicas.rest(name)

    def hibernating(self, name: SegmentName) -> bool:
        """Whether the fleet ended the segment's actor and nobody has started it since
        through the fleet (observers skip looking it up: one GCS round trip saved each)."""
        return self._marks.marked(name)

    async def _woken_replicated(self, name: SegmentName) -> bool:
        """Whether ``name`` is a replicated segment that slept, woken now (``wake``): its
        actor is then reached as a layout operation reaches it (``_reach``), since its
        leader's node may have gone while it slept, and a replica elected meanwhile."""
        if not (self._replicated(name) and self.sleeping().get(name.segment_id) is not None):
            return False
        return await asyncio.to_thread(self.wake, name)
