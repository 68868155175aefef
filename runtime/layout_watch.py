"""A client's view of a topic's layout: the newest one known, and waiters for the next.

Producers and consumers route by the layout and must learn each split and merge. How a
newer layout reaches them differs by where the client runs: a Ray driver parks calls
on the cluster's DAG watch server (``actors.control.dag_watch.DagWatch``), a process
outside Ray asks the REST gateway (``clients._remote.RemoteLayoutWatch``). What they
share is here, free of Ray: holding the layout, publishing only newer epochs, and
waking whoever waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from runtime.errors import TopicNotFoundError
from runtime.layout import SegmentLayout
from runtime.names import TopicName


class LayoutWatch:
    """Holds the newest layout and wakes waiters when a newer one arrives.

    Who calls: the client's event loop only. Subclasses say how a layout is read
    (``_fetch``) and how the watch waits for the next one (``_run``, a task started by
    ``start``); both publish through ``_publish`` and ``_deleted``."""

    def __init__(self, topic: TopicName, layout: SegmentLayout) -> None:
        self.topic = topic
        self.layout = layout
        self.deleted = False
        self.refused: Exception | None = None  # the last refusal of the caller's credential
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Begin following the layout; must be called on the event loop that will use it."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_newer(self, than_epoch: int, timeout_s: float | None = None) -> SegmentLayout:
        """Wait until a layout with a higher epoch than ``than_epoch`` is known."""
        async with asyncio.timeout(timeout_s):
            while self.layout.epoch <= than_epoch and not self.deleted:
                await self._changed.wait()
        if self.deleted:
            raise TopicNotFoundError(f"topic {self.topic} was deleted")
        return self.layout

    async def updates(self) -> AsyncIterator[SegmentLayout]:
        """Every layout newer than the one seen before, in order of arrival."""
        seen = self.layout.epoch
        while True:
            layout = await self.wait_newer(seen)
            seen = layout.epoch
            yield layout

    async def refresh(self) -> SegmentLayout:
        """Read the layout now, for a caller that knows it just changed."""
        try:
            self._publish(await self._fetch())
        except TopicNotFoundError:
            self._deleted()
        return self.layout

    async def _fetch(self) -> SegmentLayout:
        raise NotImplementedError

    async def _run(self) -> None:
        raise NotImplementedError

    def _publish(self, layout: SegmentLayout) -> None:
        if layout.epoch > self.layout.epoch:
            self.layout = layout
            self._wake()

    def _deleted(self) -> None:
        self.deleted = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
