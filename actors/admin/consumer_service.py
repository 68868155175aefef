"""What a stream consumer outside Ray asks the cluster: its group membership and its
subscription's cursor in each segment.

A Ray driver's stream consumer calls its subscription's coordinator and its segments'
actors itself (``clients._group_core``). A process that is not a Ray driver asks
the REST gateway, which runs these operations as the caller: each hands the caller's
credential on, so the coordinator and the segment check it again where the state
lives, as they check a Ray driver's; the records themselves still travel over the
segments' data plane. The topic and the subscription must exist before anything is
started for them: a made-up name gets 404, never a coordinator of its own.

A coordinator or a segment that is restarting answers ``UnavailableError`` (503),
which the client retries as a Ray driver retries a call that met an actor's restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import Field
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.admin.permits import admin_operation
from actors.control.coordinator_host import CoordinatorHandle, coordinator_actor
from actors.guard import Guard
from actors.segment.lookup import SegmentHandle, find_segment_actor
from runtime.admin_api import Ordinal, Seconds, SegmentId
from runtime.errors import SegmentNotFoundError, SubscriptionNotFoundError, UnavailableError
from runtime.layout import SegmentLayout
from runtime.names import TopicName, validate_part
from runtime.readiness import MAX_WAIT_S
from runtime.remote import call
from runtime.subscription import DEFAULT_GRACE_S
from storage.catalog import Catalog
from storage.records import SubscriptionKind, SubscriptionMetadata

RESTARTING = (ActorDiedError, ActorUnavailableError, RayActorError)
# How long a segment's lookup waits for its actor (a hibernated one is started again).
SEGMENT_WAIT_S = 10.0
# A consumer's known assignment version before its first: any assignment is news.
NO_VERSION = -1
SegmentKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,18})$")]  # an id as a JSON key


class ConsumerOperations:
    _catalog: Catalog
    _guard: Guard

    # --- membership: the subscription's coordinator -----------------------------------

    @admin_operation
    async def register_consumer(
        self, name: TopicName, subscription: str, consumer: str, *, credential: str | None = None
    ) -> dict[str, Any]:
        """Join (again within the grace period: the same segments); the assignment."""
        coordinator = self._coordinator(name, subscription, consumer)
        return await _answer(coordinator.register.remote(consumer, credential=credential))

    @admin_operation
    async def poll_assignment(
        self,
        name: TopicName,
        subscription: str,
        consumer: str,
        known_version: Annotated[int, Field(ge=NO_VERSION)] = NO_VERSION,
        wait_s: Annotated[Seconds, Field(le=MAX_WAIT_S)] = 0.0,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``{"assignment": ...}`` once it differs from ``known_version``, ``{"assignment":
        None}`` after ``wait_s``; the consumer's heartbeat either way."""
        coordinator = self._coordinator(name, subscription, consumer)
        poll = coordinator.poll.remote(consumer, known_version, wait_s, credential=credential)
        return {"assignment": await _answer(poll)}

    @admin_operation
    async def hand_back_segment(
        self,
        name: TopicName,
        subscription: str,
        consumer: str,
        segment_id: SegmentId,
        finished: bool,
        position: Ordinal | None = None,
        *,
        credential: str | None = None,
    ) -> None:
        """A segment the consumer held, given up (a rebalance took it, after what was
        delivered from it was acknowledged) or ``finished``: read to its end, which is
        refused (409) while it is not sealed or not read out."""
        coordinator = self._coordinator(name, subscription, consumer)
        method = coordinator.finished if finished else coordinator.release
        await _answer(method.remote(consumer, segment_id, position, credential=credential))

    @admin_operation
    async def unregister_consumer(
        self, name: TopicName, subscription: str, consumer: str, *, credential: str | None = None
    ) -> None:
        coordinator = self._coordinator(name, subscription, consumer)
        await _answer(coordinator.unregister.remote(consumer, credential=credential))

    # --- a checkpoint group's shared progress: its coordinator -------------------------

    @admin_operation
    async def ensure_checkpoint_group(
        self,
        name: TopicName,
        subscription: str,
        session_grace_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = DEFAULT_GRACE_S,
        *,
        credential: str | None = None,
    ) -> None:
        """Made on its first use; ``ConflictError`` when the name is a subscription's."""
        self._catalog.require_topic(name)
        coordinator = coordinator_actor(name, validate_part("subscription", subscription))
        await _answer(coordinator.ensure_group.remote(session_grace_s, credential=credential))

    @admin_operation
    async def reset_checkpoint_group(
        self,
        name: TopicName,
        subscription: str,
        finished: list[SegmentId],
        positions: dict[SegmentKey, Ordinal] | None = None,
        *,
        credential: str | None = None,
    ) -> None:
        """The group's finished segments and positions become a checkpoint's."""
        coordinator = self._checkpoint_group(name, subscription)
        by_id = {int(segment): offset for segment, offset in (positions or {}).items()}
        await _answer(coordinator.reset.remote(finished, by_id, credential=credential))

    @admin_operation
    async def checkpoint_group(
        self, name: TopicName, subscription: str, *, credential: str | None = None
    ) -> dict[str, Any]:
        """``{"finished": [...], "consumers": {name: [segment ids]}, ...}``."""
        coordinator = self._checkpoint_group(name, subscription)
        return await _answer(coordinator.snapshot.remote(credential=credential))

    # --- cursors: the segments ---------------------------------------------------------

    @admin_operation
    async def get_cursor(
        self,
        name: TopicName,
        subscription: str,
        segment_id: SegmentId,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """``{"position": first offset not acknowledged, "drained": ...}``."""
        segment = await self._segment(name, subscription, segment_id, credential)
        status = await _answer(segment.position.remote(subscription, credential=credential))
        return {"position": status["position"], "drained": status["drained"]}

    @admin_operation
    async def acknowledge_cumulative(
        self,
        name: TopicName,
        subscription: str,
        segment_id: SegmentId,
        offset: Ordinal,
        *,
        credential: str | None = None,
    ) -> None:
        segment = await self._segment(name, subscription, segment_id, credential)
        await _answer(segment.ack_cumulative.remote(subscription, offset, credential=credential))

    # --- internals ---------------------------------------------------------------------

    def _coordinator(self, name: TopicName, subscription: str, consumer: str) -> CoordinatorHandle:
        validate_part("consumer name", consumer)
        self._require_subscription(name, subscription)
        return coordinator_actor(name, subscription)

    def _checkpoint_group(self, name: TopicName, subscription: str) -> CoordinatorHandle:
        """Only a checkpoint group's progress is read or set here: a subscription's is its
        consumers' acknowledgements."""
        _, meta = self._require_subscription(name, subscription)
        if meta.kind != SubscriptionKind.CHECKPOINT_GROUP:
            raise SubscriptionNotFoundError(f"{name} has no checkpoint group {subscription!r}")
        return coordinator_actor(name, subscription)

    def _require_subscription(
        self, name: TopicName, subscription: str
    ) -> tuple[SegmentLayout, SubscriptionMetadata]:
        """The topic's layout and the subscription's record, once the topic and then the
        subscription are known to exist (the error names the first that does not)."""
        layout = self._catalog.require_topic(name).layout
        meta = self._catalog.require_subscription(name, validate_part("subscription", subscription))
        return layout, meta

    async def _segment(
        self, name: TopicName, subscription: str, segment_id: int, credential: str | None
    ) -> SegmentHandle:
        layout, _ = self._require_subscription(name, subscription)
        if segment_id not in layout.all_segments:
            raise SegmentNotFoundError(f"{name} has no segment {segment_id}")
        segment = layout.get(segment_id).name(name)
        with _restarts_unavailable(f"segment {segment_id} of {name}"):
            return await find_segment_actor(
                segment, SEGMENT_WAIT_S, unless_dead=True, credential=credential
            )


async def _answer(ref: Any) -> Any:
    with _restarts_unavailable("the subscription's coordinator or segment"):
        return await call(ref)


@contextlib.contextmanager
def _restarts_unavailable(what: str) -> Iterator[None]:
    try:
        yield
    except RESTARTING as err:
        raise UnavailableError(f"{what} is restarting; ask again: {err}") from None
