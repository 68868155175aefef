"""Finding a segment's running actor from a layout: what producers, consumers, the
coordinators and the streaming planner call before they talk to a segment.

A segment is served by a host process (``actors.segment.directory``); its handle is
a ``SegmentHandle`` on that host. A layout names segments that may not be served yet
(a split's children are opened around the layout commit), whose host may be
restarting (Ray restarts a crashed one behind the same handle), or that may hibernate
(a tiered or drained segment is closed when idle, and its topic's controller opens it
again on demand, perhaps in another host, so a handle from before fails). So callers
look a segment up here, and look it up again when a call to it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from actors.controller_directory import ControllerDirectory, ControllerHandle
from actors.registry import alive_actor_names, gone_for_good, lookup
from actors.segment.directory import Entry, SegmentDirectory
from actors.segment.handle import SegmentHandle
from runtime.errors import NotLeaderError, ScalableTopicsError, SegmentNotFoundError
from runtime.names import SegmentName, TopicName
from runtime.remote import ACTOR_GONE, call
from runtime.segment_hosts import host_prefix

# How long a client waits for a segment named by the layout to register its actor.
LOOKUP_WAIT_S = 30.0
# Between calls to a segment whose actor went away (restarting, or hibernated).
RETRY_PAUSE_S = 0.2


def segment_actor(name: SegmentName) -> SegmentHandle:
    """The segment on its running host, or ``ValueError`` when it is not served: two GCS
    reads (its directory entry, its host's name), nothing started. Starting one is the
    controller's (``actors.segment.host.start_segment_actor``); this module does not
    import the segment's class, so a process that only looks segments up (a
    coordinator, the DAG watch) does not load the segment's storage and Arrow code.
    """
    entry = SegmentDirectory().get(name)
    if entry is None:
        raise ValueError(f"{name} is not served by any host")
    return SegmentHandle(lookup(entry.host), str(name))


def segment_gone_for_good(name: SegmentName) -> bool:
    """Whether ``name`` cannot be served until its controller opens it anew: its host could
    not open it (its storage is gone), or died for good (killed without restart)."""
    entry = SegmentDirectory().get(name)
    return entry is not None and (entry.failed is not None or gone_for_good(entry.host))


def served_entries(topic: TopicName) -> dict[str, Entry]:
    """The directory entries of ``topic``'s segments (by ``SegmentName.actor_name``) that a
    host whose process is up and constructed serves: two reads (Ray's actor table, the
    directory), not a call per segment."""
    alive = alive_actor_names(host_prefix(topic))
    entries = SegmentDirectory().of_topic(topic)
    return {name: entry for name, entry in entries.items() if entry.serves(alive)}


def served_segments(topic: TopicName) -> set[str]:
    """The names (``SegmentName.actor_name``) of ``served_entries``."""
    return set(served_entries(topic))


async def find_segment_actor(
    name: SegmentName,
    timeout_s: float | None = None,
    *,
    unless_dead: bool = False,
    credential: str | None = None,
) -> SegmentHandle:
    """The segment's running actor, started again if it hibernates, waiting while it is not
    registered yet.

    Clients learn of a segment from the layout, and the controller registers a
    new segment's actor only around the layout commit (and a controller that
    dies in between leaves it to its next incarnation), so a client may be a
    moment early. A tiered segment's actor exits when idle; its controller starts
    it again when asked (``credential`` needs ``lookup``). ``SegmentNotFoundError``
    once ``timeout_s`` has passed: the segment was deleted, or nobody brought its
    actor back (``LOOKUP_WAIT_S`` by default). ``unless_dead``: at once when Ray's
    actor table says the actor died for good and it does not hibernate (a planner
    that can go on without the segment need not wait for what will not come).
    """
    timeout_s = LOOKUP_WAIT_S if timeout_s is None else timeout_s
    try:
        return segment_actor(name)
    except ValueError:
        pass
    if await _wake(name, credential):
        unless_dead = False  # its controller is starting it
    if unless_dead and await asyncio.to_thread(segment_gone_for_good, name):
        raise SegmentNotFoundError(f"{name}'s actor died and Ray will not restart it")
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return segment_actor(name)
        except ValueError:
            if time.monotonic() >= deadline:
                raise SegmentNotFoundError(
                    f"{name} has no running actor (waited {timeout_s:.0f}s)"
                ) from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _wake(name: SegmentName, credential: str | None) -> bool:
    """Whether the topic's controller started ``name``'s actor because it hibernates (a
    refusal of ``credential`` is raised; no controller running: False, and the caller
    waits as for any segment that is not registered yet)."""
    controller = _controller(name.topic)
    if controller is None:
        return False
    try:
        return await call(controller.wake_segment.remote(name.segment_id, credential=credential))
    except ACTOR_GONE:
        return False


async def leader_unreachable(name: SegmentName, credential: str | None) -> None:
    """Tell ``name``'s controller that a follower lost its connection to the leader, so
    its next replica round comes at once. Best effort: the rounds find a lost leader
    anyway, a round's pause later."""
    controller = await asyncio.to_thread(_controller, name.topic)
    if controller is None:
        return
    with contextlib.suppress(ScalableTopicsError, *ACTOR_GONE):
        await call(controller.check_replicas.remote(credential=credential))


def _controller(topic: TopicName) -> ControllerHandle | None:
    """``topic``'s running controller, ``None`` when none runs. Blocking: GCS reads."""
    entry = ControllerDirectory().get(topic)
    try:
        return ControllerHandle(lookup(entry.host), str(topic)) if entry else None
    except ValueError:
        return None


async def segment_position(
    name: SegmentName,
    subscription: str | None,
    deadline: float,
    *,
    unless_dead: bool = False,
    credential: str | None = None,
) -> dict[str, Any]:
    """The segment actor's ``position`` answer (with ``subscription``'s cursor). A call
    that meets the actor gone (restarting, or hibernated between the lookup and the
    call: a sealed or tiered segment's exits when idle) is sent again to the actor
    looked up anew, until ``deadline`` (``time.monotonic()``); then the last error is
    raised, ``TimeoutError`` when no answer came. A replicated segment's replica that
    no longer leads it (its leader's node was lost) is asked again too, once the new
    leader is looked up. ``unless_dead``: as for ``find_segment_actor``,
    ``SegmentNotFoundError`` at once for an actor gone for good."""
    while True:
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            handle = await find_segment_actor(
                name, remaining, unless_dead=unless_dead, credential=credential
            )
            answer = handle.position.remote(subscription, credential=credential)
            return await asyncio.wait_for(call(answer), remaining)
        except (TimeoutError, NotLeaderError, *ACTOR_GONE):
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                raise
            await asyncio.sleep(RETRY_PAUSE_S)


async def find_segment_again(
    name: SegmentName, *, credential: str | None = None
) -> SegmentHandle | None:
    """The segment's actor looked up again after a call to it failed: Ray restarts a
    crashed actor behind the same handle, but a hibernated segment (a tiered one unused
    for its ``idleS``, even with a backlog) is started anew by this lookup, and the old
    handle stays dead. ``None`` while it is not back: the caller keeps its handle, and
    its next failed call comes back here. A refusal of ``credential`` is raised."""
    try:
        return await find_segment_actor(name, credential=credential)
    except (SegmentNotFoundError, *ACTOR_GONE):
        return None
