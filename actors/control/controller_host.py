"""The controller host: one detached, restartable Ray actor per namespace that runs the
controllers of all its topics.

A controller holds little (the topic's epoch, a lock, a maintenance loop that wakes
every few seconds) and is called rarely, yet a Ray actor is a process of its own, with
its start-up and a steady share of a core and ~80 MB even while idle: a namespace of a
thousand topics paid for a thousand. A host runs each topic's controller
(``ScalableTopicControllerActor``) in one process, as a segment host runs segments;
callers hold a ``ControllerHandle``, which reads like a handle to one actor per topic
(``handle.split_segment.remote(...)``). Topics created with settings of their own (the
certificate their segments serve with, ``runtime.config.TOPIC_SETTINGS``) share a host
only with topics created with the same, since a controller's segments start with its
process's settings (``runtime.segment_hosts.controller_host_name``).

Leadership is unchanged: each controller CAS-increments its topic's epoch when it is
opened, and every write it makes carries it. Restarts: Ray restarts a crashed host with
its constructor's arguments; the host opens again every controller the directory
(``actors.controller_directory``) says it ran, each with a newer epoch, which
recovers as a restarted controller of its own did. Calls in flight fail with Ray's actor
errors, which the admin service retries (``AdminService._control``).

A host that runs no controller exits after ``RAYTOPICS_HOST_IDLE_EXIT_S``, as a segment
host does; a call that reaches it as it goes fails like a call to a restarting one, and
its caller's retry starts another.

Who calls: the admin service (every operation, through ``controller_actor``; ``close``
when a topic is deleted); segment lookups (``wake_segment``); topic stats.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import asdict
from typing import Any

import ray

from actors.control.controller import ScalableTopicControllerActor
from actors.controller_directory import (
    ControllerDirectory,
    ControllerEntry,
    ControllerHandle,
    ControllerOpening,
)
from actors.guard import guard
from actors.idle_exit import IdleExit
from actors.registry import get_or_start, lookup
from runtime.auth import Permission
from runtime.config import TOPIC_SETTINGS, actor_settings, apply_settings
from runtime.errors import TopicNotFoundError
from runtime.names import TopicName
from runtime.segment_hosts import controller_host_name
from storage.catalog import Catalog
from storage.durability import Durability, default_storage_root

log = logging.getLogger(__name__)

# The methods of a controller a caller may reach through ``call`` (``stop`` is the
# host's ``close``).
CONTROLLER_METHODS = frozenset(
    name
    for name, member in inspect.getmembers(ScalableTopicControllerActor, inspect.isfunction)
    if not name.startswith("_") and name != "stop"
)


@ray.remote(num_cpus=0, max_restarts=-1)
class ControllerHost:
    def __init__(self, name: str, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._name = name
        self._guard = guard()
        self._directory = ControllerDirectory()
        self._controllers: dict[str, ScalableTopicControllerActor] = {}
        self._catalog = Catalog()
        self._idle = IdleExit(lambda: bool(self._controllers))
        for topic, entry in self._directory.of_host(name).items():
            self._reopen(topic, entry)
        self._idle.look()

    async def call(
        self,
        topic: str,
        method: str,
        opening: ControllerOpening | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """``method`` of ``topic``'s controller (which checks the caller's credential).
        A call through the handle the admin service made carries the ``opening``, and
        opens the controller here if it does not run yet (the caller needs ``admin``)."""
        self._idle.called()
        if method not in CONTROLLER_METHODS:
            raise AttributeError(f"a controller has no method {method!r}")
        controller = self._controllers.get(topic)
        if controller is None:
            controller = self._open_for(TopicName.parse(topic), opening, kwargs.get("credential"))
        result = getattr(controller, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def close(self, topic: str, *, credential: str | None = None) -> bool:
        """Stop running ``topic``'s controller (the topic was deleted); whether it ran here."""
        self._idle.called()
        name = TopicName.parse(topic)
        self._guard.check(credential, Permission.ADMIN, name.namespace_path)
        self._directory.remove(name, self._name)
        controller = self._controllers.pop(str(name), None)
        if controller is None:
            return False
        await controller.stop()
        self._idle.look()
        return True

    def _open_for(
        self, topic: TopicName, opening: ControllerOpening | None, credential: str | None
    ) -> ScalableTopicControllerActor:
        if opening is not None:
            self._guard.check(credential, Permission.ADMIN, topic.namespace_path)
            entry = ControllerEntry(self._name, opening.storage_root, opening.durability)
            self._directory.put(topic, entry)
            return self._open(topic, entry)
        entry = self._directory.get(topic)
        if entry is None or entry.host != self._name:
            raise TopicNotFoundError(f"no controller of {topic} runs: the topic does not exist")
        return self._open(topic, entry)

    def _open(self, topic: TopicName, entry: ControllerEntry) -> ScalableTopicControllerActor:
        """Run ``topic``'s controller here, as ``entry`` (in the directory already) says."""
        controller = ScalableTopicControllerActor(str(topic), entry.storage_root, entry.durability)
        self._controllers[str(topic)] = controller
        return controller

    def _reopen(self, topic: str, entry: ControllerEntry) -> None:
        """Open again a controller this host ran before it restarted, unless its topic is
        gone (deleted while this host was down, or never made: a create cut short is
        retried through an opening)."""
        name = TopicName.parse(topic)
        try:
            if not self._catalog.topic_exists(name):
                self._directory.remove(name, self._name)
                return
            self._open(name, entry)
        except Exception:  # its next call opens it again (and reports)
            log.exception("%s: opening the controller of %s again failed", self._name, topic)


def controller_actor(
    topic: TopicName,
    *,
    create: bool = False,
    storage_root: str | None = None,
    durability: Durability | None = None,
    settings: dict[str, str] | None = None,
) -> ControllerHandle:
    """Handle to a topic's controller; ``ValueError`` if none runs. With ``create``, a
    handle whose calls open it where it does not run, its host started if it is not
    running. ``settings``: the topic's own (``runtime.config.TOPIC_SETTINGS``, as its
    creator has them), which choose its host and replace the host's own there."""
    entry = ControllerDirectory().get(topic)
    if not create:
        if entry is None:
            raise ValueError(f"no controller of {topic} runs")
        return ControllerHandle(lookup(entry.host), str(topic))
    durability = durability or Durability.from_env()
    root = str(storage_root or default_storage_root())
    if settings is not None or entry is None:
        host = controller_host_name(topic, settings)
    else:
        host = entry.host
    if settings is not None:
        cluster = {k: v for k, v in actor_settings().items() if k not in TOPIC_SETTINGS}
        settings = cluster | settings
    handle = get_or_start(ControllerHost, host, host, topic=topic, settings=settings)
    return ControllerHandle(handle, str(topic), ControllerOpening(root, asdict(durability)))
