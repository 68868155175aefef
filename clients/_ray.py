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
        self.topic = topic
        self.subscription = subscription
        self.credential = credential
        self.restarting: tuple[type[BaseException], ...] = ACTOR_GONE
        self.coordinator = self._find_coordinator()

    async def register(self, consumer: str) -> dict[str, Any]:
        return await self._coordinate("register", consumer)

    async def poll(
        self, consumer: str, known_version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        return await self._coordinate("poll", consumer, known_version, timeout_s)

    async def release(self, consumer: str, segment_id: int, position: int | None) -> None:
        await self._coordinate("release", consumer, segment_id, position)

    async def finished(self, consumer: str, segment_id: int, position: int | None) -> None:
        await self._coordinate("finished", consumer, segment_id, position)

    async def unregister(self, consumer: str) -> None:
        await self._coordinate("unregister", consumer)

    async def ensure_group(self, session_grace_s: float) -> None:
        await self._coordinate("ensure_group", session_grace_s)

    async def reset(self, finished: list[int], positions: dict[int, int]) -> None:
        await self._coordinate("reset", finished, positions)

    async def snapshot(self) -> dict[str, Any]:
        return await self._coordinate("snapshot")

    async def _coordinate(self, method: str, *args: Any) -> Any:
        """``method`` of the coordinator. Its host may have exited for good (its namespace
        ran no coordinator for a while, ``actors.control.coordinator_host``), before the
        call ran: the call goes once more, to the host found again (started if none runs).
        A host that restarts is Ray's to wait for (its calls are retried)."""
        from ray.exceptions import ActorDiedError

        try:
            return await call(self._ask(method, *args))
        except ActorDiedError:
            self.coordinator = self._find_coordinator()
        return await call(self._ask(method, *args))

    def _ask(self, method: str, *args: Any) -> Any:
        return getattr(self.coordinator, method).remote(*args, credential=self.credential)

    def _find_coordinator(self) -> Any:
        from actors.control.coordinator_host import coordinator_actor

        return coordinator_actor(self.topic, self.subscription)

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
