"""Moving a whole subscription in time: to its first message, past its last, or to the
first message published at or after a moment, in every segment of the DAG at once.

A reset rewrites every segment's cursor of the subscription (``SegmentStore.seek``:
a binary search of the segment's publish-time index, or of a tiered file's row-group
times) and then the subscription's coordinator's record of finished segments, so
that parents still come before children: a segment that ends before the moment (its
cursor at its end, sealed) is finished, one with anything left is not, and a child is
handed out only once its parents are finished, as for a new subscription.

Refused while stream consumers are registered (409): a connected consumer holds
segments and positions that the reset would pull from under it. Close them, reset,
and start them again. Queue consumers hold no positions: their next receive starts
from the new cursor, and what they were handed and had not acknowledged is handed
out again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.control.topic_parts import TopicParts
from runtime.errors import ConflictError, SubscriptionNotFoundError
from runtime.subscription import ResetTarget
from storage.records import SubscriptionKind, SubscriptionState


async def reset_subscription(ctl: TopicParts, subscription: str, to: ResetTarget) -> dict[str, Any]:
    """Move ``subscription`` of ``ctl``'s topic to ``to`` on every segment. Who calls:
    the controller, holding its lock. What it affects: every segment's cursor of the
    subscription (hibernating segments are woken for it) and its coordinator's record."""
    meta = ctl.catalog.subscription(ctl.topic, subscription)
    if meta is None or meta.state == SubscriptionState.DELETING:
        raise SubscriptionNotFoundError(f"{ctl.topic} has no subscription {subscription!r}")
    if meta.kind != SubscriptionKind.SUBSCRIPTION:
        raise ConflictError(
            f"{subscription!r} is a checkpoint group: its positions are its consumers' "
            "checkpoints (Checkpoint.at_timestamp), not cursors a reset can move"
        )
    consumers = ctl.catalog.consumers(ctl.topic, subscription)
    if consumers:
        raise ConflictError(
            f"{subscription!r} of {ctl.topic} has {len(consumers)} registered consumer(s) "
            f"({', '.join(sorted(consumers)[:5])}): close them before resetting it, then "
            "start them again at the new position"
        )
    layout = ctl.read_record().layout
    names = {i: info.name(ctl.topic) for i, info in layout.all_segments.items()}
    epoch = ctl.leader_epoch()
    moved = await asyncio.gather(
        *(ctl.fleet.seek(name, subscription, to, epoch) for name in names.values())
    )
    positions = dict(zip(names, moved, strict=True))
    finished = sorted(i for i, answer in positions.items() if answer["finished"])
    await ctl.coordinators.reset(subscription, finished)
    now_ms = time.time_ns() // 1_000_000
    return {
        "topic": str(ctl.topic),
        "subscription": subscription,
        "to": to,
        "positions": {str(i): answer["position"] for i, answer in sorted(positions.items())},
        "finishedSegments": finished,
        # a moment still to come: every cursor is at its segment's end, as for "latest"
        "inTheFuture": isinstance(to, int) and to > now_ms,
    }
