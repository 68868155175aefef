"""A tiered segment's state in the metadata store: where its records went, its place in
the DAG, its fence and its subscriptions' cursors.

Once a sealed segment's records are in the tier, nothing of it is left on a node's
disk: a segment whose node is lost, or whose actor has hibernated, is opened again
on any node from this record and the tier alone. The record lives under the topic
(deleting a topic removes it with the rest of its metadata) and is named by the
topic incarnation, so a re-created topic never finds another incarnation's segments.

Writing the record is the commit point of a move to the tier: before it, the local
storage is the segment; after it, this record is, and whatever a crash left on disk
is removed when the segment is opened next.

Two writers may touch a record: the segment's actor (cursors, fence) and the
controller (subscriptions of a hibernated segment, so that creating a subscription
does not wake every tiered segment). Each change is a named read-modify-CAS of one
entry, so neither overwrites the other's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import KeyNotFoundError, ScalableTopicsError, StaleEpochError
from runtime.layout import SegmentInfo
from runtime.names import TopicName
from runtime.uris import redacted
from storage.catalog import Catalog
from storage.cursors import Cursor
from storage.metadata import MetadataStore
from storage.metadata_paths import tiered_segments_path
from storage.segment_entries import SegmentEntries
from storage.tier import TieredSegment, delete_tiered, open_tier

logger = logging.getLogger(__name__)


class TieredRecord(BaseModel):
    """Everything a tiered segment is, off any node."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    uri: str  # the tier, as the policy named it (credentials included: never shown)
    directory: str  # the segment's directory in that tier
    tier_format: int = Field(default=1, alias="format")  # ``storage.tier.TIER_FORMAT`` written
    info: SegmentInfo
    fence_epoch: int = Field(default=0, alias="fenceEpoch")
    # subscription → ``Cursor.to_dict()``
    cursors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    start_offset: int = Field(alias="startOffset")
    end_offset: int = Field(alias="endOffset")
    size_bytes: int = Field(alias="sizeBytes")
    last_publish_time_ms: int | None = Field(default=None, alias="lastPublishTimeMs")
    sealed_at_ms: int | None = Field(default=None, alias="sealedAtMs")
    tiered_at_ms: int = Field(alias="tieredAtMs")

    @classmethod
    def of_move(
        cls,
        uri: str,
        tiered: TieredSegment,
        info: SegmentInfo,
        fence_epoch: int,
        cursors: Iterable[Cursor],
        tiered_at_ms: int,
    ) -> TieredRecord:
        """The record of a segment moved to ``tiered`` (its committed copy at ``uri``), with
        its place in the DAG, fence and cursors as they were at the move."""
        return cls(
            uri=uri,
            directory=tiered.directory,
            tier_format=tiered.manifest.format,
            info=info,
            fence_epoch=fence_epoch,
            cursors={c.name: c.to_dict() for c in cursors},
            start_offset=tiered.start_offset,
            end_offset=tiered.end_offset,
            size_bytes=tiered.size_bytes,
            last_publish_time_ms=tiered.last_publish_time_ms,
            sealed_at_ms=tiered.terminated_at_ms,
            tiered_at_ms=tiered_at_ms,
        )

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> TieredRecord:
        return cls.model_validate_json(raw)


