"""``SegmentHandle``: a segment's calls, made on the host that serves it.

Reads like an actor handle of one segment (``handle.read.remote(offset, ...)`` gives
an ``ObjectRef``), so callers need not know that segments share processes
(``actors.segment.directory``). Every call is one Ray actor call to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray


@dataclass(frozen=True)
class Opening:
    """How a host opens a segment, from whoever started it (its controller): the storage
    of topic incarnation ``incarnation`` under ``storage_root``, laid out if missing only
    when ``create``. ``at`` (ns since the epoch) orders it against closes, which Ray may
    deliver out of order; ``credential`` must have ``admin``. ``replica``: a follower of
    a replicated segment, entered as one (``actors.segment.directory``)."""

    storage_root: str
    durability: dict[str, Any]
    create: bool
    incarnation: str
    at: int
    credential: str | None
    replica: bool = False


@dataclass(frozen=True)
class SegmentMethod:
    host: ray.actor.ActorHandle
    segment: str
    method: str
    opening: Opening | None

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return self.host.call.remote(self.segment, self.method, self.opening, *args, **kwargs)


@dataclass(frozen=True)
class SegmentHandle:
    """The segment ``segment`` (its name, ``segment://...``) on the host actor ``host``;
    ``opening``: on the handle its opener got, so its calls find the segment open."""

    host: ray.actor.ActorHandle
    segment: str
    opening: Opening | None = field(default=None, compare=False)

    def __getattr__(self, method: str) -> SegmentMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return SegmentMethod(self.host, self.segment, method, self.opening)
