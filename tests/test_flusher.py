"""The interval flusher: one flush ``interval_s`` after the first unflushed append, the
appends until then riding along, the next scheduled by an append during a flush, and
nothing at all while nothing is written."""

from __future__ import annotations

import asyncio
import threading
import time

from actors.segment.flusher import IntervalFlusher
from runtime.errors import UnavailableError

INTERVAL_S = 0.05


def test_a_burst_of_appends_is_flushed_once_within_the_interval() -> None:
    async def run() -> list[float]:
        flushes: list[float] = []
        flusher = IntervalFlusher(INTERVAL_S, lambda: flushes.append(time.monotonic()))
        started = time.monotonic()
        for _ in range(100):
            flusher.changed()
        await asyncio.sleep(INTERVAL_S * 4)
        return [at - started for at in flushes]

    flushes = asyncio.run(run())
    assert len(flushes) == 1 and INTERVAL_S <= flushes[0] < INTERVAL_S * 3


def test_an_idle_flusher_does_nothing_and_schedules_nothing() -> None:
    async def run() -> tuple[int, int, bool, int]:
        flushes: list[int] = []
        flusher = IntervalFlusher(INTERVAL_S, lambda: flushes.append(1))
        await asyncio.sleep(INTERVAL_S * 3)
        before = len(flushes)
        flusher.changed()
        await asyncio.sleep(INTERVAL_S * 3)
        others = len(asyncio.all_tasks()) - 1  # any task but this one: a timer left running
        return before, len(flushes), flusher.pending, others

    assert asyncio.run(run()) == (0, 1, False, 0)


def test_an_append_during_a_flush_schedules_the_next() -> None:
    async def run() -> int:
        in_flush, release = threading.Event(), threading.Event()
        flushes: list[int] = []

        def slow_flush() -> None:
            flushes.append(1)
            in_flush.set()
            release.wait(5)

        flusher = IntervalFlusher(INTERVAL_S, slow_flush)
        flusher.changed()
        await asyncio.to_thread(in_flush.wait, 5)
        flusher.changed()  # written after the running flush took its descriptors
        release.set()
        await asyncio.sleep(INTERVAL_S * 4)
        return len(flushes)

    assert asyncio.run(run()) == 2


def test_a_closed_log_ends_the_flush_quietly() -> None:
    def closed() -> None:
        raise UnavailableError("segment log 3 is closed")

    async def run() -> bool:
        flusher = IntervalFlusher(INTERVAL_S, closed)
        flusher.changed()
        await asyncio.sleep(INTERVAL_S * 3)
        return flusher.pending

    assert asyncio.run(run()) is False
