"""A topic's stats: counts from its layout, sizes and backlogs from every segment.

Backlog is a bulk read over the whole DAG, sealed segments included (their
unread records are still owed to each subscription), so every segment is asked
at once, and one that cannot answer in time makes the whole answer an
``UnavailableSegmentsError``: an under-reported backlog would read as a
healthy one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    RayActorError,
)

from actors.control.controller_host import controller_actor
from actors.control.readiness import topic_readiness
from actors.guard import guard
from actors.segment.handle import SegmentHandle
from actors.segment.lookup import segment_actor
from runtime.backlog import age_s, subscription_ages
from runtime.errors import SegmentNotFoundError, UnavailableSegmentsError
from runtime.layout import SegmentInfo, SegmentLayout
from runtime.names import SegmentName, TopicName
from runtime.remote import call
from storage.asleep import SleepingSegments
from storage.catalog import Catalog
from storage.metadata import metadata_durability
from storage.segment_stats import hibernated_stats
from storage.tier_records import TierRecords, tier_records

# How often a segment's record is looked for while its actor does not answer (one being
# ended may not answer at all).
ENDING_ACTOR_WAIT_S = 2.0
_UNANSWERED = (
    SegmentNotFoundError,  # no such actor (yet)
    TimeoutError,
    GetTimeoutError,
    ActorDiedError,
    ActorUnavailableError,
    ActorUnschedulableError,  # its host is pinned to a node that is gone
    RayActorError,
)


async def topic_stats(catalog: Catalog, name: TopicName, timeout_s: float) -> dict[str, Any]:
    """The stats document of ``name`` (``TopicNotFoundError`` if it does not exist)."""
    record = catalog.require_topic(name)
    segments = list(record.layout.all_segments.values())
    records = tier_records(name, record.incarnation)
    sleeping = SleepingSegments(catalog.store, name, record.incarnation)
    stats, autoscale = await asyncio.gather(
        asyncio.gather(
            *(
                _segment_stats(
                    s.name(name),
                    _kept(s.name(name), records, sleeping),
                    timeout_s,
                )
                for s in segments
            )
        ),
        _autoscale_status(name, timeout_s),
    )
    missing = [s.segment_id for s, st in zip(segments, stats, strict=True) if st is None]
    readiness = topic_readiness(catalog, name)
    if missing:
        raise UnavailableSegmentsError(
            f"{name}: segments {missing} did not answer within {timeout_s}s" + _starting(readiness),
            missing,
        )
    replicas = (autoscale or {}).pop("replicas", {})
    document = _aggregate(
        name, record.incarnation, record.layout, segments, stats, _subs(catalog, name)
    )
    for segment_id, view in replicas.items():  # a replicated segment's replicas, roles, lag
        if segment_id in document["segments"]:
            document["segments"][segment_id]["replication"] = view
    return {**document, "autoscale": autoscale, "readiness": readiness}


def _starting(readiness: dict[str, Any]) -> str:
    """Why segments may not answer: their actors are not running (yet)."""
    if readiness["state"] == "ready":
        return ""
    return (
        f"; {readiness['segments'] - readiness['running']} of {readiness['segments']} "
        "segments have no running actor yet (a new topic's segments start in the "
        "background: wait_until_ready)"
    )


def _kept(
    name: SegmentName, records: TierRecords, sleeping: SleepingSegments
) -> Callable[[], dict[str, Any] | None]:
    """The stats of ``name`` kept off its actor: a tiered segment's from its record, a
    sleeping one's as it went to sleep; ``None`` when it has neither."""

    def kept() -> dict[str, Any] | None:
        stored = records.get(name.segment_id)
        if stored is not None:
            return hibernated_stats(name, stored)
        return sleeping.get(name.segment_id)

    return kept


