"""Plumbing the Ray clients share: joining the cluster, and how a Ray driver's producer
and consumers reach segments and coordinators (their actors, called directly)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from runtime.connect import connect
from runtime.errors import SegmentNotFoundError
from runtime.names import SegmentName, TopicName
from runtime.remote import ACTOR_GONE, call

if TYPE_CHECKING:
    from clients._producer_core import SegmentAccess


def joined(address: str | None = None) -> None:
    """Make this process a Ray driver if it is not one yet, as ``ScalableTopicsAdmin``
    does: ``address``, else ``RAY_ADDRESS``, else a cluster started on this machine
    with ``ray start``, else the embedded Ray (``runtime.connect.connect``). Every
    client calls it first, so two lines (an import and ``Producer(topic).send(...)``)
    are a whole program. In a Ray task or actor, or after the application's own
    ``ray.init``, the process is connected already and nothing changes."""
    if not ray.is_initialized():
        connect(address)


def segment_access(credential: str | None) -> SegmentAccess:
    """How a Ray driver's producer reaches segments: through their actors, looked up by
    name; while an actor restarts or is not registered yet, sends wait and retry."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from actors.segment.lookup import find_segment_actor
    from clients._producer_core import SegmentAccess

    return SegmentAccess(
        find=lambda name: find_segment_actor(name, credential=credential),
        unavailable=(SegmentNotFoundError, ActorUnavailableError, ActorDiedError, *ACTOR_GONE),
    )


class RayGroupAccess:
    """``GroupAccess`` of a Ray driver: the subscription's coordinator and the segments'
    actors, called directly."""

    def __init__(self, topic: TopicName, subscription: str, credential: str | None) -> None:
        from actors.control.coordinator_host import coordinator_actor

        self.coordinator = coordinator_actor(topic, subscription)
        self.subscription = subscription
        self.credential = credential
        self.restarting: tuple[type[BaseException], ...] = ACTOR_GONE

    async def register(self, consumer: str) -> dict[str, Any]:
        return await call(self.coordinator.register.remote(consumer, credential=self.credential))

    async def poll(
        self, consumer: str, known_version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        ref = self.coordinator.poll.remote(
            consumer, known_version, timeout_s, credential=self.credential
        )
        return await call(ref)

    async def release(self, consumer: str, segment_id: int, position: int | None) -> None:
        ref = self.coordinator.release.remote(
            consumer, segment_id, position, credential=self.credential
        )
        await call(ref)

    async def finished(self, consumer: str, segment_id: int, position: int | None) -> None:
        ref = self.coordinator.finished.remote(
            consumer, segment_id, position, credential=self.credential
        )
        await call(ref)

    async def unregister(self, consumer: str) -> None:
        await call(self.coordinator.unregister.remote(consumer, credential=self.credential))

    async def ensure_group(self, session_grace_s: float) -> None:
        ref = self.coordinator.ensure_group.remote(session_grace_s, credential=self.credential)
        await call(ref)

    async def reset(self, finished: list[int], positions: dict[int, int]) -> None:
        await call(self.coordinator.reset.remote(finished, positions, credential=self.credential))

    async def snapshot(self) -> dict[str, Any]:
        return await call(self.coordinator.snapshot.remote(credential=self.credential))

    async def find(self, name: SegmentName) -> Any:
        from actors.segment.lookup import find_segment_actor

        return await find_segment_actor(name, credential=self.credential)

    async def find_again(self, name: SegmentName) -> Any | None:
        from actors.segment.lookup import find_segment_again

        return await find_segment_again(name, credential=self.credential)

    async def position(self, segment: Any, name: SegmentName) -> int:
        ref = segment.position.remote(self.subscription, credential=self.credential)
        return (await call(ref))["position"]

    async def ack_cumulative(self, segment: Any, name: SegmentName, offset: int) -> None:
        ref = segment.ack_cumulative.remote(self.subscription, offset, credential=self.credential)
        await call(ref)

    async def close(self) -> None:
        """Nothing to let go of: Ray keeps the handles."""
