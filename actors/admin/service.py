"""The admin service: every Admin API operation, carried out inside the cluster.

A check made in the caller's process decides nothing (the caller can skip it,
or run without the operator's policy), and a client that reads and writes the
metadata store itself can do anything Ray lets it. So the Python admin client
and the REST gateway are thin: they hand each request, with the credential the
caller presented, to this one detached actor, which checks it against the
cluster's stored policy (``actors.guard``) before it reads or changes anything.

Reads (metadata, listings, stats) come straight from the metadata store and the
segments, so they work while a controller restarts; mutations go to the
topic's controller, which serializes and fences them, presenting the cluster's
internal credential. A controller call interrupted by a controller restart is
sent again, with the same request id for a split or merge, which the restarted
controller recognizes, so a retry never applies an operation twice. The service
itself holds no state: Ray restarts it after a crash, and what the clients and
the gateway call it through (``actors.admin.caller``) rides that out the same way.

Operations on the cluster rather than one topic (namespace defaults and limits,
orphaned storage, the authentication policy) are ``actors.admin.cluster_service``;
Spark's, ``actors.admin.stream_service``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict
from typing import Annotated, Any

import ray
from pydantic import Field
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.admin.cluster_service import ClusterOperations
from actors.admin.consumer_service import ConsumerOperations
from actors.admin.permits import admin_operation
from actors.admin.storage_tasks import stored_incarnations
from actors.admin.stream_service import StreamOperations
from actors.admin.txn_service import TransactionOperations
from actors.capacity import check_capacity
from actors.control.controller_host import controller_actor
from actors.control.dag_watch import dag_watch_actor
from actors.control.readiness import await_readiness
from actors.control.topic_stats import topic_stats
from actors.guard import guard
from actors.registry import ADMIN_SERVICE, get_or_start
from runtime.admin_api import HashKey, Seconds, SegmentId, SplitParts, operation
from runtime.auth import Permission
from runtime.config import TOPIC_SETTINGS, apply_settings
from runtime.errors import (
    InvalidArgumentError,
    NotFoundError,
    TopicAlreadyExistsError,
    UnavailableError,
)
from runtime.layout import MAX_SEGMENTS
from runtime.limits import check_room, namespace_limits
from runtime.names import SegmentName, TopicName, validate_part
from runtime.operations import checked_request_id
from runtime.policy import TopicPolicy
from runtime.readiness import MAX_WAIT_S
from runtime.remote import call
from runtime.subscription import DEFAULT_GRACE_S, StartPosition, reset_target
from storage.catalog import Catalog
from storage.records import TopicRecord
from storage.topic_storage import choose_incarnation, is_incarnation

ACTOR_NAME = ADMIN_SERVICE
DEFAULT_RESTART_TIMEOUT_S = 30.0
DEFAULT_SEGMENT_TIMEOUT_S = 10.0
RESTART_ERRORS = (ActorDiedError, ActorUnavailableError, RayActorError)


class AdminService(StreamOperations, ConsumerOperations, ClusterOperations, TransactionOperations):
    """The Admin API, each method checking ``credential`` first; ``AdminServiceActor``
    is this class as a Ray actor."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._catalog = Catalog()
        self._guard = guard()

    # --- who is asking --------------------------------------------------------------

    @admin_operation
    async def whoami(self, *, credential: str | None = None) -> dict[str, Any]:
        """The caller's principal (``None`` while authentication is off); an unknown or
        revoked token raises ``UnauthenticatedError``."""
        principal = self._guard.authenticate(credential)
        return {
            "principal": principal.name if principal is not None else None,
            "authentication": self._guard.enabled,
        }

    # --- reads (no controller involved) --------------------------------------------

    @admin_operation
    async def list_scalable_topics(
        self, namespace: str, *, credential: str | None = None
    ) -> list[str]:
        return [f"topic://{namespace}/{name}" for name in self._catalog.topics(namespace)]

    @admin_operation
    async def get_metadata(
        self, name: TopicName, *, credential: str | None = None
    ) -> dict[str, Any]:
        return self._record(name).layout.to_dict()

    @admin_operation
    async def list_subscriptions(
        self, name: TopicName, *, credential: str | None = None
    ) -> list[str]:
        self._record(name)
        return self._catalog.subscriptions(name)

    @admin_operation
    async def get_stats(
        self,
        name: TopicName,
        *,
        segment_timeout_s: float = DEFAULT_SEGMENT_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Backlog is a bulk read over the whole DAG: a segment that cannot answer
        makes this raise ``UnavailableSegmentsError`` rather than under-report."""
        return await topic_stats(self._catalog, name, segment_timeout_s)

    @admin_operation
    async def topic_status(
        self,
        name: TopicName,
        wait_s: Annotated[Seconds, Field(le=MAX_WAIT_S)] = 0.0,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Whether every segment of the topic has a running actor (``actors.control.readiness``),
        answered as soon as it has or after ``wait_s`` seconds (at most ``MAX_WAIT_S``)."""
        return await await_readiness(self._catalog, name, wait_s)

    @admin_operation
    async def watch_layout(
        self,
        name: TopicName,
        known_epoch: Annotated[int, Field(ge=0)] | None = None,
        wait_s: Annotated[Seconds, Field(le=MAX_WAIT_S)] = 0.0,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``{"layout": ...}`` once the topic's layout epoch differs from ``known_epoch``
        (at once without one), ``{"layout": None}`` after ``wait_s`` without a change: a
        client outside Ray follows splits and merges with this, as a Ray driver does
        with the DAG watch (``actors.control.dag_watch``), which answers it. Raises
        ``TopicNotFoundError`` once the topic is deleted."""
        if known_epoch is None:
            return {"layout": self._record(name).layout.to_dict()}
        listen = dag_watch_actor().listen.remote(
            str(name), known_epoch, wait_s, credential=credential
        )
        return {"layout": await call(listen)}

    @admin_operation
    async def get_policy(self, name: TopicName, *, credential: str | None = None) -> dict[str, Any]:
        return (self._record(name).policy or TopicPolicy()).shown()

    @admin_operation
    async def get_namespace_limits(
        self, namespace: str, *, credential: str | None = None
    ) -> dict[str, int]:
        return asdict(namespace_limits(self._catalog, namespace))

    # --- topic lifecycle --------------------------------------------------------------

    @admin_operation
    async def create_scalable_topic(
        self,
        name: TopicName,
        num_segments: Annotated[int, Field(ge=1, le=MAX_SEGMENTS)],
        properties: dict[str, str] | None = None,
        *,
        request_id: str | None = None,
        settings: dict[str, str] | None = None,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``settings``: the creating program's ``runtime.config.TOPIC_SETTINGS`` (the
        certificate its segments serve with), for the topic's actors. The create of
        ``request_id`` sent again is answered with the topic it made."""
        _check_settings(settings)
        _check_properties(properties)
        rid = checked_request_id(request_id)
        if self._catalog.topic_exists(name):
            if self._record(name).created_by != rid:
                raise TopicAlreadyExistsError(f"topic {name} already exists")
        else:
            check_room(self._catalog, name, num_segments, new_topic=True)
            check_capacity(f"creating {name}", name, num_segments)
        return await self._control(
            name, restart_timeout_s, "create", num_segments, properties, request_id=rid,
            create=True, settings=settings,
        )  # fmt: skip

    @admin_operation
    async def delete_scalable_topic(
        self,
        name: TopicName,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> None:
        self._record(name)
        await self._control(name, restart_timeout_s, "delete", gone=_gone("delete_scalable_topic"))
        with contextlib.suppress(ValueError, *RESTART_ERRORS):  # none runs: none to stop
            await call(controller_actor(name).close(self._guard.internal_token()))

    # --- subscriptions ------------------------------------------------------------------

    @admin_operation
    async def create_subscription(
        self,
        name: TopicName,
        subscription: str,
        position: StartPosition = "earliest",
        session_grace_s: float = DEFAULT_GRACE_S,
        *,
        request_id: str | None = None,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> None:
        validate_part("subscription", subscription)
        self._record(name)
        principal = self._guard.authenticate(credential)
        owner = None if principal is None else principal.name
        await self._control(
            name, restart_timeout_s, "create_subscription", subscription, position,
            session_grace_s, owner=owner, request_id=checked_request_id(request_id),
        )  # fmt: skip

    @admin_operation
    async def delete_subscription(
        self,
        name: TopicName,
        subscription: str,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> None:
        """Needs ``admin``, or ``consume`` for a subscription the caller created."""
        validate_part("subscription", subscription)
        self._record(name)
        principal = self._guard.authenticate(credential)
        only_of = None
        if not self._guard.allows(principal, Permission.ADMIN, name.namespace_path):
            only_of = principal.name if principal is not None else None
        await self._control(
            name, restart_timeout_s, "delete_subscription", subscription, only_of=only_of,
            gone=_gone("delete_subscription"),
        )  # fmt: skip

    @admin_operation
    async def reset_subscription(
        self,
        name: TopicName,
        subscription: str,
        to: object,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        validate_part("subscription", subscription)
        reset_target(to)  # refused here, before the topic's controller is asked
        self._record(name)
        return await self._control(name, restart_timeout_s, "reset_subscription", subscription, to)

    # --- layout changes -----------------------------------------------------------------

    @admin_operation
    async def split_segment(
        self,
        name: TopicName,
        segment_id: SegmentId,
        at: HashKey | list[HashKey] | None = None,
        parts: SplitParts | None = None,
        *,
        request_id: str | None = None,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``request_id``: the same id sent again (a caller's retry) is applied once.
        ``at``: where the children after the first start, one hash or ascending
        hashes; ``parts``: how many near-equal children (default: two halves)."""
        self._record(name)
        rid = checked_request_id(request_id)
        return await self._control(
            name, restart_timeout_s, "split_segment", segment_id, rid, at, parts
        )

    @admin_operation
    async def merge_segments(
        self,
        name: TopicName,
        segment_id1: SegmentId,
        segment_id2: SegmentId,
        more_segment_ids: list[SegmentId] | None = None,
        *,
        request_id: str | None = None,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``more_segment_ids``: further neighbours merged in the same operation."""
        self._record(name)
        rid = checked_request_id(request_id)
        return await self._control(
            name, restart_timeout_s, "merge_segments", segment_id1, segment_id2, rid,
            more_segment_ids,
        )  # fmt: skip

    # --- operating policy ---------------------------------------------------------------

    @admin_operation
    async def set_policy(
        self,
        name: TopicName,
        policy: dict[str, Any],
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        parsed = TopicPolicy.parse(policy)
        self._record(name)
        return await self._control(name, restart_timeout_s, "set_policy", parsed.to_dict())

    # --- segments (routed through the controller) -------------

    @admin_operation
    async def create_segment(
        self,
        segment: SegmentName,
        subscriptions: list[str] | None = None,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> None:
        for sub in subscriptions or []:
            validate_part("subscription", sub)
        self._record(segment.topic)
        await self._control(
            segment.topic,
            restart_timeout_s,
            "create_segment",
            str(segment),
            list(subscriptions or []),
        )

    @admin_operation
    async def terminate_segment(
        self,
        segment: SegmentName,
        force: bool = False,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> int:
        self._record(segment.topic)
        return await self._control(
            segment.topic, restart_timeout_s, "terminate_segment", str(segment), force
        )

    @admin_operation
    async def delete_segment(
        self,
        segment: SegmentName,
        force: bool = False,
        *,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> None:
        self._record(segment.topic)
        await self._control(
            segment.topic, restart_timeout_s, "delete_segment", str(segment), force,
            gone=_gone("delete_segment"),
        )  # fmt: skip

    # --- storage: what outlives metadata (storage.topic_storage) ----------------------

    @admin_operation
    async def recover_topic(
        self,
        name: TopicName,
        incarnation: str | None = None,
        *,
        request_id: str | None = None,
        settings: dict[str, str] | None = None,
        restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Refused, with nothing changed, while the topic has live metadata (but for the
        rebuild of ``request_id`` sent again, which is finished and answered as it was),
        and when storage of several incarnations exists and ``incarnation`` does not say
        which."""
        _check_settings(settings)
        if incarnation is not None and not is_incarnation(incarnation):
            raise InvalidArgumentError(
                f"invalid incarnation {incarnation!r}: expected an id such as "
                "20261125T130241Z-3f9a1c2b (raytopics storage check lists them)"
            )
        rid = checked_request_id(request_id)
        existing = self._catalog.topic(name)
        if existing is not None and existing.created_by != rid:
            raise TopicAlreadyExistsError(
                f"topic {name} has live metadata: recover rebuilds only a topic whose "
                "metadata is lost"
            )
        if existing is None:
            stored = await stored_incarnations(name)
            incarnation = choose_incarnation(stored, name, incarnation).incarnation  # or refuse
        return await self._control(
            name, restart_timeout_s, "recover", incarnation, request_id=rid, create=True,
            settings=settings,
        )  # fmt: skip

    # --- internals ------------------------------------------------------------------------

    def _record(self, name: TopicName) -> TopicRecord:
        return self._catalog.require_topic(name)

    async def _control(
        self,
        name: TopicName,
        restart_timeout_s: float,
        method: str,
        *args: Any,
        create: bool = False,
        settings: dict[str, str] | None = None,
        gone: tuple[type[NotFoundError], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """Call the topic's controller as the system, riding out a controller restart;
        ``create``: a call that may start it (with the topic's ``settings``); ``gone``:
        a delete's errors that, on a retry after a restart, mean the first attempt did it."""
        credential = self._guard.internal_token()
        deadline = time.monotonic() + restart_timeout_s
        lost = False
        while True:
            handle = controller_actor(name, create=True, settings=settings)
            try:
                if not create:
                    await call(handle.ready.remote(credential=credential))
                method_call = getattr(handle, method).remote(*args, **kwargs, credential=credential)
                return await call(method_call)
            except RESTART_ERRORS as err:
                if time.monotonic() > deadline:
                    raise UnavailableError(
                        f"controller of {name} did not come back within {restart_timeout_s}s: {err}"
                    ) from None
                lost = True
            except NotFoundError as err:
                if lost and isinstance(err, gone):
                    return None
                raise
            await asyncio.sleep(0.05)  # a restart takes ~1-2 s: look often


def _gone(method: str) -> tuple[type[NotFoundError], ...]:
    return operation(method).gone


AdminServiceActor = ray.remote(num_cpus=0, max_restarts=-1)(AdminService)


def admin_service_actor() -> ray.actor.ActorHandle:
    """The cluster's admin service, started if it is not running."""
    return get_or_start(AdminServiceActor, ACTOR_NAME)


# --- helpers ----------------------------------------------------------------------------


def _check_settings(settings: Any) -> None:
    """Only a topic's own settings (``TOPIC_SETTINGS``) may come from its creator."""
    if settings is None:
        return
    foreign = sorted(set(settings) - set(TOPIC_SETTINGS))
    if foreign:
        raise InvalidArgumentError(
            f"settings {foreign} are the cluster's, not a topic's; a topic may set "
            f"{sorted(TOPIC_SETTINGS)}"
        )


def _check_properties(properties: Any) -> None:
    if properties is not None and len(json.dumps(properties)) > 64 * 1024:
        raise InvalidArgumentError("properties must serialize to at most 64 KiB")
