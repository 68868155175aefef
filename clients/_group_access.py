"""How a stream or checkpoint consumer reaches its subscription's coordinator and its
segments, whatever kind of process it runs in.

A Ray driver calls their actors (``clients._ray.group_access``); a process outside
Ray asks the REST gateway, which calls them as it (``clients._remote``). The
consumer's logic (``clients._group_core``) is the same over both, as a producer's
is over ``SegmentAccess``: every call carries the consumer's credential, which the
coordinator and the segment check themselves. The records are read over the
segments' data plane in both cases; what a read connects through is the handle
``find`` answers (an actor handle, or a ``clients._remote.RemoteSegment``).

Nothing here imports Ray.
"""

from __future__ import annotations

from typing import Any, Protocol

from runtime.names import SegmentName


class GroupAccess(Protocol):
    """One consumer group's coordinator and segments, reached with one credential."""

    # What a call meets while the coordinator or a segment restarts (or the way to
    # them is down for a moment): the consumer waits and asks again.
    restarting: tuple[type[BaseException], ...]

    # --- the coordinator: membership and assignment ---------------------------------

    async def register(self, consumer: str) -> dict[str, Any]:
        """Join; the assignment (``{"version", "segments"}``)."""
        ...

    async def poll(
        self, consumer: str, known_version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The assignment once its version is not ``known_version``, else ``None`` after
        ``timeout_s``; the consumer's heartbeat either way."""
        ...

    async def release(self, consumer: str, segment_id: int, position: int | None) -> None: ...

    async def finished(self, consumer: str, segment_id: int, position: int | None) -> None:
        """Raises ``ConflictError`` while the segment is not sealed or not read out."""
        ...

    async def unregister(self, consumer: str) -> None: ...

    # --- the coordinator: a checkpoint group's shared progress ---------------------------

    async def ensure_group(self, session_grace_s: float) -> None:
        """Make the checkpoint group on its first use; ``ConflictError`` when the name is a
        subscription's."""
        ...

    async def reset(self, finished: list[int], positions: dict[int, int]) -> None:
        """The group's finished segments and released positions become these (a
        consumer starting from a checkpoint)."""
        ...

    async def snapshot(self) -> dict[str, Any]:
        """The group's progress (``finished``: the segments read to their end)."""
        ...

    # --- the segments ------------------------------------------------------------------

    async def find(self, name: SegmentName) -> Any:
        """The handle a ``ReadChannel`` reads ``name`` through, waiting for a segment
        that is starting; ``SegmentNotFoundError`` once it does not come."""
        ...

    async def find_again(self, name: SegmentName) -> Any | None:
        """A new handle after a failed call (the segment was started again elsewhere),
        ``None`` while it is not back; a refusal of the credential is raised."""
        ...

    async def position(self, segment: Any, name: SegmentName) -> int:
        """The subscription's first unacknowledged offset in the segment."""
        ...

    async def ack_cumulative(self, segment: Any, name: SegmentName, offset: int) -> None: ...

    async def close(self) -> None:
        """Let go of what reaching them holds (a connection pool), once the consumer left."""
        ...