class TierRecords(SegmentEntries):
    """The tiered segments' records of one topic incarnation."""

    def __init__(self, store: MetadataStore, topic: TopicName, incarnation: str) -> None:
        super().__init__(store, tiered_segments_path(topic, incarnation))
        self.topic, self.incarnation = topic, incarnation

    def get(self, segment_id: int) -> TieredRecord | None:
        raw = self._raw(segment_id)
        return TieredRecord.from_bytes(raw) if raw is not None else None

    def commit(self, segment_id: int, record: TieredRecord) -> None:
        """The move's commit point: the record is written whole (replacing one a crashed
        earlier move wrote, which no reader has used since no segment opened it)."""
        self._write(segment_id, record.to_bytes())

    def save_cursor(self, segment_id: int, cursor: dict[str, Any], *, create: bool) -> bool:
        """Store one subscription's cursor; without ``create``, only over one that is there
        (a subscription deleted meanwhile stays deleted). Returns whether it was stored."""
        name = cursor["name"]
        stored = [False]

        def change(record: TieredRecord) -> TieredRecord:
            stored[0] = create or name in record.cursors
            if not stored[0]:
                return record
            return record.model_copy(update={"cursors": {**record.cursors, name: cursor}})

        self._update(segment_id, change)
        return stored[0]

    def add_cursor(self, segment_id: int, name: str, position: str, epoch: int) -> bool:
        """A new subscription's cursor at the segment's start (``earliest``) or end, unless
        it has one; refused (``StaleEpochError``) for a controller older than the fence.
        Returns False when the segment has no record (it is not tiered)."""

        def change(record: TieredRecord) -> TieredRecord:
            record = _fenced(record, epoch)
            if name in record.cursors:
                return record
            mark = record.start_offset if position == "earliest" else record.end_offset
            cursors = {**record.cursors, name: Cursor(name, mark).to_dict()}
            return record.model_copy(update={"cursors": cursors})

        return self._update(segment_id, change)

    def delete_cursor(self, segment_id: int, name: str, epoch: int | None = None) -> bool:
        """Returns False when the segment has no record (it is not tiered)."""

        def change(record: TieredRecord) -> TieredRecord:
            record = _fenced(record, epoch)
            cursors = {k: v for k, v in record.cursors.items() if k != name}
            return record.model_copy(update={"cursors": cursors})

        return self._update(segment_id, change)

    def save_fence(self, segment_id: int, epoch: int) -> None:
        def change(record: TieredRecord) -> TieredRecord:
            fence = max(record.fence_epoch, epoch)
            return record.model_copy(update={"fence_epoch": fence})

        self._update(segment_id, change)

    def _update(self, segment_id: int, change: Callable[[TieredRecord], TieredRecord]) -> bool:
        """Whether there was a record to change (a deleted one has nothing left to keep)."""

        def mutate(raw: bytes) -> bytes:
            return change(TieredRecord.from_bytes(raw)).to_bytes()

        try:
            self.store.update(self._path(segment_id), mutate)
        except KeyNotFoundError:
            return False
        return True


class RecordedCursors:
    """A tiered segment's cursors, kept in its record (a ``storage.cursors.CursorBackend``)."""

    def __init__(self, records: TierRecords, segment_id: int) -> None:
        self._records, self._segment_id = records, segment_id

    def load(self) -> Iterator[Cursor]:
        record = self._records.get(self._segment_id)
        for data in record.cursors.values() if record is not None else ():
            yield Cursor.from_dict(data)

    def save(self, cursor: Cursor, *, create: bool) -> bool:
        return self._records.save_cursor(self._segment_id, cursor.to_dict(), create=create)

    def remove(self, name: str) -> None:
        self._records.delete_cursor(self._segment_id, name)


def _fenced(record: TieredRecord, epoch: int | None) -> TieredRecord:
    """The record fenced at ``epoch``; a controller older than its fence is refused."""
    if epoch is None or epoch == record.fence_epoch:
        return record
    if epoch < record.fence_epoch:
        raise StaleEpochError(
            f"tiered segment {record.info.segment_id}: request from controller epoch {epoch} "
            f"refused, epoch {record.fence_epoch} has taken over"
        )
    return record.model_copy(update={"fence_epoch": epoch})


def delete_tiered_segment(records: TierRecords, segment_id: int) -> None:
    """Remove a tiered segment: its copy in the tier, then its record (a crash between
    leaves the record, so deleting again finishes). A store that is down does not stop
    the deletion: the objects are left, and said in the log."""
    record = records.get(segment_id)
    if record is None:
        return
    try:
        filesystem, _ = open_tier(record.uri)
        delete_tiered(filesystem, record.directory)
    except (OSError, ScalableTopicsError) as err:
        logger.warning("the tiered copy of segment %d at %s was not deleted, left: %s",
                       segment_id, redacted(record.uri), err)  # fmt: skip
    records.delete(segment_id)


def tier_records(topic: TopicName, incarnation: str) -> TierRecords:
    """The records of ``topic``'s incarnation in this cluster's metadata store."""
    return TierRecords(Catalog().store, topic, incarnation)
