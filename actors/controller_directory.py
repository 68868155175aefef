"""Which host runs a topic's controller, how callers reach it there, and how the host
opens it again after a restart.

Controllers share processes (``actors.control.controller_host``). When Ray restarts a
host (its node was lost, its process crashed) it builds the actor again from its
constructor's arguments alone, which name no topic; the host then opens again every
controller this directory says it ran, so each finishes its predecessor's work and
keeps scaling and retaining without being called, as a controller in a process of its
own did. A host enters a topic when it opens its controller and removes it when the
topic is deleted. Entries live in Ray's GCS key-value store beside the actors' names,
as short-lived as they, never in the metadata store (which may be Redis, and outlive
Ray: after a restart of all of Ray the admin service opens controllers as it calls them).

Who calls: the hosts (enter, remove, list theirs); ``controller_actor`` (which host
serves a topic) and segment lookups (a hibernating segment's wake), which then call it
through a ``ControllerHandle``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import ray

from runtime.config import ray_namespace
from runtime.names import TopicName
from storage.metadata import GcsKeyValue, KeyValue


@dataclass(frozen=True)
class ControllerEntry:
    """A topic's controller host and how it opens the controller (its storage root and
    durability, as its creator's admin service gave them)."""

    host: str
    storage_root: str
    durability: dict[str, Any]

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ControllerEntry:
        return cls(**json.loads(raw))


class ControllerDirectory:
    """The controller entries of one Ray namespace's topics, in a ``KeyValue``."""

    def __init__(self, kv: KeyValue | None = None) -> None:
        self._kv = kv if kv is not None else GcsKeyValue(f"raytopics-controllers/{ray_namespace()}")

    def get(self, topic: TopicName) -> ControllerEntry | None:
        raw = self._kv.get(_key(topic))
        return ControllerEntry.from_bytes(raw) if raw is not None else None

    def put(self, topic: TopicName, entry: ControllerEntry) -> None:
        self._kv.put(_key(topic), entry.to_bytes(), True)

    def remove(self, topic: TopicName, host: str) -> None:
        """Remove ``topic``'s entry if ``host`` still owns it."""
        entry = self.get(topic)
        if entry is not None and entry.host == host:
            self._kv.delete(_key(topic))

    def of_host(self, host: str) -> dict[str, ControllerEntry]:
        """The entries naming ``host``, by topic (``topic://...``)."""
        found = self._kv.get_many(self._kv.keys(b"topic://"))
        entries = {key.decode(): ControllerEntry.from_bytes(raw) for key, raw in found.items()}
        return {topic: entry for topic, entry in entries.items() if entry.host == host}


def _key(topic: TopicName) -> bytes:
    return str(topic).encode()


@dataclass(frozen=True)
class ControllerOpening:
    """How a host opens a topic's controller, from the admin service that calls it: the
    storage root and durability its segments use."""

    storage_root: str
    durability: dict[str, Any]


@dataclass(frozen=True)
class ControllerMethod:
    host: ray.actor.ActorHandle
    topic: str
    method: str
    opening: ControllerOpening | None

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return self.host.call.remote(self.topic, self.method, self.opening, *args, **kwargs)


@dataclass(frozen=True)
class ControllerHandle:
    """``topic``'s controller on its host actor ``host``; ``opening``: on the admin
    service's handles, so their calls open the controller where it does not run."""

    host: ray.actor.ActorHandle
    topic: str
    opening: ControllerOpening | None = None

    def __getattr__(self, method: str) -> ControllerMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return ControllerMethod(self.host, self.topic, method, self.opening)

    def close(self, credential: str | None) -> ray.ObjectRef:
        """Stop the controller (its topic was deleted)."""
        return self.host.close.remote(self.topic, credential=credential)
