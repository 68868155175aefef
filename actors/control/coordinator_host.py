"""The coordinator host: one detached, restartable Ray actor per namespace that serves
the coordinators of every subscription and checkpoint group of its topics.

A coordinator holds little (sessions, owners, a DAG watch) and waits on its consumers'
long-polls most of the time, yet a Ray actor is a process of its own, with its start-up,
its memory and a steady share of a core even when idle: a namespace of a hundred topics
paid for a hundred. The host runs each subscription's ``SubscriptionCoordinator``
(``actors.control.coordinator``) in one process, created on the first call for it;
callers hold a ``CoordinatorHandle``, which reads like a handle to one actor per
subscription (``handle.register.remote(...)``), as a ``SegmentHandle`` does for segments.
A namespace is the unit of authorization, so a host never serves two tenants.

Restarts: Ray restarts a crashed host with its constructor's arguments only and
retries the calls that were in flight (``max_task_retries=-1``). Each coordinator is
built again on its subscription's first call, from what it persisted (registrations,
positions, finished segments), and every consumer gets a fresh grace period, as a
restarted coordinator of its own did.

A host that runs no coordinator exits after ``RAYTOPICS_HOST_IDLE_EXIT_S``, as the
controller and segment hosts do (the namespace's topics were deleted, or their
subscriptions); the next call for one of its subscriptions starts another. A caller
holding a handle to a host that exited for good looks it up again
(``clients._ray.RayGroupAccess``).

Who calls: consumers (``clients._group_core``) through ``coordinator_actor``; the
admin service's consumer operations; the controller's ``TopicCoordinators`` (reset, stop
one, stop every one of a deleted topic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from actors.control.coordinator import SubscriptionCoordinator
from actors.guard import guard
from actors.idle_exit import IdleExit
from actors.registry import get_or_start, public_coroutines
from runtime.auth import Permission
from runtime.config import apply_settings
from runtime.errors import InvalidArgumentError
from runtime.names import TopicName, validate_part
from runtime.segment_hosts import coordinator_host_name

# The methods of ``SubscriptionCoordinator`` a caller may reach through ``call``
# (``shutdown`` is the host's ``stop``).
COORDINATOR_METHODS = public_coroutines(SubscriptionCoordinator, "shutdown")
# Every consumer of every subscription of the namespace's topics long-polls at once.
MAX_CONCURRENT_CALLS = 10_000


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=MAX_CONCURRENT_CALLS)
class CoordinatorHost:
    def __init__(self, namespace: str, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._namespace = namespace
        self._guard = guard()
        self._coordinators: dict[tuple[str, str], SubscriptionCoordinator] = {}
        self._idle = IdleExit(lambda: bool(self._coordinators))
        self._idle.look()

    async def call(
        self,
        topic: str,
        subscription: str,
        method: str,
        *args: Any,
        credential: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``method`` of the coordinator of ``topic``'s ``subscription`` (which checks
        ``credential`` again for what it does). The caller needs ``consume`` before a
        coordinator is made for it; one that failed before it loaded anything (no such
        subscription) holds nothing, and is not kept."""
        self._idle.called()
        self._guard.check(credential, Permission.CONSUME, self._namespace)
        if method not in COORDINATOR_METHODS:
            raise AttributeError(f"a coordinator has no method {method!r}")
        name = self._topic(topic)
        key = (str(name), subscription)
        coordinator = self._coordinators.get(key)
        if coordinator is None:
            validate_part("subscription", subscription)
            coordinator = self._coordinators[key] = SubscriptionCoordinator(name, subscription)
        try:
            return await getattr(coordinator, method)(*args, credential=credential, **kwargs)
        except Exception:
            if not coordinator.started and self._coordinators.get(key) is coordinator:
                del self._coordinators[key]
                self._idle.look()
            raise

    async def stop(
        self, topic: str, subscription: str | None = None, *, credential: str | None = None
    ) -> int:
        """End the coordinator of ``topic``'s ``subscription`` (deleted), or with none
        given every coordinator of ``topic`` (the topic was deleted); how many ran here."""
        self._idle.called()
        self._guard.check(credential, Permission.ADMIN, self._namespace)
        name = self._topic(topic)
        keys = [
            key
            for key in self._coordinators
            if key[0] == str(name) and subscription in (None, key[1])
        ]
        for key in keys:
            await self._coordinators.pop(key).shutdown()
        self._idle.look()
        return len(keys)

    def _topic(self, topic: str) -> TopicName:
        """``topic``, which must be of this host's namespace."""
        name = TopicName.parse(topic)
        if name.namespace_path != self._namespace:
            raise InvalidArgumentError(
                f"{name} is not of namespace {self._namespace}, whose coordinators run here"
            )
        return name


@dataclass(frozen=True)
class CoordinatorMethod:
    host: ray.actor.ActorHandle
    topic: str
    subscription: str
    method: str

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return self.host.call.remote(self.topic, self.subscription, self.method, *args, **kwargs)


@dataclass(frozen=True)
class CoordinatorHandle:
    """The coordinator of ``topic``'s ``subscription`` on its namespace's host ``host``."""

    host: ray.actor.ActorHandle
    topic: str
    subscription: str

    def __getattr__(self, method: str) -> CoordinatorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return CoordinatorMethod(self.host, self.topic, self.subscription, method)


def coordinator_host(topic: TopicName) -> ray.actor.ActorHandle:
    """The coordinator host of ``topic``'s namespace, started if it is not running."""
    name = coordinator_host_name(topic)
    return get_or_start(CoordinatorHost, name, topic.namespace_path, topic=topic)


def coordinator_actor(topic: TopicName, subscription: str) -> CoordinatorHandle:
    """The subscription's coordinator, its host started if it is not running."""
    validate_part("subscription", subscription)
    return CoordinatorHandle(coordinator_host(topic), str(topic), subscription)
