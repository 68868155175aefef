"""A client outside Ray: what a Ray driver asks the cluster's actors, asked of the REST
gateway instead.

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
import time
from dataclasses import dataclass

from clients._producer_core import SegmentAccess
from clients.http import AdminHttpClient
from runtime import wire
from runtime.errors import (
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
    """What a producer outside Ray asks the cluster, through one gateway with one token."""

    def __init__(self, url: str, credential: str | None) -> None:
        # The token is the caller's: "" (explicitly none) must not fall back to the env.
        self.http = AdminHttpClient(url, token=credential or "")

    async def watch(self, topic: TopicName) -> RemoteLayoutWatch:
        try:
            return await RemoteLayoutWatch.open(topic, self.http)
        except BaseException:
            await self.http.close_async()
            raise

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
