"""The clients' private event loop shuts down cleanly when the program ends."""

from __future__ import annotations

import asyncio

from clients._loop import _LoopThread


def test_stop_cancels_pending_work_and_ends_the_thread() -> None:
    loop = _LoopThread()
    started = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), loop.loop)
    loop.stop(grace_s=2.0)
    assert started.cancelled()
    assert not loop._thread.is_alive()
    loop.stop()  # idempotent: a second exit hook finds nothing to do