async def _segment_stats(
    name: SegmentName,
    kept: Callable[[], dict[str, Any] | None],
    timeout_s: float,
) -> dict[str, Any] | None:
    """One segment's stats, ``None`` when it cannot answer within ``timeout_s``. A segment
    with no actor answers from what is ``kept`` of it (a tiered or sleeping one: asking
    must not wake it, or it would run for its whole ``idleS``); so does one whose actor
    is ending meanwhile (a move to the tier that just committed, an idle actor stopped),
    since a call to an actor on its way out may hang until Ray gives up on it: while no
    answer comes, what is kept is looked for every few seconds."""

    async def from_record() -> dict[str, Any] | None:
        return await asyncio.to_thread(kept)

    async def running() -> SegmentHandle | dict[str, Any]:
        """Its actor, or what is kept of it; waits while it has neither (a new segment
        whose actor is not registered yet). The kept stats are read after each failed
        lookup, not once before: a move to the tier may commit and end the actor
        between the two."""
        delay = 0.01
        while True:
            try:
                return segment_actor(name)
            except ValueError:
                if (stored := await from_record()) is not None:
                    return stored
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def ask() -> dict[str, Any]:
        credential = guard().internal_token()
        handle = await running()
        if isinstance(handle, dict):
            return handle
        answer = asyncio.ensure_future(call(handle.stats.remote(credential=credential)))
        try:
            while True:
                done, _ = await asyncio.wait({answer}, timeout=ENDING_ACTOR_WAIT_S)
                if done and answer.exception() is None:
                    return answer.result()
                if (stored := await from_record()) is not None:
                    return stored
                if done:
                    return answer.result()  # raises the actor's error
        finally:
            answer.cancel()

    try:
        return await asyncio.wait_for(ask(), timeout=timeout_s)
    except _UNANSWERED:
        return None


async def _autoscale_status(name: TopicName, timeout_s: float) -> dict[str, Any] | None:
    """What the topic's autoscaler could not do (``None``: its controller did not answer,
    so nothing is known, which is not the same as nothing held back)."""
    try:
        handle = controller_actor(name)
        answer = handle.autoscale_status.remote(credential=guard().internal_token())
        return await asyncio.wait_for(call(answer), timeout=timeout_s)
    except _UNANSWERED:
        return None


def _subs(catalog: Catalog, name: TopicName) -> dict[str, dict[str, Any]]:
    """Each subscription's state, its registered stream consumers and the segments each
    holds (``assignments``; queue consumers hold none), and of those the ones it holds
    some key buckets of only (``buckets``: consumer -> segment -> bucket range)."""
    result = {}
    for sub in catalog.subscriptions(name):
        meta = catalog.subscription(name, sub)
        if meta is not None:
            registrations = catalog.registrations(name, sub)
            result[sub] = {
                "state": meta.state,
                "consumers": len(registrations),
                "assignments": {r.consumer_name: list(r.assigned_segments) for r in registrations},
                "buckets": {
                    r.consumer_name: {
                        str(segment): {"start": start, "end": end, "count": count}
                        for segment, (start, end, count) in sorted(r.assigned_buckets.items())
                    }
                    for r in registrations
                    if r.assigned_buckets
                },
            }
    return result


def _aggregate(
    name: TopicName,
    incarnation: str,
    layout: SegmentLayout,
    segments: list[SegmentInfo],
    stats: list[dict[str, Any]],
    subscriptions: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    per_segment, backlog = {}, dict.fromkeys(subscriptions, 0)
    now_ms = time.time_ns() // 1_000_000
    for info, st in zip(segments, stats, strict=True):
        per_segment[str(info.segment_id)] = {
            "state": info.state.value,
            "hashRange": {"start": info.hash_range.start, "end": info.hash_range.end},
            **{k: st[k] for k in ("records", "sizeBytes", "endOffset", "terminated")},
            "tiered": st.get("tiered", False),
            "hibernating": st.get("hibernating", False),
            **({"tierError": st["tierError"]} if "tierError" in st else {}),
            "subscriptions": {
                sub: {**cursor, "backlogAgeS": age_s(cursor.get("oldestUnackedMs"), now_ms)}
                for sub, cursor in st["subscriptions"].items()
            },
        }
        for sub, cursor in st["subscriptions"].items():
            backlog[sub] = backlog.get(sub, 0) + cursor["backlog"]
    ages = subscription_ages(dict(enumerate(stats)), now_ms)
    return {
        "topic": str(name),
        "incarnation": incarnation,
        "metadata": metadata_durability(),
        "epoch": layout.epoch,
        "activeSegments": len(layout.active_segments),
        "sealedSegments": len(layout.all_segments) - len(layout.active_segments),
        "records": sum(s["records"] for s in stats),
        "sizeBytes": sum(s["sizeBytes"] for s in stats),
        "tieredBytes": sum(s["sizeBytes"] for s in stats if s.get("tiered")),
        "hibernatingSegments": sum(1 for s in stats if s.get("hibernating")),
        "segments": per_segment,
        "subscriptions": {
            sub: {
                **subscriptions.get(sub, {"state": "UNKNOWN", "consumers": 0}),
                "backlog": total,
                "backlogAgeS": ages.get(sub, 0.0),
            }
            for sub, total in backlog.items()
        },
    }
