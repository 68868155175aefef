"""The segment host: one detached, restartable Ray actor that serves many segments.

Why segments share processes, and which host a segment goes to, is
``actors.segment.directory``'s docstring. The host routes each call to an open
``Segment`` (``actors.segment.actor``) by name; callers hold a ``SegmentHandle``
(``actors.segment.handle``), which reads like a handle to one actor per segment.

Restarts: Ray restarts a crashed host with its constructor's arguments only, and
retries the calls that were in flight (``max_task_retries=-1``). The segments it
served are in the directory, with what opening them needs, so the first call to
each opens it again (never creating storage: a segment whose files are gone fails
rather than serve an empty log). A call for a segment the host does not serve
(closed, moved, never opened) fails as a call to an exited process would
(``ActorUnavailableError``), and clients look the segment up again.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError

from actors.capacity import segment_memory
from actors.guard import guard
from actors.registry import get_or_start, public_coroutines
from actors.segment.actor import Segment
from actors.segment.directory import Entry, SegmentDirectory
from actors.segment.handle import Opening, SegmentHandle
from runtime.auth import Permission
from runtime.config import apply_settings
from runtime.errors import ScalableTopicsError, SegmentNotFoundError, UnavailableError
from runtime.names import SegmentName
from runtime.segment_hosts import host_name, hosts_per_topic
from storage.durability import Durability, default_storage_root
from storage.topic_storage import new_incarnation

# The methods of ``Segment`` a caller may reach through ``call`` (``close`` is the host's).
SEGMENT_METHODS = public_coroutines(Segment, "close")
# Long-polling readers of every segment of the host wait at once.
MAX_CONCURRENT_CALLS = 10_000


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=MAX_CONCURRENT_CALLS)
class SegmentHost:
    def __init__(self, name: str, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._name = name
        self._node = ray.get_runtime_context().get_node_id()
        # Keyed by the name as callers send it (``segment://...``), no parsing per call:
        # ``SegmentName.parse`` accepts no other spelling of a name than ``str()`` gives.
        self._segments: dict[str, Segment] = {}
        # The time (``Opening.at``) of the last open or close applied to each segment: Ray
        # may run an async actor's calls out of order, and an older one must not undo it.
        self._last_change: dict[str, int] = {}
        self._directory = SegmentDirectory()
        # Only a first start may create storage: after a restart, a segment whose storage
        # is gone must fail, not serve an empty log in its place.
        self._may_create = not ray.get_runtime_context().was_current_actor_reconstructed

    async def open(self, segment: str, opening: Opening) -> None:
        """Serve ``segment`` as ``opening`` says, unless it is served here already or was
        closed after ``opening`` was made. Its starter entered it in the directory already
        (``start_segment_actor``); the host enters it again with its own node."""
        self._open_as(segment, opening)

    async def call(
        self, segment: str, method: str, opening: Opening | None, *args: Any, **kwargs: Any
    ) -> Any:
        """``method`` of the open ``segment`` (which checks the caller's credential). A call
        through the handle its opener got carries the ``opening``, so it finds the
        segment open even if it runs before the ``open`` sent ahead of it."""
        if method not in SEGMENT_METHODS:
            raise AttributeError(f"a segment has no method {method!r}")
        if opening is not None and segment not in self._segments:
            self._open_as(segment, opening)
        return await getattr(self._serving(segment), method)(*args, **kwargs)

    async def close(self, segment: str, at: int, *, credential: str | None = None) -> bool:
        """Stop serving ``segment`` (it hibernates, was deleted, or belongs to an incarnation
        that ended) unless it was opened after ``at``; whether it was open here. Its entry
        goes first, so nobody looks it up here meanwhile."""
        name = SegmentName.parse(segment)
        guard().check(credential, Permission.ADMIN, name.topic.namespace_path)
        if not self._newer(segment, at):
            return False
        self._directory.remove(name, self._name)
        served = self._segments.pop(segment, None)
        if served is None:
            return False
        await served.close()
        return True

    async def stats_of(
        self, segments: list[str], *, credential: str | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """``stats`` of each of ``segments`` in one call (the controller's maintenance round
        asks every segment each round); ``None`` for one not served here."""
        found: dict[str, dict[str, Any] | None] = {}
        for segment in segments:
            try:
                found[segment] = await self._serving(segment).stats(credential=credential)
            except (ActorUnavailableError, ScalableTopicsError):  # closed, gone, or failing
                found[segment] = None
        return found

    def _serving(self, segment: str) -> Segment:
        served = self._segments.get(segment)
        if served is not None:
            return served
        name = SegmentName.parse(segment)
        entry = self._directory.get(name)
        if entry is None or entry.host != self._name:
            raise ActorUnavailableError(f"{name} is not served by {self._name}", None)
        if entry.failed is not None:
            raise SegmentNotFoundError(entry.failed)
        # After a restart of this host, perhaps on another node.
        return self._open(name, replace(entry, node=self._node), create=False)

    def _open_as(self, segment: str, opening: Opening) -> None:
        """Open ``segment`` as its starter says (``opening`` needs ``admin``), unless it is
        open or was closed after ``opening`` was made."""
        name = SegmentName.parse(segment)
        guard().check(opening.credential, Permission.ADMIN, name.topic.namespace_path)
        if segment in self._segments or not self._newer(segment, opening.at):
            return
        entry = Entry(
            self._name, self._node, opening.storage_root, opening.durability, opening.incarnation
        )
        self._open(name, entry, opening.create and self._may_create)

    def _newer(self, segment: str, at: int) -> bool:
        """Whether a change made at ``at`` is the latest for ``segment`` (and record it)."""
        if at < self._last_change.get(segment, 0):
            return False
        self._last_change[segment] = at
        return True

    def _open(self, name: SegmentName, entry: Entry, create: bool) -> Segment:
        """Open ``name`` and enter it; one whose storage is gone is entered as failed (it
        cannot be served: readers need not wait for it) and ``SegmentNotFoundError`` raised."""
        try:
            served = Segment(name, entry.storage_root, entry.durability, create, entry.incarnation)
        except UnavailableError as err:
            failed = f"{name} cannot be opened: {err.message}"
            self._directory.put(name, replace(entry, failed=failed))
            raise SegmentNotFoundError(failed) from None
        self._segments[str(name)] = served
        self._directory.put(name, replace(entry, failed=None))
        return served


def close_segment(handle: SegmentHandle, credential: str | None) -> ray.ObjectRef:
    """Have the segment's host stop serving it (``SegmentHost.close``), unless a later
    open overtakes this."""
    return handle.host.close.remote(handle.segment, time.time_ns(), credential=credential)


def start_segment_actor(
    name: SegmentName,
    *,
    storage_root: str | None = None,
    durability: Durability | None = None,
    initialize: bool = False,
    incarnation: str | None = None,
    node: str | None = None,
    hosts: int | None = None,
) -> SegmentHandle:
    """Handle to the segment, served by its host (started if missing; on Ray node ``node``
    only, when given: the one whose disk has the segment; else one of ``hosts`` per topic,
    ``RAYTOPICS_SEGMENT_HOSTS`` by default). Looking a served one up is
    ``actors.segment.lookup.segment_actor``, which does not import this module.

    The host opens the existing storage of topic incarnation ``incarnation``;
    ``initialize`` lets a brand-new segment create it (the controller initializes
    storage itself beforehand), and a segment started outside any topic (tests,
    benchmarks) gets an incarnation of its own.
    """
    if incarnation is None:
        if not initialize:
            raise ValueError("a segment opening existing storage needs its incarnation")
        incarnation = new_incarnation()
    durability = durability or Durability.from_env()
    root = str(storage_root or default_storage_root())
    host_of = host_name(name, node, hosts or hosts_per_topic())
    host = get_or_start(
        SegmentHost, host_of, host_of, topic=name.topic, memory=segment_memory(), node=node
    )
    opening = Opening(
        root, asdict(durability), initialize, incarnation, time.time_ns(), guard().internal_token()
    )
    # Entered before the host runs ``open``: whoever looks the segment up from now on finds
    # its host, and a call that overtakes the open opens it there (``_serving``).
    SegmentDirectory().put(name, Entry(host_of, node or "", root, opening.durability, incarnation))
    host.open.remote(str(name), opening)
    return SegmentHandle(host, str(name), opening)
