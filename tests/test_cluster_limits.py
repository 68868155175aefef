"""A producer's copy of its namespace's limits (``clients._limits.ClusterLimits``): asked
of the cluster, answered without waiting, refreshed once stale, kept when a refresh fails."""

from __future__ import annotations

import asyncio
import threading

import pytest

from clients._limits import ClusterLimits
from runtime.errors import UnavailableError
from runtime.limits import Limits


class Cluster:
    """What the admin service answers, and how often it was asked."""

    def __init__(self) -> None:
        self.limits, self.asked, self.down = Limits(), 0, False

    async def ask(self, namespace: str, credential: str | None) -> Limits:
        self.asked += 1
        if self.down:
            raise UnavailableError("the admin service did not answer")
        return self.limits


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def test_a_change_is_seen_once_the_copy_is_stale_and_never_waits_for(cluster) -> None:
    async def run() -> None:
        now = [0.0]
        opened = await ClusterLimits.open("t/ns", "token", ask=cluster.ask)
        limits = ClusterLimits(
            "t/ns", "token", opened.current, asyncio.get_running_loop(), clock=lambda: now[0],
            ask=cluster.ask,
        )  # fmt: skip
        cluster.limits = Limits(max_message_bytes=1024, max_batch_bytes=4096)
        assert limits.current.max_message_bytes == Limits().max_message_bytes  # fresh copy
        now[0] = 2.5
        from_a_thread = []
        thread = threading.Thread(target=lambda: from_a_thread.append(limits.current))
        thread.start()
        thread.join()
        assert from_a_thread[0] == Limits()  # a stale copy is answered at once...
        for _ in range(10):
            await asyncio.sleep(0)
        assert limits.current.max_message_bytes == 1024  # ...and refreshed meanwhile
        assert cluster.asked == 2

    asyncio.run(run())


def test_a_failed_refresh_keeps_the_last_limits_and_tries_again_later(cluster) -> None:
    async def run() -> None:
        now = [0.0]
        limits = ClusterLimits(
            "t/ns", None, Limits(max_message_bytes=7), asyncio.get_running_loop(),
            clock=lambda: now[0], ask=cluster.ask,
        )  # fmt: skip
        cluster.down = True
        now[0] = 3.0
        assert limits.current.max_message_bytes == 7
        for _ in range(10):
            await asyncio.sleep(0)
        assert limits.current.max_message_bytes == 7 and cluster.asked == 1
        cluster.down, now[0] = False, 6.0
        assert limits.current.max_message_bytes == 7  # starts the next refresh
        for _ in range(10):
            await asyncio.sleep(0)
        assert limits.current == Limits() and cluster.asked == 2

    asyncio.run(run())
