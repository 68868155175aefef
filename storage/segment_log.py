"""Durable append-only log of one segment.

The log is a directory of chunk files named after the offset of their first
record, so retention can drop whole files from the head without rewriting
anything. Each append is one self-checking frame (header + Arrow IPC payload)
written with a single ``write`` call, which makes a crash leave at most one torn
frame, at the tail of the last chunk; recovery cuts that tail off.

The frame format is ``storage.frames``; what an append is and how retries are
told from new messages, ``storage.appends``; the settings (where, how durable),
``storage.durability``; the files, their handles and flushes, ``storage.chunk_files``.
This module owns what the files hold: the in-memory index of every stored batch, the
producers' sequences, the transactions' batches and markers (``runtime.txn_visibility``
says what readers see of them), the seal, retention from the head, and recovery after
a crash.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from runtime.batch import deserialize_batch
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentTerminated,
    UnavailableError,
)
from runtime.txn_visibility import Fate, TxnIndex
from storage.appends import Append, AppendResult, ProducerWindow, StoredBatch, checked
from storage.chunk_files import ChunkFiles, sync_and_close
from storage.durability import DEFAULT_DURABILITY, Durability
from storage.files import atomic_write
from storage.frames import (
    FRAME_BATCH,
    FRAME_TERMINATION,
    FRAME_TXN_BATCH,
    FRAME_TXN_MARKER,
    Encoded,
    Frame,
    encode_frame,
    scan_frames,
    split_frames,
)
from storage.log_index import IndexEntry, LogIndex, adjacent_runs

_START_MARKER = "start-offset"


class SegmentLog:
    """The durable, append-only record log of one segment.

    Thread-safe: one lock serializes appends, reads and maintenance, so a read
    always sees whole frames that are already in the index.
    """

    def __init__(
        self,
        directory: Path,
        *,
        durability: Durability = DEFAULT_DURABILITY,
        max_chunk_bytes: int = 64 << 20,
        segment_id: int | None = None,
        background_sync: bool = False,
    ) -> None:
        """``background_sync``: under the ``interval`` policy appends never flush; the
        owner calls ``sync`` on a timer, from another thread: a flush can take long on a
        busy disk, and an append that paid it would stall every producer and reader of
        the segment (bench/README.md, "Design measurements")."""
        if max_chunk_bytes <= 0:
            raise InvalidArgumentError(f"max_chunk_bytes must be positive, got {max_chunk_bytes}")
        self._directory = Path(directory)
        self._durability = durability
        self._segment_id = segment_id
        self._lock = threading.Lock()
        self._chunk_settings = (max_chunk_bytes, background_sync)
        self._open_files()

    def _open_files(self) -> None:
        """Index what the directory holds (recovering a torn tail) and open it for appends."""
        max_chunk_bytes, background_sync = self._chunk_settings
        self._files = ChunkFiles(
            self._directory,
            self._durability,
            max_chunk_bytes=max_chunk_bytes,
            background_sync=background_sync,
            label=self._label,
        )
        self._index = LogIndex()
        self._txns = TxnIndex()
        self._producers: dict[str, ProducerWindow] = {}
        self._start_offset = 0
        self._end_offset = 0
        self._terminated = False
        self._terminated_at_ms: int | None = None
        self._last_publish_time_ms: int | None = None
        self._recover()
        self._files.open_for_appends()

    # --- properties -------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def start_offset(self) -> int:
        return self._start_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._end_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the retained records (batches below the start no longer count)."""
        chunks = self._files.chunks
        total = sum(chunk.size for chunk in chunks)
        index = self._index.first_from(self._start_offset)
        if index == len(self._index):  # everything retention allowed is gone
            return total - chunks[0].size if self._start_offset > 0 else total
        head = self._index.entries[index]
        return total - (head.position if head.chunk_base == chunks[0].base_offset else 0)

    @property
    def terminated(self) -> bool:
        return self._terminated

    @property
    def terminated_at_ms(self) -> int | None:
        """When the log was sealed (its termination frame's time); None while it is not."""
        return self._terminated_at_ms

    @property
    def last_publish_time_ms(self) -> int | None:
        return self._last_publish_time_ms

    def publish_time_at(self, offset: int) -> int | None:
        """When the record at ``offset`` was published (its batch's time); ``None`` when
        no retained record has that offset."""
        with self._lock:
            if not self._start_offset <= offset < self._end_offset:
                return None
            entries = self._index.covering(offset, 1)
            return entries[0].publish_time_ms if entries else None

    def offset_at_time(self, time_ms: int) -> int:
        """The first retained offset published at or after ``time_ms``, the end when none
        was: publish times never decrease along the log, so a binary search of the index."""
        with self._lock:
            found = self._index.first_published(self._start_offset, time_ms)
            return self._end_offset if found is None else found

    def last_sequences(self) -> dict[str, int]:
        """Every producer's highest stored sequence (what a tiered copy answers later)."""
        with self._lock:
            return {pid: window.last_sequence for pid, window in self._producers.items()}

    def last_sequence(self, producer_id: str) -> int:
        """Highest sequence stored for ``producer_id``; -1 when it never appended here."""
        window = self._producers.get(producer_id)
        return window.last_sequence if window is not None else -1

    # --- writing ----------------------------------------------------------------

    def append(
        self,
        batch: pa.RecordBatch,
        producer_id: str | None = None,
        sequence: int | None = None,
        *,
        payload: bytes | memoryview | None = None,
    ) -> AppendResult:
        """Store ``batch`` durably (per policy) and give its records the next offsets.

        A retried ``(producer_id, sequence)`` returns the original offsets with
        ``duplicate=True`` and stores nothing, so producers can retry blindly.
        ``payload``: the batch's Arrow IPC bytes when the caller already has them
        (``batch`` decoded from them), so they are stored without re-encoding.
        """
        (outcome,) = self.append_all([Append(batch, producer_id, sequence, payload)])
        if isinstance(outcome, ScalableTopicsError):
            raise outcome
        return outcome

    def append_all(self, appends: Sequence[Append]) -> list[AppendResult | ScalableTopicsError]:
        """Store several batches, in order, with one write and at most one flush.

        Group commit: a segment's data plane receives several batches per read,
        and storing them together makes its cost per batch mostly the copy of its
        bytes. Each append has its own outcome: its offsets, or the error that
        refused it (a refused append stores nothing and does not stop the others).
        A failed write raises, and stores none of them.
        """
        ready = [checked(append) for append in appends]  # encoded outside the lock
        with self._lock:
            self._check_open()
            outcomes, frames = self._frames_for(ready)
            if frames:
                self._store(frames)
        return outcomes

    def _frames_for(
        self, checked: list[Append | ScalableTopicsError]
    ) -> tuple[list[AppendResult | ScalableTopicsError], list[Encoded]]:
        """Every append's outcome (its offsets, a duplicate's original ones, also of an
        earlier append in this group, or the error that refused it) and the frames to
        write, encoded. One pass, because the data plane stores ~15k batches a second
        on one core: the three passes this replaced cost ~2 us more per batch."""
        outcomes: list[AppendResult | ScalableTopicsError] = []
        frames: list[Encoded] = []
        grouped: dict[tuple[str, int], AppendResult] = {}  # the sequenced appends before
        offset = self._end_offset
        # Publish times never go backwards within a segment, even if the clock
        # does, so time-based retention and seeks can rely on their order.
        publish_time_ms = max(_now_ms(), self._last_publish_time_ms or 0)
        for append in checked:
            if isinstance(append, ScalableTopicsError):
                outcomes.append(append)
                continue
            key = (append.producer_id, append.sequence)
            try:
                # Duplicates first: a resend of a batch stored before the seal must get
                # its original offsets, or the producer would re-route it to the children.
                outcome = self._duplicate(key, grouped) or self._check_not_terminated()
            except ScalableTopicsError as err:
                outcome = err
            if outcome is None and append.txn_id is not None:
                try:
                    self._txns.check(append.txn_id)
                except ScalableTopicsError as err:
                    outcome = err
            if outcome is None:
                frame = Frame(
                    FRAME_BATCH if append.txn_id is None else FRAME_TXN_BATCH,
                    offset, append.batch.num_rows, publish_time_ms, *key, append.txn_id,
                )  # fmt: skip
                frames.append(encode_frame(frame, append.payload))
                outcome = AppendResult(offset, frame.count)
                if append.sequence is not None:
                    grouped[key] = outcome
                offset += frame.count
            outcomes.append(outcome)
        return outcomes, frames

    def _duplicate(
        self, key: tuple[str | None, int | None], grouped: dict[tuple[str, int], AppendResult]
    ) -> AppendResult | None:
        """The original offsets of a stored (or earlier in this group) producer sequence."""
        producer_id, sequence = key
        if sequence is None:
            return None
        if key in grouped:
            return grouped[key]._replace(duplicate=True)
        window = self._producers.get(producer_id)
        return window.check(producer_id, sequence) if window is not None else None

    def _store(self, frames: list[Encoded]) -> None:
        """Indexed before the flush: if the flush fails, the frames are on file anyway
        and later appends must come after them; a producer retry is then a duplicate."""
        self._files.roll_if_full(self._end_offset)
        position = self._files.write(frames)
        chunk_base = self._files.active.base_offset
        for header, payload, frame in frames:
            length = len(header) + len(payload)
            self._indexed(IndexEntry.of(frame, chunk_base, position, len(payload), length))
            position += length
        self._files.sync_per_policy()

    def terminate(self) -> None:
        """Seal the log forever; the marker is fsynced whatever the policy, because
        a segment that forgets it was sealed would accept writes its children own."""
        with self._lock:
            self._check_open()
            if self._terminated:
                return
            frame = Frame(FRAME_TERMINATION, self._end_offset, 0, _now_ms(), None, None)
            self._files.write([encode_frame(frame, b"")])
            self._files.release_preallocation()
            self._files.fsync()
            self._terminated, self._terminated_at_ms = True, frame.publish_time_ms

    def mark(self, txn_id: str, committed: bool) -> int:
        """Record ``txn_id``'s fate after its batches here, and return the marker's offset:
        its batches become readable (committed) or are skipped (aborted), and no batch of
        it is taken any more. Asked again, it returns the first marker's offset. A sealed
        log takes markers too (a transaction open when it was sealed ends after it).
        Flushed whatever the policy: a finished transaction's markers are not written
        again, and a lost one would hold this log's readers forever."""
        with self._lock:
            self._check_open()
            fate = self._txns.fate(txn_id)
            if fate is None:
                frame = Frame(FRAME_TXN_MARKER, self._end_offset, 1, _now_ms(), None,
                              int(committed), txn_id)  # fmt: skip
                self._store([encode_frame(frame, b"")])
                self._files.fsync()
                return frame.base_offset
            self._txns.marker(fate.marker, txn_id, committed)  # refuses the other fate
            return fate.marker

    @property
    def stable_end(self) -> int:
        """Where readers of committed data stop: the first batch of the oldest undecided
        transaction, or the end."""
        return self._txns.stable_end(self._end_offset)

    def txn_fate(self, txn_id: str) -> Fate | None:
        """``txn_id``'s fate here, once its marker is stored."""
        return self._txns.fate(txn_id)

    def sync(self) -> None:
        """Flush appended data to disk; meant for a timer under the ``interval`` policy,
        so the last appends before a quiet period do not stay unsynced.

        The flush runs outside the log's lock, on duplicated descriptors, so
        appends and reads go on meanwhile and a chunk roll cannot close them.
        """
        with self._lock:
            self._check_open()
            fds = self._files.take_unsynced()
        sync_and_close(fds)
        self._files.synced()

    def truncate_head(self, before_offset: int) -> int:
        """Drop whole chunks whose records are all below ``before_offset``.

        Only whole files go, so retention is a cheap unlink; the active chunk
        always stays, so appends never lose their file. Returns records dropped.
        """
        with self._lock:
            self._check_open()
            dropped = self._drop_chunks_below(before_offset)
            if dropped:
                self._files.synced_directory()
            return dropped

    def retain(
        self, oldest_publish_ms: int | None, max_bytes: int | None, keep_from: int | None = None
    ) -> int:
        """Retention on a live log: drop whole batches from the head that were published
        before ``oldest_publish_ms`` or that push the log over ``max_bytes``, but never
        a batch reaching ``keep_from`` or beyond (what a reader still needs).

        The new start offset is persisted (a marker file), so a restart does not
        resurrect what retention dropped; chunk files wholly below it are unlinked.
        Returns the start offset.
        """
        with self._lock:
            self._check_open()
            entries, keep = self._index.entries, self._index.first_from(self._start_offset)
            stop = self._index.ending_by(keep_from)
            if oldest_publish_ms is not None:
                while keep < stop and entries[keep].publish_time_ms < oldest_publish_ms:
                    keep += 1
            if max_bytes is not None:
                excess = sum(e.frame_length for e in entries[keep:]) - max_bytes
                while keep < stop and excess > 0:
                    excess -= entries[keep].frame_length
                    keep += 1
            start = entries[keep].base_offset if keep < len(entries) else self._end_offset
            if start > self._start_offset:
                atomic_write(
                    self._directory / _START_MARKER,
                    str(start).encode(),
                    fsync=self._durability.flushes,
                )
                self._start_offset = start
                # Reads below the start are refused, so the index of the batches there
                # is dead weight until their whole chunk goes: tens of MB for a slow
                # topic of small batches, whose 64 MB chunk may take days to fill.
                self._index.forget_below(start)
                self._drop_chunks_below(start)
            return self._start_offset

    def close(self) -> None:
        """Release file handles; flushes first unless the policy says not to bother."""
        with self._lock:
            self._files.close()

    def delete(self) -> None:
        """Remove the log and everything else stored in its directory (cursors too)."""
        with self._lock:
            self._files.delete()

    def files_lost(self) -> str | None:
        """Why this log's files are gone from its disk (removed while it runs), ``None``
        while they are there: a replica that answers so is rebuilt from another."""
        with self._lock:
            return self._files.lost() if self._files.is_open else None

    def verify(self) -> None:
        """Check every frame of every chunk against its checksum (reading it all): raises
        ``UnavailableError`` naming the first chunk that is damaged. Meant before the
        log's bytes are copied elsewhere, since reads trust the index, not the CRCs."""
        with self._lock:
            self._check_open()
            self._files.verify()

    # --- copies between replicas ---------------------------------------------------------

    def frames_from(self, offset: int, max_bytes: int) -> bytes:
        """The stored batches' frames from ``offset`` (where a batch begins) on, verbatim:
        one at least, then more while they fit in ``max_bytes``. What a leader sends a
        follower, which stores them with ``append_frames``."""
        with self._lock:
            self._check_open()
            if offset >= self._end_offset:
                return b""
            taken, size = [], 0
            for entry in self._index.entries[self._batch_at(offset) :]:
                if taken and size + entry.frame_length > max_bytes:
                    break
                taken.append(entry)
                size += entry.frame_length
            return b"".join(self._read_run(run) for run in adjacent_runs(taken))

    def append_frames(self, data: bytes | memoryview) -> int:
        """Store a leader's frames as they are, from this log's end, and return the new end.

        Offsets, publish times and producers' sequences are the leader's, so every replica
        reads alike and a producer's retry after a failover is a duplicate here too. Checked
        as recovery checks a chunk (``storage.frames.split_frames``): all stored, or none."""
        with self._lock:
            self._check_open()
            frames = split_frames(data, self._end_offset)
            if any(frame.frame_type == FRAME_TERMINATION for _, _, frame in frames):
                raise InvalidArgumentError(
                    "copied frames hold batches only: a replica is sealed with terminate()"
                )
            if not all(frame.frame_type == FRAME_TXN_MARKER for _, _, frame in frames):
                self._check_not_terminated()  # a sealed log takes markers only
            if frames:
                self._store(frames)
            return self._end_offset

    def truncate_tail(self, end: int) -> int:
        """Drop every batch from ``end`` (where a batch begins) on: a follower's tail that
        its new leader never had (``runtime.replication.divergence``). A sealed log keeps
        its tail. Returns the records dropped."""
        with self._lock:
            self._check_open()
            if end >= self._end_offset:
                return 0
            self._check_not_terminated()
            cut = self._index.entries[self._batch_at(end)]
            dropped = self._end_offset - end
            self._files.cut(cut.chunk_base, cut.position)
            self._open_files()  # the producers' windows forget the dropped sequences
            return dropped

    def begin_at(self, offset: int) -> None:
        """Make an empty log begin at ``offset``: a new follower of a leader whose log no
        longer begins at 0 (retention dropped its head) copies from the leader's start."""
        with self._lock:
            self._check_open()
            if self._end_offset != self._start_offset or len(self._index):
                raise InvalidArgumentError(
                    f"segment {self._label} holds records: only an empty log is moved"
                )
            if offset != self._end_offset:
                self._files.rebase(offset)
                self._open_files()

    def _batch_at(self, offset: int) -> int:
        """The index position of the batch that begins at ``offset``."""
        if offset < self._start_offset:
            raise InvalidArgumentError(
                f"offset {offset} is below the start offset {self._start_offset} "
                f"of segment {self._label}"
            )
        position = self._index.first_from(offset)
        if position == len(self._index) or self._index.entries[position].base_offset != offset:
            raise InvalidArgumentError(
                f"offset {offset} does not begin a batch of segment {self._label}"
            )
        return position

    # --- reading ----------------------------------------------------------------

    def read(self, offset: int, max_records: int) -> list[StoredBatch]:
        """Up to ``max_records`` whole records starting exactly at ``offset``."""
        with self._lock:
            self._check_readable(offset, max_records)
            entries = self._entries_from(offset, max_records)
            return self._read_entries(entries, offset, max_records)

    def read_committed(
        self, offset: int, max_records: int, end: int | None = None
    ) -> tuple[list[StoredBatch], int]:
        """What a reader of committed data gets from ``offset``: up to ``max_records``
        records of the batches below the stable end (and below ``end``, a replicated
        segment's high watermark) that belong to no transaction or to a committed one,
        and the offset to read from next, past the markers and aborted batches skipped
        on the way."""
        with self._lock:
            self._check_readable(offset, max_records)
            stop = self.stable_end if end is None else min(end, self.stable_end)
            chosen, next_offset = self._index.visible_from(
                offset, max_records, stop, self._txns.visible
            )
            return self._read_entries(chosen, offset, max_records), next_offset

    def hidden_ranges(self, offset: int) -> list[tuple[int, int]]:
        """The ranges from ``offset`` on that no reader will get (markers, aborted
        batches): what every subscription counts as acknowledged."""
        with self._lock:
            if not self._txns.any_decided:
                return []
            return self._index.hidden_from(offset, self._txns.hidden)

    def _check_readable(self, offset: int, max_records: int) -> None:
        """Refuse a read of nothing, of a closed log, or from below the start offset."""
        if max_records <= 0:
            raise InvalidArgumentError(f"max_records must be positive, got {max_records}")
        self._check_open()
        if offset < self._start_offset:
            raise InvalidArgumentError(
                f"offset {offset} is below the start offset {self._start_offset} "
                f"of segment {self._label}: those records were dropped by retention"
            )

    def _entries_from(self, offset: int, max_records: int) -> list[IndexEntry]:
        """The index entries holding offsets ``[offset, offset + max_records)``."""
        if offset >= self._end_offset:
            return []
        return self._index.covering(offset, max_records)

    def _read_entries(
        self, entries: list[IndexEntry], offset: int, max_records: int
    ) -> list[StoredBatch]:
        """Read each run of adjacent frames with one ``pread``, then slice views of it."""
        batches: list[StoredBatch] = []
        remaining = max_records
        for run in adjacent_runs(entries):
            start = run[0].position
            buffer = pa.py_buffer(self._read_run(run))
            for entry in run:
                if entry.frame_type == FRAME_TXN_MARKER:
                    continue  # holds no records
                payload_start = entry.position - start + entry.frame_length - entry.payload_length
                records = deserialize_batch(buffer.slice(payload_start, entry.payload_length))
                skip = max(0, offset - entry.base_offset)
                take = min(entry.count - skip, remaining)
                batches.append(_stored(entry, records.slice(skip, take), entry.base_offset + skip))
                remaining -= take
        return batches

    def _read_run(self, run: list[IndexEntry]) -> bytes:
        """The frames of adjacent batches of one chunk, with one ``pread``."""
        start = run[0].position
        length = run[-1].position + run[-1].frame_length - start
        return self._files.pread(run[0].chunk_base, length, start)

    # --- internals --------------------------------------------------------------

    @property
    def _label(self) -> str:
        return str(self._segment_id) if self._segment_id is not None else str(self._directory)

    def _check_open(self) -> None:
        if not self._files.is_open:
            raise UnavailableError(f"segment log {self._label} is closed")

    def _check_not_terminated(self) -> None:
        """Raises ``SegmentTerminated`` once the log is sealed; returns None, so that
        ``duplicate or self._check_not_terminated()`` reads as a check."""
        if self._terminated:
            raise SegmentTerminated(
                f"append refused: segment {self._label} is terminated; "
                "route the message to its children",
                segment_id=self._segment_id,
            )

    def _indexed(self, entry: IndexEntry) -> None:
        """Make a stored batch visible to reads and to duplicate detection."""
        self._index.add(entry)
        self._end_offset = entry.base_offset + entry.count
        self._last_publish_time_ms = entry.publish_time_ms
        if entry.txn_id is not None:
            if entry.frame_type == FRAME_TXN_MARKER:
                self._txns.marker(entry.base_offset, entry.txn_id, entry.sequence == 1)
                return  # a marker has no producer
            self._txns.batch(entry.base_offset, entry.txn_id)
        if entry.producer_id is not None and entry.sequence is not None:
            window = self._producers.get(entry.producer_id)
            if window is None:
                window = self._producers[entry.producer_id] = ProducerWindow()
            window.remember(entry.sequence, entry)

    def _drop_chunks_below(self, offset: int) -> int:
        """Drop the chunks whose records are all below ``offset``, never the last one;
        returns the records dropped."""
        chunks, dropped = self._files.chunks, 0
        while len(chunks) > 1 and chunks[1].base_offset <= offset:
            first = self._files.drop_first().base_offset
            dropped += chunks[0].base_offset - first
            self._index.forget_below(chunks[0].base_offset)
            self._start_offset = max(self._start_offset, chunks[0].base_offset)
        return dropped

    # --- recovery ---------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the index and the producer windows from the frame headers.

        Only the tail of the last chunk can be torn by a crash (earlier chunks
        were flushed before the roll), so that is cut off silently; damage
        anywhere else is real corruption and refuses to open rather than serve
        a log with a hole in it.
        """
        paths = self._files.stored()
        if not paths:
            self._files.create(0)
            return
        self._start_offset = self._end_offset = paths[0][0]
        for number, (base_offset, path) in enumerate(paths):
            if base_offset != self._end_offset:
                raise UnavailableError(
                    f"segment {self._label}: chunk {path.name} should start at offset "
                    f"{self._end_offset}; the log has a hole"
                )
            self._recover_chunk(base_offset, path, is_last=number == len(paths) - 1)
        with contextlib.suppress(FileNotFoundError):
            marker = int((self._directory / _START_MARKER).read_text())
            self._start_offset = min(max(self._start_offset, marker), self._end_offset)

    def _recover_chunk(self, base_offset: int, path: Path, *, is_last: bool) -> None:
        chunk = self._files.adopt(base_offset, path)
        with open(path, "rb") as file:
            for frame, payload_length in scan_frames(file, self._end_offset):
                length = frame.length(payload_length)
                if frame.frame_type == FRAME_TERMINATION:
                    self._terminated, self._terminated_at_ms = True, frame.publish_time_ms
                else:
                    self._indexed(
                        IndexEntry.of(frame, base_offset, chunk.size, payload_length, length)
                    )
                chunk.size += length
            file_size = os.fstat(file.fileno()).st_size
        if chunk.size == file_size:
            return
        if not is_last:
            raise UnavailableError(
                f"segment {self._label}: chunk {path.name} is corrupt at byte {chunk.size} "
                "and is not the last chunk"
            )
        os.truncate(path, chunk.size)


def _stored(entry: IndexEntry, records: pa.RecordBatch, base_offset: int) -> StoredBatch:
    return StoredBatch(
        base_offset=base_offset,
        publish_time_ms=entry.publish_time_ms,
        producer_id=entry.producer_id,
        sequence=entry.sequence,
        records=records,
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
