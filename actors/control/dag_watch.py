"""DAG watch sessions: both halves, the long-poll server and the client that follows it.

Modelled on Ray Serve's long-poll host. Any number of watchers park an async
call per topic; the server reads the topic's metadata (never the controller),
so producers and consumers keep learning layouts while a controller restarts.
GCS KV has no change notifications: the controller pokes ``notify`` right after
each compare-and-swap that changes a layout (a create, split, merge, prune, delete or a
rebuild of lost metadata), which is how changes reach clients at once. The server
also re-reads each watched topic every ``POLL_INTERVAL_S`` while someone listens,
a safety net for a poke that never came (sent while this server restarted), slow
enough to cost nothing while topics sit idle.

It is also how clients read a layout at all: the layout names every segment,
so it is served only to a caller whose credential has ``lookup`` on the topic's
namespace (``actors.guard``), never read by the client from the metadata store.
A client that is about to produce or consume asks for the layout with that
purpose, so the one call that starts it also tells it, before anything else
happens, whether it may.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.guard import guard
from actors.registry import get_or_start
from runtime.auth import Permission
from runtime.config import apply_settings
from runtime.errors import (
    InvalidArgumentError,
    TopicNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from runtime.layout import SegmentLayout
from runtime.layout_watch import LayoutWatch
from runtime.names import TopicName
from runtime.remote import call
from storage.catalog import Catalog
from storage.metadata import Version

ACTOR_NAME = "dagwatch"
POLL_INTERVAL_S = 1.0
_UNWATCHED_S = 30.0  # a topic nobody listened to for this long is no longer re-read
_DELETED = -1
_REFUSED_RETRY_S = 1.0


class _Topic:
    """The latest snapshot of one topic and the listeners waiting for the next."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.version: Version | None = None  # of the record last parsed
        self.layout: dict[str, Any] | None = None
        self.changed = asyncio.Event()
        self.listeners = 0
        self.poller: asyncio.Task | None = None


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class DagWatchServer:
    def __init__(
        self, poll_interval_s: float = POLL_INTERVAL_S, settings: dict[str, str] | None = None
    ) -> None:
        apply_settings(settings)
        self._catalog = Catalog()
        self._guard = guard()
        self._poll_interval_s = poll_interval_s
        self._topics: dict[str, _Topic] = {}

    async def layout(
        self, topic: str, purpose: str = "lookup", *, credential: str | None = None
    ) -> dict[str, Any]:
        """The topic's current layout, for a caller allowed ``purpose`` (``lookup``,
        ``produce``, ``consume`` or ``admin``; each implies ``lookup``) on its namespace.

        Raises ``TopicNotFoundError`` when there is no such topic.
        """
        name = TopicName.parse(topic)
        try:
            permission = Permission(purpose)
        except ValueError:
            allowed = ", ".join(p.value for p in Permission)
            raise InvalidArgumentError(f"purpose {purpose!r}: one of {allowed}") from None
        self._guard.check(credential, permission, name.namespace_path)
        return self._catalog.require_topic(name).layout.to_dict()

    async def listen(
        self,
        topic: str,
        known_epoch: int | None,
        timeout_s: float = 30.0,
        *,
        credential: str | None = None,
    ) -> dict[str, Any] | None:
        """The layout once its epoch differs from ``known_epoch``; ``None`` on timeout.

        Raises ``TopicNotFoundError`` once the topic is deleted.
        """
        parsed = TopicName.parse(topic)
        self._guard.check(credential, Permission.LOOKUP, parsed.namespace_path)
        name = str(parsed)
        state = self._topics.setdefault(name, _Topic())
        state.listeners += 1
        try:
            if state.epoch is None or state.epoch == _DELETED:
                # Unknown, or deleted when last read: the name may be live again (deleted
                # and created anew) before the next poll, and its new layout is what
                # this caller read.
                self._refresh(name, state)
            if state.poller is None:
                state.poller = asyncio.get_running_loop().create_task(self._poll(name, state))
            deadline = asyncio.get_running_loop().time() + timeout_s
            while state.epoch == known_epoch:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.changed.wait(), timeout=remaining)
            if state.epoch == _DELETED:
                raise TopicNotFoundError(f"topic {name} does not exist")
            return state.layout
        finally:
            state.listeners -= 1

    async def notify(self, topic: str, *, credential: str | None = None) -> None:
        """Re-read ``topic`` now (called by the controller after a layout change)."""
        parsed = TopicName.parse(topic)
        self._guard.check(credential, Permission.ADMIN, parsed.namespace_path)
        name = str(parsed)
        if name in self._topics:
            self._refresh(name, self._topics[name])

    async def _poll(self, name: str, state: _Topic) -> None:
        unwatched_s = 0.0
        while unwatched_s < _UNWATCHED_S:
            await asyncio.sleep(self._poll_interval_s)
            self._refresh(name, state)
            unwatched_s = unwatched_s + self._poll_interval_s if state.listeners == 0 else 0.0
        del self._topics[name]

    def _refresh(self, name: str, state: _Topic) -> None:
        changed = self._catalog.topic_if_changed(TopicName.parse(name), state.version)
        if changed is None:
            return  # unchanged since the last poll: nothing to parse
        record, state.version = changed
        if record is None:
            epoch, layout = _DELETED, None
        else:
            epoch, layout = record.epoch, record.layout.to_dict()
        if epoch != state.epoch:
            state.epoch, state.layout = epoch, layout
            state.changed.set()
            state.changed = asyncio.Event()


