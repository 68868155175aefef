"""Everything one segment keeps on disk: its log, its cursors, its fence and its identity.

The segment actor is a thin async shell over this class, so every rule about
a segment (terminated means read-only, stale controllers are refused, queue
deliveries are tracked until acked) is testable without Ray. Two parts live in modules
of their own: the move to the tier (``storage.segment_tiering``) and queue dispatch
(``storage.segment_queue``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from runtime.batch import with_following
from runtime.dispatch import QueueDispatcher
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentNotFoundError,
    StaleEpochError,
    UnavailableError,
)
from runtime.layout import HashRange, SegmentInfo
from runtime.names import SegmentName
from runtime.share_reads import of_share
from runtime.subscription import ResetTarget
from storage.appends import Append, AppendResult, StoredBatch
from storage.cursors import CursorStore, Position
from storage.durability import Durability
from storage.files import atomic_write
from storage.log import SegmentRecords, to_delivery
from storage.segment_log import SegmentLog
from storage.segment_queue import QueueParts
from storage.segment_stats import subscription_stats
from storage.segment_tiering import TieringParts
from storage.tier import (
    delete_tiered_copies,
)
from storage.tier_records import (
    TierRecords,
    delete_tiered_segment,
)
from storage.topic_storage import (
    FENCE_FILE,
    SegmentIdentity,
    read_segment_identity,
    segment_directory,
    stored_fence_epoch,
    write_segment_identity,
)


class SegmentStore(TieringParts, QueueParts):
    def __init__(
        self,
        name: SegmentName,
        root: Path,
        durability: Durability,
        *,
        incarnation: str,
        create: bool = False,
        info: SegmentInfo | None = None,
        in_layout: bool = True,
        ack_timeout_s: float = 30.0,
        background_sync: bool = False,
        records: TierRecords | None = None,
    ) -> None:
        """Open the storage of segment ``name`` of topic incarnation ``incarnation``;
        only ``create`` may make it, recording ``info`` (its place in the DAG) beside it.
        A segment moved to the tier opens from its record in ``records`` (on any node).

        A segment whose directory has vanished must fail loudly: re-creating
        it empty would let reads silently return less data than was written.
        Storage that says it belongs to another topic, incarnation or segment is
        refused just as loudly.
        """
        self.name = name
        self.incarnation = incarnation
        self.directory = segment_directory(root, name, incarnation)
        self._records = records
        self._ack_timeout_s = ack_timeout_s
        self._dispatchers: dict[str, QueueDispatcher] = {}
        self._deleted = False
        self._readable_limit: int | None = None  # limit_reads
        record = None if create else self._tiered_record()  # a new segment has none
        if record is not None:
            self._open_tiered(record)
            return
        self._identity = read_segment_identity(self.directory)
        stored = (self.directory / "log").is_dir()
        if not create and (self._identity is None or not stored):
            raise UnavailableError(
                f"storage of {name} (incarnation {incarnation}) is missing at "
                f"{self.directory}: refusing to serve an empty segment in its place"
            )
        if self._identity is None:
            info = info or SegmentInfo.active(
                name.segment_id, HashRange(start=name.start, end=name.end), 0
            )
            self._identity = SegmentIdentity(
                topic=str(name.topic), incarnation=incarnation, in_layout=in_layout, info=info
            )
            write_segment_identity(self.directory, self._identity)
        self._check_identity(self._identity)
        self.log: SegmentRecords = SegmentLog(
            self.directory / "log",
            durability=durability,
            segment_id=self.name.segment_id,
            background_sync=background_sync,
        )
        self.cursors = CursorStore(self.directory, fsync=durability.policy == "fsync")
        self._fence = stored_fence_epoch(self.directory)
        self._ack_hidden()  # a crash may have come between a marker and the cursors' save

    # --- the log's state, as the segment actor and its appender see it ------------

    @property
    def start_offset(self) -> int:
        return self.log.start_offset

    @property
    def end_offset(self) -> int:
        return self.log.end_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the retained records."""
        return self.log.size_bytes

    @property
    def terminated(self) -> bool:
        return self.log.terminated

    def last_sequence(self, producer_id: str) -> int:
        return self.log.last_sequence(producer_id)

    def offset_at_time(self, time_ms: int) -> int:
        return self.log.offset_at_time(time_ms)

    def sync(self) -> None:
        self.log.sync()

    # --- fencing ---------------------------------------------------------------

    def check_epoch(self, epoch: int | None) -> None:
        """Refuse a controller request older than the newest controller seen."""
        self._check_alive()
        if epoch is None:
            return
        if epoch < self._fence:
            raise StaleEpochError(
                f"{self.name}: request from controller epoch {epoch} refused, "
                f"epoch {self._fence} has taken over"
            )
        if epoch > self._fence:
            self._fence = epoch
            if self._records is not None and self.tiered:
                self._records.save_fence(self.name.segment_id, epoch)
            else:
                fence = json.dumps({"fenceEpoch": epoch}).encode()
                atomic_write(self.directory / FENCE_FILE, fence)

    @property
    def fence_epoch(self) -> int:
        return self._fence

    # --- data path ---------------------------------------------------------------

    def append(
        self, batch: pa.RecordBatch, producer_id: str | None, sequence: int | None
    ) -> AppendResult:
        self._check_alive()
        (outcome,) = self.log.append_all([Append(batch, producer_id, sequence)])
        if isinstance(outcome, ScalableTopicsError):
            raise outcome
        return outcome

    def append_all(self, appends: Sequence[Append]) -> list[AppendResult | ScalableTopicsError]:
        self._check_alive()
        return self.log.append_all(appends)

    @property
    def replica_log(self) -> SegmentLog:
        """The local log a replica copies to or from (``storage.replica_log``): an active
        segment's; a segment served from the tier has no replicas."""
        if not isinstance(self.log, SegmentLog):
            raise UnavailableError(f"{self.name} is served from the tier: it has no replicas")
        return self.log

    # --- what readers see -----------------------------------------------------------

    def limit_reads(self, end: int | None) -> None:
        """Serve readers records below ``end`` only: a replicated segment's high
        watermark, so that no reader sees an entry a failover could take back. ``None``:
        everything stored (an unreplicated segment)."""
        self._readable_limit = end

    @property
    def readable_end(self) -> int:
        """The end readers are told of and read up to: the last stable offset (nothing of
        an undecided transaction, nor anything after its first message, is read), and a
        replicated segment's high watermark."""
        end = self.log.stable_end
        return end if self._readable_limit is None else min(end, self._readable_limit)

    @property
    def holds_undecided(self) -> bool:
        """Whether a transaction's records here wait for its marker."""
        return self.log.stable_end < self.log.end_offset

    @property
    def sealed_for_readers(self) -> bool:
        """Sealed, and all of it readable: a reader at the end has read the segment."""
        return self.log.terminated and self.readable_end == self.log.end_offset

    def waits_at(self, offset: int) -> bool:
        """Whether a long-poll at ``offset`` has to wait: the segment is live and has
        nothing readable there yet (an error, or records, is answered at once)."""
        return not self._deleted and not self.sealed_for_readers and offset >= self.readable_end

    def read(self, offset: int, max_records: int) -> pa.RecordBatch:
        """The committed records from ``offset``; where the next read starts is in the
        batch's metadata when it is not after its last record (``runtime.batch.following``):
        markers and aborted transactions' records are stepped over, never delivered."""
        self._check_alive()
        start = max(offset, self.log.start_offset)
        stored, following = self._read_log(start, max_records)
        return with_following(to_delivery(stored), start, following, asked=offset)

    def _read_log(self, offset: int, max_records: int) -> tuple[list[StoredBatch], int]:
        if max_records > 0 and offset >= self.readable_end:
            return [], offset
        return self.log.read_committed(offset, max_records, self.readable_end)

    def share_start(self, subscription: str, offset: int) -> int:
        """Where a share's read from ``offset`` begins: nothing below the subscription's
        cumulative acknowledgement is read again."""
        return max(offset, self.position(subscription))

    def read_share(
        self, subscription: str, offset: int, max_records: int, buckets: tuple[int, int, int]
    ) -> tuple[pa.RecordBatch, int]:
        """A stream subscription's read of the records at ``offset`` and after whose key
        falls in buckets ``[start, end)`` of ``count`` (``count`` 0: every key), that the
        subscription has not acknowledged: and the offset after the last record looked
        at, where the next read starts (records of other buckets, or acknowledged ones,
        are stepped over, not waited on)."""
        self._check_alive()
        offset = self.share_start(subscription, offset)
        stored, following = self._read_log(offset, max_records)
        scanned = to_delivery(stored)
        if scanned.num_rows == 0:
            return scanned, following
        acked = self.cursors.get(subscription).acked_ranges
        return of_share(scanned, acked, buckets), following

    def terminate(self, epoch: int | None, sealed: SealedBy | None = None) -> int:
        """Seal the log; ``sealed`` (a split's or merge's children and the epoch that
        commits it) is recorded in the segment's identity for recovery, before the log
        is sealed, so a sealed log always says which children took its range."""
        self.check_epoch(epoch)
        if sealed is not None:
            self._record_sealed(sealed)
        self.log.terminate()
        return self.log.end_offset

    def mark(self, txn_id: str, committed: bool) -> int:
        """Write transaction ``txn_id``'s fate here (``SegmentLog.mark``) and return the
        marker's offset. Every subscription counts the marker, and an aborted
        transaction's records, as acknowledged, before any reader can see past them."""
        self._check_alive()
        offset = self.log.mark(txn_id, committed)
        fate = self.log.txn_fate(txn_id)
        first = offset if fate is None or fate.first is None else fate.first
        self.cursors.ack_ranges(self.log.hidden_ranges(first))
        return offset

    @property
    def identity(self) -> SegmentIdentity:
        assert self._identity is not None
        return self._identity

    def retain(self, oldest_publish_ms: int | None, max_bytes: int | None) -> int:
        """Time/size retention of this segment's head; returns the new start offset.

        Like a sealed segment, which is pruned only once drained, an active one
        loses only what every subscription has acknowledged: retention bounds
        consumed data and never takes a message from a subscriber.
        """
        self._check_alive()
        positions = [self.cursors.get(name).mark_delete for name in self.cursors.names()]
        keep_from = min(positions) if positions else None
        return self.log.retain(oldest_publish_ms, max_bytes, keep_from)

    def delete(self, epoch: int | None) -> None:
        """Remove the segment: its tiered copy first, its record after it (so a crash in
        between leaves something that still says where the copy is). An object store
        that is down does not stop a deletion (``delete_tiered_segment``)."""
        self.check_epoch(epoch)
        self.log.close()
        self.cursors.abandon_unsaved()
        if self._records is not None:
            delete_tiered_segment(self._records, self.name.segment_id)
        delete_tiered_copies(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        self._deleted = True

    @property
    def deleted(self) -> bool:
        """Whether ``delete`` removed it: nothing of it may be written any more."""
        return self._deleted

    # --- subscriptions -------------------------------------------------------------

    def create_subscription(self, name: str, position: Position, epoch: int | None) -> int:
        """Idempotent; returns the cursor's position."""
        self.check_epoch(epoch)
        log = self.log  # "latest" is the last stable offset, as in Kafka's read_committed
        self.cursors.create(name, position, log.start_offset, log.stable_end)
        self._ack_hidden(name)
        return self.cursors.get(name).mark_delete

    def delete_subscription(self, name: str, epoch: int | None) -> None:
        self.check_epoch(epoch)
        self.cursors.delete(name)
        self._dispatchers.pop(name, None)

    def seek(self, subscription: str, to: ResetTarget, epoch: int | None) -> dict[str, Any]:
        """Move ``subscription``'s cursor to the first offset (``earliest``), the end
        (``latest``), or the first record published at or after a time (the end when
        none was). Records handed to queue consumers and not acknowledged are forgotten:
        delivery starts over from the cursor. Returns the new position and whether the
        segment is finished for the subscription (sealed, nothing left after it)."""
        self.check_epoch(epoch)
        log = self.log
        if to == "earliest":
            offset = log.start_offset
        elif to == "latest":
            offset = log.stable_end
        else:
            offset = max(log.offset_at_time(to), log.start_offset)
        self.cursors.move(subscription, offset)
        self._ack_hidden(subscription)
        self._dispatchers.pop(subscription, None)
        finished = log.terminated and self.position(subscription) >= log.end_offset
        return {"position": offset, "finished": finished}

    def subscriptions(self) -> list[str]:
        self._check_alive()
        return self.cursors.names()

    def position(self, subscription: str) -> int:
        """First unacknowledged offset: where a stream consumer resumes."""
        return max(self.cursors.get(subscription).mark_delete, self.log.start_offset)

    def drained(self, subscription: str) -> bool:
        return self.sealed_for_readers and self.position(subscription) >= self.readable_end

    def ack_cumulative(self, subscription: str, offset: int, *, save_later: bool = False) -> bool:
        """``save_later``: keep the ack in memory until ``save_acks`` (``CursorStore``
        says why); returns whether a save is owed now."""
        self._check_alive()
        self._check_written(offset)
        return self.cursors.ack_cumulative(subscription, offset, save_later=save_later)

    @property
    def cursor_version(self) -> int:
        return self.cursors.version

    def export_cursors(self) -> tuple[int, bytes]:
        """Every cursor and their version (``CursorStore.export``): a leader's, to ship."""
        return self.cursors.export()

    def adopt_cursors(self, exported: bytes) -> None:
        """Hold exactly the cursors a leader exported (a follower's store)."""
        self._check_alive()
        self.cursors.adopt(exported)

    def save_acks(self) -> None:
        """Persist acks taken with ``save_later`` (the actor's saver, off its loop)."""
        if not self._deleted:
            self.cursors.save_unsaved()

    def ack(self, subscription: str, offsets: Iterable[int]) -> None:
        self._check_alive()
        offsets = list(offsets)
        self._check_written(max((o for o in offsets if isinstance(o, int)), default=-1))
        self.cursors.ack(subscription, offsets)
        self._dispatcher(subscription).acknowledged(offsets)

    # --- stats -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        self._check_alive()
        log = self.log
        subs = subscription_stats(
            self.cursors.snapshot(), log.start_offset, log.end_offset, log.publish_time_at
        )
        for name, dispatcher in self._dispatchers.items():
            if name in subs:
                subs[name]["inFlight"] = dispatcher.in_flight
        return {
            "segment": str(self.name),
            "segmentId": self.name.segment_id,
            "terminated": log.terminated,
            "startOffset": log.start_offset,
            "endOffset": log.end_offset,
            "stableEnd": log.stable_end,
            "records": log.end_offset - log.start_offset,
            "sizeBytes": log.size_bytes,
            "lastPublishTimeMs": log.last_publish_time_ms,
            "sealedAtMs": log.terminated_at_ms,
            "tiered": self.tiered,
            "fenceEpoch": self._fence,
            "subscriptions": subs,
        }

    def close(self) -> None:
        """Release the files; acks not saved yet are saved first."""
        if not self._deleted:
            self.cursors.save_unsaved()
            self.log.close()

    # --- internals ---------------------------------------------------------------

    def _ack_hidden(self, name: str | None = None) -> None:
        """Count what no reader will get as acknowledged by subscription ``name`` (every
        subscription for ``None``), from where it stands."""
        names = [name] if name is not None else self.cursors.names()
        marks = [self.cursors.get(n).mark_delete for n in names]
        if marks:
            self.cursors.ack_ranges(self.log.hidden_ranges(min(marks)), names)

    def _check_alive(self) -> None:
        if self._deleted:
            raise SegmentNotFoundError(f"{self.name} has been deleted")

    def _check_written(self, offset: int) -> None:
        """Only what was written can be acknowledged: a cursor moved past the end would
        skip the messages written there next, delivered to no consumer."""
        if isinstance(offset, int) and offset >= self.log.end_offset:
            raise InvalidArgumentError(
                f"offset {offset} of {self.name} is not written yet: its end is "
                f"{self.log.end_offset}"
            )

    def _check_identity(self, identity: SegmentIdentity) -> None:
        expected = (str(self.name.topic), self.incarnation, self.name.segment_id)
        found = (identity.topic, identity.incarnation, identity.info.segment_id)
        rng = identity.info.hash_range
        if found != expected or (rng.start, rng.end) != (self.name.start, self.name.end):
            raise UnavailableError(
                f"storage at {self.directory} belongs to segment {identity.info.segment_id} "
                f"{rng} of {identity.topic} (incarnation {identity.incarnation}), not to "
                f"{self.name} (incarnation {self.incarnation}): refusing to open it"
            )

    def _record_sealed(self, sealed: SealedBy) -> None:
        info = self.identity.info
        if not info.is_active and info.child_ids == sealed.children:
            return  # a repeated terminate (a resumed operation)
        updated = info.sealed(sealed.epoch, sealed.children)
        self._identity = self.identity.model_copy(update={"info": updated})
        write_segment_identity(self.directory, self._identity)


class SealedBy(NamedTuple):
    """Who replaces a sealed segment: its children, and the layout epoch that says so."""

    children: tuple[int, ...]
    epoch: int
