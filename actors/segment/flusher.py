"""When a segment under ``interval`` durability flushes: ``interval_s`` after the first
append not flushed yet, and never while nothing is written. The same schedule saves the
cumulative acks that rode on reads (``CursorStore.save_unsaved``).

A flush timer that ran whether or not anything was written would cost every idle
segment a wake-up per interval, and idle segments are most of a long-lived topic's.
So the first unflushed append schedules one flush; appends until it runs ride along
with it, and one arriving while it runs schedules the next. An append is then on
disk at most ``interval_s`` (plus the flush's own time) after it was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from runtime.errors import UnavailableError


class IntervalFlusher:
    """Who calls: the segment actor, after every stored group of appends or ack taken
    without saving (``changed``), on its event loop. ``flush`` runs in a thread, off the
    loop: a flush can take long on a busy disk."""

    def __init__(self, interval_s: float, flush: Callable[[], None]) -> None:
        self._interval_s = interval_s
        self._flush = flush
        self._due = False
        self._tasks: set[asyncio.Task] = set()  # held until done: the loop keeps weak refs

    def changed(self) -> None:
        if self._due:
            return
        self._due = True
        task = asyncio.get_running_loop().create_task(self._flush_soon())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def pending(self) -> bool:
        """Whether a flush is scheduled or running."""
        return bool(self._tasks)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._interval_s)
        self._due = False  # a change from here on schedules the next flush
        with contextlib.suppress(UnavailableError):  # the log was closed: nothing to flush
            await asyncio.to_thread(self._flush)
