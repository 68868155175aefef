"""The subscription coordinators of one topic, as its controller starts, resets and stops
them: every Ray call the controller's helpers make to a coordinator goes through here
(as every call to a segment goes through ``actors.control.segment_fleet``), so the
helpers' state logic runs in tests without Ray, given a stand-in.
"""

from __future__ import annotations

import contextlib

import ray
from ray.exceptions import RayActorError

from actors.control.coordinator import coordinator_actor
from actors.guard import guard
from actors.registry import lookup
from runtime.names import TopicName


class TopicCoordinators:
    def __init__(self, topic: TopicName) -> None:
        self.topic = topic

    def start(self, subscription: str) -> None:
        """Start the subscription's coordinator unless it runs (a new subscription)."""
        coordinator_actor(self.topic, subscription)

    async def reset(self, subscription: str, finished: list[int]) -> None:
        """Replace the coordinator's record of finished segments (a subscription reset)."""
        handle = coordinator_actor(self.topic, subscription)
        await handle.reset.remote(finished, {}, credential=guard().internal_token())

    async def stop(self, subscription: str) -> None:
        """End the subscription's coordinator, if any (a deleted subscription)."""
        try:
            handle = lookup(self.topic.coordinator_actor_name(subscription))
        except ValueError:
            return
        with contextlib.suppress(RayActorError):
            await handle.shutdown.remote(credential=guard().internal_token())
        ray.kill(handle, no_restart=True)
