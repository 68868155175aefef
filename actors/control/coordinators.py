"""The subscription coordinators of one topic, as its controller starts, resets and stops
them: every Ray call the controller's helpers make to a coordinator goes through here
(as every call to a segment goes through ``actors.control.segment_fleet``), so the
helpers' state logic runs in tests without Ray, given a stand-in. The coordinators run
in its namespace's ``CoordinatorHost`` (``actors.control.coordinator_host``).
"""

from __future__ import annotations

import contextlib

import ray
from ray.exceptions import RayActorError

from actors.control.coordinator_host import coordinator_actor, coordinator_host
from actors.guard import guard
from actors.registry import lookup
from runtime.names import TopicName
from runtime.segment_hosts import coordinator_host_name


class TopicCoordinators:
    def __init__(self, topic: TopicName) -> None:
        self.topic = topic

    def start(self, subscription: str) -> None:
        """Start the namespace's coordinator host unless it runs (a new subscription); the
        subscription's coordinator is made there on its first call."""
        coordinator_host(self.topic)

    async def reset(self, subscription: str, finished: list[int]) -> None:
        """Replace the coordinator's record of finished segments (a subscription reset)."""
        handle = coordinator_actor(self.topic, subscription)
        await handle.reset.remote(finished, {}, credential=guard().internal_token())

    async def stop(self, subscription: str) -> None:
        """End the subscription's coordinator, if any (a deleted subscription)."""
        await self._stop(subscription)

    async def stop_all(self) -> None:
        """End every coordinator of the topic (a deleted topic); their host exits once it
        runs none of its namespace's either."""
        await self._stop(None)

    async def _stop(self, subscription: str | None) -> None:
        """A host that is not running, or exits meanwhile, runs no coordinator: its next
        start builds only those that are called for, of subscriptions that exist."""
        host = self._running_host()
        if host is not None:
            with contextlib.suppress(RayActorError):
                ref = host.stop.remote(
                    str(self.topic), subscription, credential=guard().internal_token()
                )
                await ref

    def _running_host(self) -> ray.actor.ActorHandle | None:
        try:
            return lookup(coordinator_host_name(self.topic))
        except ValueError:
            return None
