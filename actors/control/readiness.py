"""Whether a topic's segments are serving: the answer to "is my new topic ready yet?".

Creating a topic writes its metadata and lays out its segments' storage, then
asks Ray for their actors without waiting for them: booting a segment's process
takes a second or more of CPU, so waiting for hundreds would make one admin call
take minutes. Clients that arrive early wait for the segment they need
(``actors.segment.lookup.find_segment_actor``); an operator or a pipeline that wants
the whole topic up asks here, and may wait.

A topic is ``ready`` when every segment of its layout is open in a host that is
live and constructed in Ray's actor table; otherwise it is ``starting``, naming the
segments that are not (their host still booting, waiting for a node with room, or
restarting after a crash). The answer comes from two reads (Ray's actor table and
the segment directory), not a call per segment, so asking often costs the segments
nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.segment.lookup import served_segments
from runtime.names import TopicName
from runtime.readiness import MAX_LISTED
from storage.asleep import SleepingSegments
from storage.catalog import Catalog
from storage.tier_records import TierRecords

POLL_S = 0.2


def topic_readiness(catalog: Catalog, name: TopicName) -> dict[str, Any]:
    """``{"state": "ready"|"starting", "segments", "running", "notRunning": [ids]}``
    (``TopicNotFoundError`` if the topic does not exist)."""
    record = catalog.require_topic(name)
    layout = record.layout
    alive = served_segments(name)
    # A tiered or sleeping segment's actor runs only while readers use it, and starts on
    # demand.
    on_demand = set(TierRecords(catalog.store, name, record.incarnation).segment_ids())
    on_demand |= set(SleepingSegments(catalog.store, name, record.incarnation).segment_ids())
    waiting = [
        info.segment_id
        for info in layout.all_segments.values()
        if info.name(name).actor_name not in alive and info.segment_id not in on_demand
    ]
    return {
        "topic": str(name),
        "state": "starting" if waiting else "ready",
        "segments": len(layout.all_segments),
        "running": len(layout.all_segments) - len(waiting),
        "notRunning": waiting[:MAX_LISTED],
    }


async def await_readiness(catalog: Catalog, name: TopicName, wait_s: float) -> dict[str, Any]:
    """The readiness as soon as the topic is ready, or as it stands after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        readiness = topic_readiness(catalog, name)
        if readiness["state"] == "ready" or time.monotonic() >= deadline:
            return readiness
        await asyncio.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
