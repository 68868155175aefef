"""A client outside Ray: what a Ray driver asks the cluster's actors, asked of the REST
gateway instead.

A stream consumer's group membership and acknowledgements go the same way
(``RemoteGroupAccess``): the gateway calls the subscription's coordinator and the
segments as the consumer, with its token, while the records come over the data plane.

A producer needs three things from the cluster besides the segments themselves: the
topic's layout and each change of it, where each segment's data plane listens, and its
namespace's limits. A process that is not a Ray driver (a web service, a program far
from the cluster, with neither Ray nor its version constraints) gets all three from the
gateway with its token, as the Java Spark connector does, and then speaks the data plane
exactly as a Ray driver does: the same HELLO with its token, the same append frames, so
the segments check its permission, deduplicate its retries and keep per-key order just
the same. Nothing here imports Ray.

Layout changes come as a Ray driver's do: a long poll (``GET …/layout?knownEpoch=N``)
that the gateway answers from the cluster's DAG watch as soon as a split or merge
commits. A segment sealed meanwhile refuses the next append at once, and the producer
then reads the layout without waiting (``ProducerCore.segment_sealed``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from clients._producer_core import SegmentAccess
from clients.http import AdminHttpClient
from runtime import wire
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentNotFoundError,
    TopicNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableError,
)
from runtime.layout import SegmentLayout
from runtime.layout_watch import LayoutWatch
from runtime.limits import Limits
from runtime.names import SegmentName, TopicName

# How long one long poll of the layout waits in the cluster (the gateway answers within
# half its own time-out whatever is asked), and the pause after a failed one.
LISTEN_S = 20.0
RETRY_S = 0.5
# How long a lookup waits for a segment the layout names to be served (a split's
# children start just after the layout that names them is written).
FIND_TIMEOUT_S = 30.0
# What the gateway answers while a segment is not served (a send retries it until its
# deadline), and what a lookup through the gateway may also meet that a later one may not.
NOT_SERVED = (SegmentNotFoundError, UnavailableError)
UNAVAILABLE = (*NOT_SERVED, OSError, TimeoutError)
# What a consumer's call through the gateway meets while the gateway, a coordinator or a
# segment restarts (``RequestTimeoutError`` included): asked again.
RESTARTING = (UnavailableError, OSError, TimeoutError)
URL_ENV = "RAYTOPICS_URL"


def gateway_url(url: str | None, address: str | None) -> str | None:
    """The gateway a client goes through: ``url``, else ``RAYTOPICS_URL`` unless a Ray
    ``address`` was given; ``None``: through Ray."""
    if url is not None and address is not None:
        raise InvalidArgumentError("give a Ray address or a gateway url, not both")
    if url is None and address is None:
        url = os.environ.get(URL_ENV) or None
    if url is not None and not url.startswith(("http://", "https://")):
        raise InvalidArgumentError(f"url must start with http:// or https://, got {url!r}")
    return url


class RemoteLayoutWatch(LayoutWatch):
    """A topic's layout as the gateway answers it, long-polled for each change; it owns
    the HTTP client and closes it with itself."""

    def __init__(
        self, topic: TopicName, layout: SegmentLayout, http: AdminHttpClient, listen_s: float
    ) -> None:
        super().__init__(topic, layout)
        self._http = http
        self._listen_s = listen_s

    @classmethod
    async def open(
        cls, topic: TopicName, http: AdminHttpClient, listen_s: float = LISTEN_S
    ) -> RemoteLayoutWatch:
        """The watch, from the layout read now: an unknown topic or a refused token is
        raised here."""
        return cls(topic, await http.get_layout_async(str(topic)), http, listen_s)

    async def close(self) -> None:
        await super().close()
        await self._http.close_async()

    async def _fetch(self) -> SegmentLayout:
        return await self._http.get_layout_async(str(self.topic))

    async def _run(self) -> None:
        while not self.deleted:
            try:
                found = await self._http.watch_layout_async(
                    str(self.topic), self.layout.epoch, self._listen_s
                )
            except TopicNotFoundError:
                self._deleted()
            except (UnauthenticatedError, UnauthorizedError) as err:
                self.refused = err  # the segments refuse it too; a restored grant goes on
                await asyncio.sleep(RETRY_S)
            except (ScalableTopicsError, OSError, TimeoutError):
                await asyncio.sleep(RETRY_S)  # the gateway is restarting or unreachable
            else:
                self.refused = None
                if found is not None:
                    self._publish(found)


@dataclass(frozen=True)
class RemoteSegment:
    """A segment as the gateway locates it: what the data plane's channels connect to
    (``clients._data_plane``), in place of a Ray driver's actor handle."""

    http: AdminHttpClient
    name: SegmentName

    async def locate(self) -> wire.Endpoint:
        """Where the segment's data plane listens now (after a restart: its new address)."""
        found = await self.http._op(
            "stream_endpoint", name=str(self.name.topic), segment_id=self.name.segment_id
        )
        return wire.Endpoint(str(found["host"]), int(found["port"]), bool(found["tls"]))


