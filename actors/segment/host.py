"""The segment host: one detached, restartable Ray actor that serves many segments, of
every topic of one namespace (``runtime.segment_hosts`` names them).

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

Idle hosts exit: a host that has served no segment, and been called by nobody, for
``RAYTOPICS_HOST_IDLE_EXIT_S`` (a namespace whose topics were deleted or all hibernate)
ends its process, unless the directory names it for a segment (one it will open on its
first call after a restart, or one a starter is opening in it right now: the closing mark
of ``actors.segment.directory`` orders the two). The next segment opened in the namespace
starts a host again.

Topic incarnations: a host outlives the topics it serves, so a topic deleted and created
again under its name may find its old segments still open here. Whoever starts an
incarnation closes what the earlier one left (``close_topic``), and an opening of another
incarnation than the one open replaces it, never serves it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError

from actors.capacity import segment_memory
from actors.guard import guard
from actors.idle_exit import IdleExit, end_this_actor
from actors.registry import get_or_start, gone_for_good, public_coroutines
from actors.segment.actor import Segment
from actors.segment.directory import Entry, SegmentDirectory
from actors.segment.handle import Opening, SegmentHandle
from runtime.auth import Permission
from runtime.config import apply_settings, topic_settings
from runtime.errors import ScalableTopicsError, SegmentNotFoundError, UnavailableError
from runtime.names import SegmentName, TopicName
from runtime.segment_hosts import host_name, host_namespace, hosts_per_namespace
from storage.durability import Durability, default_storage_root
from storage.topic_storage import new_incarnation

# The methods of ``Segment`` a caller may reach through ``call`` (``close`` is the host's).
SEGMENT_METHODS = public_coroutines(Segment, "close")
# Long-polling readers of every segment of the host wait at once.
MAX_CONCURRENT_CALLS = 10_000
# How long a starter waits for a host that marked itself closing to stay or exit.
CLOSING_WAIT_S = 10.0


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
        # The time of the last ``close_topic`` of each topic: an opening made before it is
        # of an incarnation that ended (Ray may deliver it late, or retry it after a restart).
        self._topic_closed: dict[str, int] = {}
        # After a restart, an opening made before it (Ray retries the calls in flight) must
        # not create storage: a segment whose storage is gone must fail, not serve an empty
        # log in its place. One made since is a new segment's.
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._started_at = time.time_ns()
        self._idle = IdleExit(lambda: bool(self._segments), self._exit_unless_named)
        self._directory.unmark_closing(name)  # a restarted host is not closing
        self._idle.look()

    async def open(self, segment: str, opening: Opening) -> None:
        """Serve ``segment`` as ``opening`` says, unless it is served here already or was
        closed after ``opening`` was made. Its starter entered it in the directory already
        (``start_segment_actor``); the host enters it again with its own node."""
        self._idle.called()
        await self._open_as(segment, opening)

    async def call(
        self, segment: str, method: str, opening: Opening | None, *args: Any, **kwargs: Any
    ) -> Any:
        """``method`` of the open ``segment`` (which checks the caller's credential). A call
        through the handle its opener got carries the ``opening``, so it finds the
        segment open even if it runs before the ``open`` sent ahead of it."""
        self._idle.called()
        if method not in SEGMENT_METHODS:
            raise AttributeError(f"a segment has no method {method!r}")
        if opening is not None and not self._serves_as(segment, opening):
            await self._open_as(segment, opening)
        return await getattr(self._serving(segment), method)(*args, **kwargs)

    async def close(self, segment: str, at: int, *, credential: str | None = None) -> bool:
        """Stop serving ``segment`` (it hibernates, was deleted, or belongs to an incarnation
        that ended) unless it was opened after ``at``; whether it was open here. Its entry
        goes first, so nobody looks it up here meanwhile."""
        self._idle.called()
        name = SegmentName.parse(segment)
        guard().check(credential, Permission.ADMIN, name.topic.namespace_path)
        if not self._newer(segment, at):
            return False
        self._directory.remove(name, self._name, issued_at=at)
        served = self._segments.pop(segment, None)
        if served is None:
            return False
        await served.close()
        self._idle.look()
        return True

    async def close_topic(self, topic: str, at: int, *, credential: str | None = None) -> int:
        """Stop serving every segment of ``topic`` opened before ``at`` (its incarnation
        ended, or one starts that must not find them), and refuse openings made before
        ``at`` from now on; how many were open."""
        self._idle.called()
        name = TopicName.parse(topic)
        guard().check(credential, Permission.ADMIN, name.namespace_path)
        self._topic_closed[str(name)] = max(at, self._topic_closed.get(str(name), 0))
        mine = {s: SegmentName.parse(s) for s in self._segments}
        closing = [s for s, n in mine.items() if n.topic == name and self._newer(s, at)]
        for segment in closing:
            self._directory.remove(mine[segment], self._name, issued_at=at)
            await self._segments.pop(segment).close()
        self._idle.look()
        return len(closing)

    def _exit_unless_named(self) -> None:
        """End this process (it served no segment and nobody called it for
        ``RAYTOPICS_HOST_IDLE_EXIT_S``) unless a directory entry names it meanwhile: a
        segment's starter enters it before it calls (``start_segment_actor``)."""
        self._directory.mark_closing(self._name)
        if self._segments or self._directory.names_host(host_namespace(self._name), self._name):
            self._directory.unmark_closing(self._name)
            self._idle.look()
            return
        end_this_actor()

    async def stats_of(
        self, segments: list[str], *, credential: str | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """``stats`` of each of ``segments`` in one call (the controller's maintenance round
        asks every segment each round); ``None`` for one not served here."""
        return await self._each(segments, "stats", credential)

    async def replica_statuses(
        self, segments: list[str], *, credential: str | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """``replica_status`` of each of ``segments`` in one call (the controller's replica
        rounds ask every replica each round); ``None`` for one not served here."""
        return await self._each(segments, "replica_status", credential)

    async def _each(
        self, segments: list[str], method: str, credential: str | None
    ) -> dict[str, dict[str, Any] | None]:
        self._idle.called()
        found: dict[str, dict[str, Any] | None] = {}
        for segment in segments:
            try:
                found[segment] = await getattr(self._serving(segment), method)(
                    credential=credential
                )
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
            entry = self._directory.get_replica(name, self._name)  # a follower here
        if entry is None:
            raise ActorUnavailableError(f"{name} is not served by {self._name}", None)
        if entry.failed is not None:
            raise SegmentNotFoundError(entry.failed)
        # After a restart of this host, perhaps on another node.
        return self._open(name, replace(entry, node=self._node), create=False)

    def _serves_as(self, segment: str, opening: Opening) -> bool:
        """Whether ``segment`` is open here, of the incarnation ``opening`` names."""
        served = self._segments.get(segment)
        return served is not None and served.incarnation == opening.incarnation

    async def _open_as(self, segment: str, opening: Opening) -> None:
        """Open ``segment`` as its starter says (``opening`` needs ``admin``), unless it is
        open or was closed after ``opening`` was made; one open of another incarnation is
        closed first."""
        name = SegmentName.parse(segment)
        guard().check(opening.credential, Permission.ADMIN, name.topic.namespace_path)
        if self._serves_as(segment, opening) or not self._may_open(name, opening):
            return
        replaced = self._segments.pop(segment, None)
        if replaced is not None:
            await replaced.close()
        entry = Entry(
            self._name,
            self._node,
            opening.storage_root,
            opening.durability,
            opening.incarnation,
            entered_at=opening.at,
            replica=opening.replica,
        )
        may_create = opening.create and (not self._restarted or opening.at > self._started_at)
        self._open(name, entry, may_create)

    def _may_open(self, name: SegmentName, opening: Opening) -> bool:
        """Whether ``opening`` is the latest change to the segment and was made after its
        topic's last ``close_topic`` (and record it as the latest)."""
        if opening.at < self._topic_closed.get(str(name.topic), 0):
            return False
        return self._newer(str(name), opening.at)

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
    replica: bool = False,
) -> SegmentHandle:
    """Handle to the segment, served by its host (started if missing; on Ray node ``node``
    only, when given: the one whose disk has the segment; else one of ``hosts`` per topic,
    ``RAYTOPICS_SEGMENT_HOSTS`` by default). Looking a served one up is
    ``actors.segment.lookup.segment_actor``, which does not import this module.

    The host opens the existing storage of topic incarnation ``incarnation``;
    ``initialize`` lets a brand-new segment create it (the controller initializes
    storage itself beforehand), and a segment started outside any topic (tests,
    benchmarks) gets an incarnation of its own. ``replica``: a follower of a replicated
    segment, on ``node`` (clients are not sent to it).
    """
    if incarnation is None:
        if not initialize:
            raise ValueError("a segment opening existing storage needs its incarnation")
        incarnation = new_incarnation()
    durability = durability or Durability.from_env()
    root = str(storage_root or default_storage_root())
    host_of = host_name(name, node, hosts or hosts_per_namespace(), topic_settings())
    directory = SegmentDirectory()
    # Entered before the host is looked up, and so before it runs ``open``: whoever looks the
    # segment up from now on finds its host, a call that overtakes the open opens it there
    # (``_serving``), and a host about to exit for idleness sees it (``_exit_unless_named``).
    at = time.time_ns()
    entry = Entry(
        host_of, node or "", root, asdict(durability), incarnation, entered_at=at, replica=replica
    )
    directory.put(name, entry)

    def start() -> ray.actor.ActorHandle:
        return get_or_start(
            SegmentHost, host_of, host_of, topic=name.topic, memory=segment_memory(), node=node
        )

    host = start()
    if directory.closing(host_of):
        _wait_out_closing(directory, host_of)
        host = start()  # the same host if it stayed, else a new one
    token = guard().internal_token()
    opening = Opening(root, asdict(durability), initialize, incarnation, at, token, replica)
    host.open.remote(str(name), opening)
    return SegmentHandle(host, str(name), opening)


def _wait_out_closing(directory: SegmentDirectory, host: str) -> None:
    """Wait until ``host``, marked closing, has either stayed (it lifts its mark) or exited
    (its mark is lifted here); a mark left by a host that died between marking and
    deciding is outwaited (a restarted host lifts its own)."""
    deadline = time.monotonic() + CLOSING_WAIT_S
    while directory.closing(host) and time.monotonic() < deadline:
        if gone_for_good(host):
            directory.unmark_closing(host)
            return
        time.sleep(0.02)
