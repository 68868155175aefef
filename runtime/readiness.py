"""Waiting for a topic's segments to run, for any client of the Admin API.

A created topic's segments start in the background (``actors.control.readiness``); one
status call waits at most ``MAX_WAIT_S`` on the server, so that no request
outlives a REST time-out, and a client that wants to wait longer asks again.
The loop is here, free of any transport, so the Ray and the HTTP admin clients
wait the same way.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.errors import InvalidArgumentError, TopicNotReadyError

MAX_WAIT_S = 20.0  # the longest one status call waits before it answers
DEFAULT_READY_TIMEOUT_S = 120.0
MAX_LISTED = 20  # segments named in one answer; the counts say how many in all

Readiness = dict[str, Any]


async def wait_until_ready(
    ask: Callable[[float], Awaitable[Readiness]], timeout_s: float
) -> Readiness:
    """Call ``ask(wait_s)`` (a status call that answers once ready or after ``wait_s``)
    until the topic is ready; ``TopicNotReadyError`` once ``timeout_s`` has passed."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
        raise InvalidArgumentError(f"timeout_s must be a number of seconds ≥ 0, got {timeout_s!r}")
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = max(deadline - time.monotonic(), 0.0)
        readiness = await ask(min(remaining, MAX_WAIT_S))
        if readiness["state"] == "ready" or time.monotonic() >= deadline:
            return require_ready(readiness, timeout_s)


def require_ready(readiness: Readiness, waited_s: float) -> Readiness:
    """``readiness`` if ready, else ``TopicNotReadyError`` saying what is not running."""
    if readiness["state"] == "ready":
        return readiness
    shown = ", ".join(map(str, readiness["notRunning"]))
    more = readiness["segments"] - readiness["running"] - len(readiness["notRunning"])
    raise TopicNotReadyError(
        f"{readiness['topic']}: {readiness['running']} of {readiness['segments']} segments "
        f"running after {waited_s:g}s; not yet: {shown}{f' and {more} more' if more else ''} "
        "(booting, waiting for a node with room, or restarting)",
        readiness,
    )
