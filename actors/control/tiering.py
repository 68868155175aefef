"""The controller's mover of sealed segments to the topic's tier.

Each maintenance round hands it the layout and every segment's stats; it asks the
segments that are due (``runtime.tiering``) to move themselves (``offload`` on the
segment actor, which copies, checks, commits and then drops its local storage), one
call per segment in the background, since a move takes as long as its upload; a
moved segment's actor then exits (it hibernates until a reader needs it). A
failed move is retried after a growing delay, counted in metrics and shown in the
segment's stats (``tierError``); the local copy serves all along.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.metrics import ControllerMetrics
from runtime.errors import ScalableTopicsError
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.policy import TieringPolicy, TopicPolicy
from runtime.tiering import TIER_URIS_ENV, due_for_tier, resolve, retry_delay_s
from storage.tier import check_tier

log = logging.getLogger(__name__)


async def check_policy_tier(policy: TopicPolicy) -> None:
    """Refuse a policy whose tier this cluster does not allow (``RAYTOPICS_TIER_URIS``) or
    cannot use (unreachable, not writable, credentials refused): when it is set, with
    the reason, rather than in every move later."""
    if policy.tiering is not None:
        await asyncio.to_thread(check_tier, tier_uri(policy.tiering.uri))


def tier_uri(uri: str) -> str:
    """Where this cluster writes a policy's tier ``uri``: inside the operator's allowed
    prefixes, with their options (``runtime.tiering.resolve``)."""
    return resolve(uri, os.environ.get(TIER_URIS_ENV))


class TierMover:
    def __init__(
        self,
        topic: TopicName,
        metrics: ControllerMetrics,
        offload: Callable[[Any, str], Awaitable[None]],
    ) -> None:
        self._topic, self._metrics = topic, metrics
        self._offload = offload  # a segment's handle, the tier: the move (``SegmentFleet``)
        self._moving: dict[int, asyncio.Task] = {}
        self._failures: dict[int, tuple[int, float]] = {}  # id → (failures, retry at)

    def round(
        self,
        layout: SegmentLayout,
        stats: Mapping[int, Mapping[str, Any]],
        policy: TieringPolicy,
        handle_of: Callable[[int], Any],
        moved: Callable[[int], None],
    ) -> None:
        """Start the moves that are due and not running or waiting for a retry; ``moved``
        is told of each segment whose move committed."""
        now = time.monotonic()
        for segment_id in due_for_tier(layout, stats, policy.after_s, time.time_ns() // 10**6):
            if segment_id in self._moving or self._failures.get(segment_id, (0, 0.0))[1] > now:
                continue
            handle = handle_of(segment_id)
            if handle is not None:
                move = asyncio.get_running_loop().create_task(
                    self._move(segment_id, handle, policy.uri, moved)
                )
                self._moving[segment_id] = move

    def cancel(self) -> None:
        """Stop the moves under way (their topic's controller stops): a move cut short
        commits nothing, and the segment stays where it was."""
        for move in self._moving.values():
            move.cancel()

    async def _move(
        self,
        segment_id: int,
        handle: Any,
        uri: str,
        moved: Callable[[int], None],
    ) -> None:
        try:
            await self._offload(handle, tier_uri(uri))
            self._failures.pop(segment_id, None)
            moved(segment_id)
        except Exception as err:  # the store may be down: retry later, keep serving locally
            failures = self._failures.get(segment_id, (0, 0.0))[0] + 1
            delay = retry_delay_s(failures)
            self._failures[segment_id] = (failures, time.monotonic() + delay)
            code = err.code if isinstance(err, ScalableTopicsError) else "unavailable"
            self._metrics.tier_failed(code)
            log.warning("%s: moving segment %d to the tier failed (%d in a row, next in %.0fs): %s",
                        self._topic, segment_id, failures, delay, err)  # fmt: skip
        finally:
            self._moving.pop(segment_id, None)
