"""What a hibernating segment on local disk looks like while its actor is not running.

A sealed segment that every subscription has drained may have its actor end
(``runtime.hibernation``); its files stay where they are and its actor starts again on
demand. Observing it must not wake it: stats, metrics, retention and readiness read
the stats it had when it went to sleep, kept here in the metadata store. They cannot
go stale while it sleeps, since a sealed segment's records and cursors change only
through its actor, and the actor drops them the moment it starts again.

Tiered segments need none of this: their record (``storage.tier_records``) is their state.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.names import TopicName
from storage.metadata import MetadataStore
from storage.metadata_paths import asleep_path
from storage.segment_entries import SegmentEntries


class SleepingSegments(SegmentEntries):
    """The sleeping segments of one topic incarnation: segment id → its last stats."""

    def __init__(self, store: MetadataStore, topic: TopicName, incarnation: str) -> None:
        super().__init__(store, asleep_path(topic, incarnation))

    def put_to_sleep(self, segment_id: int, stats: dict[str, Any]) -> None:
        """Keep ``stats`` (the segment's, as its actor last gave them) as it goes to sleep."""
        self._write(segment_id, json.dumps({**stats, "hibernating": True}).encode())

    def get(self, segment_id: int) -> dict[str, Any] | None:
        raw = self._raw(segment_id)
        return json.loads(raw) if raw is not None else None

    def woken(self, segment_id: int) -> None:
        """The segment's actor runs again: what was kept no longer holds."""
        self.delete(segment_id)
