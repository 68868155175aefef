"""The coordinator host: one detached, restartable Ray actor per topic that serves the
coordinators of all its subscriptions and checkpoint groups.

A coordinator holds little (sessions, owners, a DAG watch) and waits on its consumers'
long-polls most of the time, yet a Ray actor is a process of its own, with its memory
and a steady share of a core even when idle: a topic with five subscriptions paid for
five. The host runs each subscription's ``SubscriptionCoordinator``
(``actors.control.coordinator``) in one process, created on the first call for it;
callers hold a ``CoordinatorHandle``, which reads like a handle to one actor per
subscription (``handle.register.remote(...)``), as a ``SegmentHandle`` does for segments.

Restarts: Ray restarts a crashed host with its constructor's arguments only and
retries the calls that were in flight (``max_task_retries=-1``). Each coordinator is
built again on its subscription's first call, from what it persisted (registrations,
positions, finished segments), and every consumer gets a fresh grace period, as a
restarted coordinator of its own did.

Who calls: consumers (``clients._group_core``) through ``coordinator_actor``; the
controller's ``TopicCoordinators`` (reset, stop, and the whole host when the topic goes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from actors.control.coordinator import SubscriptionCoordinator
from actors.guard import guard
from actors.registry import get_or_start, public_coroutines
from runtime.auth import Permission
from runtime.config import apply_settings
from runtime.names import TopicName, validate_part

# The methods of ``SubscriptionCoordinator`` a caller may reach through ``call``
# (``shutdown`` is the host's ``stop``).
COORDINATOR_METHODS = public_coroutines(SubscriptionCoordinator, "shutdown")
# Every consumer of every subscription of the topic long-polls at once.
MAX_CONCURRENT_CALLS = 10_000


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=MAX_CONCURRENT_CALLS)
class CoordinatorHost:
    def __init__(self, topic: str, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._topic = TopicName.parse(topic)
        self._guard = guard()
        self._coordinators: dict[str, SubscriptionCoordinator] = {}

    async def call(
        self, subscription: str, method: str, *args: Any, credential: str | None = None, **kwargs
    ) -> Any:
        """``method`` of ``subscription``'s coordinator (which checks ``credential`` again
        for what it does). The caller needs ``consume`` before a coordinator is made for
        it; one that failed before it loaded anything (no such subscription) holds
        nothing, and is not kept."""
        if method not in COORDINATOR_METHODS:
            raise AttributeError(f"a coordinator has no method {method!r}")
        self._guard.check(credential, Permission.CONSUME, self._topic.namespace_path)
        coordinator = self._coordinators.get(subscription)
        if coordinator is None:
            validate_part("subscription", subscription)
            coordinator = self._coordinators[subscription] = SubscriptionCoordinator(
                self._topic, subscription
            )
        try:
            return await getattr(coordinator, method)(*args, credential=credential, **kwargs)
        except Exception:
            if not coordinator.started and self._coordinators.get(subscription) is coordinator:
                del self._coordinators[subscription]
            raise

    async def stop(self, subscription: str, *, credential: str | None = None) -> bool:
        """End ``subscription``'s coordinator (its subscription was deleted); whether one
        ran here."""
        self._guard.check(credential, Permission.ADMIN, self._topic.namespace_path)
        coordinator = self._coordinators.pop(subscription, None)
        if coordinator is None:
            return False
        await coordinator.shutdown()
        return True


@dataclass(frozen=True)
class CoordinatorMethod:
    host: ray.actor.ActorHandle
    subscription: str
    method: str

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return self.host.call.remote(self.subscription, self.method, *args, **kwargs)


@dataclass(frozen=True)
class CoordinatorHandle:
    """The coordinator of ``subscription`` on the topic's host actor ``host``."""

    host: ray.actor.ActorHandle
    subscription: str

    def __getattr__(self, method: str) -> CoordinatorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return CoordinatorMethod(self.host, self.subscription, method)


def coordinator_host(topic: TopicName) -> ray.actor.ActorHandle:
    """The topic's coordinator host, started if it is not running."""
    return get_or_start(CoordinatorHost, topic.coordinator_host_name, str(topic), topic=topic)


def coordinator_actor(topic: TopicName, subscription: str) -> CoordinatorHandle:
    """The subscription's coordinator, its host started if it is not running."""
    validate_part("subscription", subscription)
    return CoordinatorHandle(coordinator_host(topic), subscription)