class RemoteCluster:
    """What a client outside Ray asks the cluster, through one gateway with one token."""

    def __init__(self, url: str, credential: str | None) -> None:
        # The token is the caller's: "" (explicitly none) must not fall back to the env.
        self.http = AdminHttpClient(url, token=credential or "")
        self.credential = credential

    async def watch(self, topic: TopicName) -> RemoteLayoutWatch:
        try:
            return await RemoteLayoutWatch.open(topic, self.http)
        except BaseException:
            await self.http.close_async()
            raise

    async def admitted_watch(self, topic: TopicName, access: int) -> RemoteLayoutWatch:
        """``watch``, once the first active segment's data plane admits this cluster's
        token for ``access`` (``wire.PRODUCE``, ``wire.CONSUME``; its HELLO alone): the
        gateway answers layouts to ``lookup``, so a token that may look but not produce
        or consume is refused here, as the DAG watch refuses it to a Ray driver."""
        from clients._data_plane import check_access  # here: it builds on this module

        watch = await self.watch(topic)
        try:
            layout = watch.layout
            first = layout.all_segments[next(iter(layout.active_segments))].name(topic)
            await check_access(await self.find_segment(first), self.credential, access)
        except BaseException:
            await watch.close()
            raise
        return watch

    async def limits_of(self, namespace: str, credential: str | None) -> Limits:
        """``clients._limits.Ask``: asked with this cluster's own token (the same)."""
        return Limits(**await self.http.get_namespace_limits_async(namespace))

    def segment_access(self) -> SegmentAccess:
        return SegmentAccess(find=self.find_segment, unavailable=NOT_SERVED)

    async def find_segment(self, name: SegmentName) -> RemoteSegment:
        """The segment once the gateway can say where it listens, waiting up to
        ``FIND_TIMEOUT_S`` for one that is starting; a refusal is raised at once."""
        segment = RemoteSegment(self.http, name)
        deadline = time.monotonic() + FIND_TIMEOUT_S
        while True:
            try:
                await segment.locate()
                return segment
            except UNAVAILABLE:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    def group_access(self, topic: TopicName, subscription: str) -> RemoteGroupAccess:
        return RemoteGroupAccess(self, topic, subscription)


class RemoteGroupAccess:
    """``clients._group_access.GroupAccess`` through the gateway: the consumer's calls to
    its coordinator and its acknowledgements as requests, as the consumer (its token)."""

    restarting: tuple[type[BaseException], ...] = RESTARTING

    def __init__(self, cluster: RemoteCluster, topic: TopicName, subscription: str) -> None:
        self.cluster = cluster
        self.http = cluster.http
        self.topic = str(topic)
        self.subscription = subscription

    async def register(self, consumer: str) -> dict[str, Any]:
        return await self._op("register_consumer", consumer=consumer)

    async def poll(
        self, consumer: str, known_version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        found = await self._op(
            "poll_assignment", consumer=consumer, known_version=known_version, wait_s=timeout_s
        )
        return found["assignment"]

    async def release(self, consumer: str, segment_id: int, position: int | None) -> None:
        await self._hand_back(consumer, segment_id, position, finished=False)

    async def finished(self, consumer: str, segment_id: int, position: int | None) -> None:
        await self._hand_back(consumer, segment_id, position, finished=True)

    async def unregister(self, consumer: str) -> None:
        await self._op("unregister_consumer", consumer=consumer)

    async def ensure_group(self, session_grace_s: float) -> None:
        await self._op("ensure_checkpoint_group", session_grace_s=session_grace_s)

    async def reset(self, finished: list[int], positions: dict[int, int]) -> None:
        await self._op("reset_checkpoint_group", finished=finished, positions=positions)

    async def snapshot(self) -> dict[str, Any]:
        return await self._op("checkpoint_group")

    async def find(self, name: SegmentName) -> RemoteSegment:
        return await self.cluster.find_segment(name)

    async def find_again(self, name: SegmentName) -> RemoteSegment | None:
        """The same segment: each connection asks the gateway where it listens now."""
        return None

    async def position(self, segment: Any, name: SegmentName) -> int:
        found = await self._op("get_cursor", segment_id=name.segment_id)
        return int(found["position"])

    async def ack_cumulative(self, segment: Any, name: SegmentName, offset: int) -> None:
        await self._op("acknowledge_cumulative", segment_id=name.segment_id, offset=offset)

    async def close(self) -> None:
        await self.http.close_async()

    async def _hand_back(
        self, consumer: str, segment_id: int, position: int | None, *, finished: bool
    ) -> None:
        await self._op(
            "hand_back_segment",
            consumer=consumer,
            segment_id=segment_id,
            finished=finished,
            position=position,
        )

    async def _op(self, operation: str, **args: Any) -> Any:
        return await self.http._op(
            operation, name=self.topic, subscription=self.subscription, **args
        )