async def fetch_layout(
    topic: TopicName, credential: str | None, purpose: Permission = Permission.LOOKUP
) -> SegmentLayout:
    """The topic's layout from the DAG watch, for a caller allowed ``purpose`` on its
    namespace; ``UnauthenticatedError`` / ``UnauthorizedError`` otherwise."""
    ref = dag_watch_actor().layout.remote(str(topic), purpose.value, credential=credential)
    return SegmentLayout.from_dict(await call(ref))


class DagWatch(LayoutWatch):
    """A Ray driver's layout watch: long-polls the DAG watch server."""

    def __init__(
        self,
        topic: TopicName,
        layout: SegmentLayout,
        credential: str | None,
        poll_timeout_s: float = 20.0,
    ) -> None:
        """Use ``open``: a watch starts from a layout read with the caller's credential."""
        super().__init__(topic, layout)
        self._credential = credential
        self._poll_timeout_s = poll_timeout_s

    @classmethod
    async def open(
        cls,
        topic: TopicName,
        credential: str | None,
        purpose: Permission = Permission.LOOKUP,
        poll_timeout_s: float = 20.0,
    ) -> DagWatch:
        """A watch of ``topic`` for a caller allowed ``purpose``: raises the refusal now."""
        layout = await fetch_layout(topic, credential, purpose)
        return cls(topic, layout, credential, poll_timeout_s)

    async def _fetch(self) -> SegmentLayout:
        return await fetch_layout(self.topic, self._credential)

    async def _run(self) -> None:
        while not self.deleted:
            try:
                ref = dag_watch_actor().listen.remote(
                    str(self.topic),
                    self.layout.epoch,
                    self._poll_timeout_s,
                    credential=self._credential,
                )
                found = await call(ref)
            except TopicNotFoundError:
                self._deleted()
            except RayActorError:
                await asyncio.sleep(0.2)  # the watch server is restarting
            except (UnauthenticatedError, UnauthorizedError) as err:
                # The credential was revoked: what the client does with the segments is
                # refused there; a restored grant lets the watch go on.
                self.refused = err
                await asyncio.sleep(_REFUSED_RETRY_S)
            else:
                self.refused = None
                if found is not None:
                    self._publish(SegmentLayout.from_dict(found))


def dag_watch_actor() -> ray.actor.ActorHandle:
    return get_or_start(DagWatchServer, ACTOR_NAME)
