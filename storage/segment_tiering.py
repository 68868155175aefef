"""A segment's move to the tier, and its opening from there (``SegmentStore``'s part).

A sealed segment's records go to a Parquet file of the tier (``storage.tier``) and its
cursors and fence to a record in the metadata store (``storage.tier_records``); the
record is the commit, so a crash on either side of it leaves one readable copy.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from runtime.errors import UnavailableError
from runtime.names import SegmentName
from runtime.uris import redacted
from storage.cursors import CursorStore
from storage.log import SegmentRecords
from storage.tier import TIERED_RECORD, TieredSegment, offload, open_tier, tiered_location
from storage.tier_records import RecordedCursors, TieredRecord, TierRecords
from storage.topic_storage import (
    SegmentIdentity,
    read_segment_identity,
    stored_fence_epoch,
)


class TieringParts:
    """What the store's tiering needs of it (``SegmentStore`` provides each)."""

    name: SegmentName
    incarnation: str
    directory: Path
    log: SegmentRecords
    cursors: CursorStore
    _records: TierRecords | None
    _fence: int
    _identity: SegmentIdentity | None

    @property
    def identity(self) -> SegmentIdentity: ...

    def _check_alive(self) -> None: ...

    def _check_identity(self, identity: SegmentIdentity) -> None: ...

    @property
    def tiered(self) -> bool:
        return isinstance(self.log, TieredSegment)

    def copy_to_tier(self, uri: str, directory: str) -> TieredSegment:
        """Copy the sealed log to ``directory`` of the tier at ``uri`` and commit it there
        (``storage.tier.offload``); the local log keeps serving meanwhile. Thread-safe:
        meant for a worker thread, then ``use_tier`` on the owner's."""
        self._check_alive()
        if isinstance(self.log, TieredSegment):
            return self.log
        filesystem, _ = open_tier(uri)
        try:
            offload(self.log, filesystem, directory, segment_id=self.name.segment_id)
            return TieredSegment(filesystem, directory)
        except OSError as err:  # the store is down, full, or refuses the credentials
            raise UnavailableError(
                f"{self.name}: moving to the tier {redacted(uri)} failed: {err}"
            ) from None

    def use_tier(self, uri: str, tiered: TieredSegment) -> None:
        """Serve from the committed tiered copy and drop every local file: the segment's
        record (``storage.tier_records``), with its cursors and fence as they are now,
        is written first and is the commit, so a crash after it reopens the tiered copy.
        Call on the thread that acknowledges, so no ack falls between snapshot and switch."""
        self._check_alive()
        if isinstance(self.log, TieredSegment):
            return
        if self._records is None:
            raise UnavailableError(f"{self.name}: no metadata store to record the move in")
        record = TieredRecord.of_move(
            uri,
            tiered,
            self.identity.info,
            self._fence,
            self.cursors.snapshot(),
            time.time_ns() // 1_000_000,
        )
        self._records.commit(self.name.segment_id, record)
        local, self.log = self.log, tiered
        self.cursors.abandon_unsaved()  # the record holds them
        self.cursors = CursorStore(backend=RecordedCursors(self._records, self.name.segment_id))
        local.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _tiered_record(self) -> TieredRecord | None:
        """The segment's record when it moved to the tier; a local copy a crash left
        after the move's commit is removed. A segment moved before records existed
        (its local ``tiered.json``) is recorded now, from what its directory holds."""
        if self._records is None:
            return None
        record = self._records.get(self.name.segment_id)
        if record is None:
            record = self._record_legacy_move()
        if record is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        return record

    def _record_legacy_move(self) -> TieredRecord | None:
        location = tiered_location(self.directory)
        identity = read_segment_identity(self.directory)
        if location is None or identity is None or self._records is None:
            return None
        tiered = TieredSegment(*location)
        uri = json.loads((self.directory / TIERED_RECORD).read_bytes())["uri"]
        record = TieredRecord.of_move(
            uri,
            tiered,
            identity.info,
            stored_fence_epoch(self.directory),
            CursorStore(self.directory).snapshot(),
            tiered.manifest.written_at_ms,
        )
        self._records.commit(self.name.segment_id, record)
        return record

    def _open_tiered(self, record: TieredRecord) -> None:
        self._identity = SegmentIdentity(
            topic=str(self.name.topic), incarnation=self.incarnation, info=record.info
        )
        self._check_identity(self._identity)
        filesystem, _ = open_tier(record.uri)
        self.log = TieredSegment(filesystem, record.directory)
        assert self._records is not None
        self.cursors = CursorStore(backend=RecordedCursors(self._records, self.name.segment_id))
        self._fence = record.fence_epoch
