"""When a host process ends itself: once it holds nothing (no segment, controller or
coordinator) and nobody called it for ``RAYTOPICS_HOST_IDLE_EXIT_S``.

A Ray actor is a process that costs its start-up, its memory and a steady share of a core
while it idles, so a namespace whose topics were deleted, or whose segments all hibernate,
should cost none; the next call that needs a host starts one. The segment, controller and
coordinator hosts each hold one ``IdleExit``: they say when they are called
(``called``) and when they may have let go of their last charge (``look``).

Who calls: the hosts' methods (``actors.segment.host``, ``actors.control.controller_host``,
``actors.control.coordinator_host``), on their event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import ray

from runtime.segment_hosts import idle_exit_s


def end_this_actor() -> None:
    """Killed, not ended by ``exit_actor`` (which waits for the calls in flight, and a
    retried call of its own keeps it waiting): a host holding nothing has nothing to flush."""
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


class IdleExit:
    def __init__(
        self,
        holds: Callable[[], bool],
        end: Callable[[], None] = end_this_actor,
        after_s: float | None = None,
    ) -> None:
        """``holds``: whether the host holds anything now. ``end``: what ends it, called on
        its event loop once it held nothing and had no call for ``after_s`` (by default
        ``RAYTOPICS_HOST_IDLE_EXIT_S``); an ``end`` that finds a reason to stay calls
        ``look`` again."""
        self._holds = holds
        self._end = end
        self._after_s = idle_exit_s() if after_s is None else after_s
        self._last_call = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def called(self) -> None:
        """A call came: the quiet time starts again."""
        self._last_call = time.monotonic()

    def look(self) -> None:
        """While the host holds nothing, look again when the quiet time would be up (one
        timer at most; a host that holds something has none)."""
        if self._holds() or self._timer is not None:
            return
        due = max(self._last_call + self._after_s - time.monotonic(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(due, self._fired)

    def _fired(self) -> None:
        self._timer = None
        if self._holds():  # letting go of its last charge looks again
            return
        if time.monotonic() - self._last_call < self._after_s:
            self.look()
            return
        self._end()
