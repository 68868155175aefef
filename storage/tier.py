"""A sealed segment's records in an object store: written once, checked, then read
from there by every reader.

A sealed segment never changes again, so its log can leave the node: one Parquet
file of its records (the columns a read returns, plus each record's producer and
sequence), and beside it a small manifest. The manifest is written last and is the
commit point: a segment is in the tier exactly when its manifest is there, so a
crash at any step leaves the local copy (still authoritative) or a complete tiered
copy, never neither, and offloading again simply overwrites what a crash left.

Before the manifest goes up, the local log is checked against its own frame
checksums and the uploaded file is read back and compared with it record by
record: the local copy may then be removed. Parquet, not the log's own frames,
so that engines read a tiered segment as it is: Spark's snapshot reads scan the
files (``clients.read_plan``), with no segment process involved; consumers read
through the segment (``TieredSegment``). Where a segment's copy is, and everything
else about it once its local storage is gone, is its record in metadata
(``storage.tier_records``).

Any ``pyarrow.fs`` URI works: ``file:///…`` and ``s3://bucket/prefix`` (with
``endpoint_override``, ``scheme``, credentials… as URI query parameters, as
``pyarrow.fs.FileSystem.from_uri`` takes them).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pydantic import BaseModel, ConfigDict, Field

from runtime.batch import BATCH_SCHEMA, DELIVERY_SCHEMA
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentTerminated,
    TierRefusedError,
    UnavailableError,
)
from runtime.hashing import key_hashes
from runtime.names import SegmentName
from runtime.uris import redacted
from storage.appends import Append, AppendResult, StoredBatch
from storage.segment_log import SegmentLog

logger = logging.getLogger(__name__)

TIER_FORMAT = 2  # 2: each record's routing hash and segment id, for engines' scans
RECORDS_FILE = "records.parquet"
MANIFEST_FILE = "manifest.json"
# In a segment's local directory, where a previous version noted where its records
# went (now the segment's record in metadata, ``storage.tier_records``, says so):
# read to carry such a segment over, and to delete its copy with its storage.
TIERED_RECORD = "tiered.json"
# A row group holds whole stored batches, about this many bytes of records: an engine's
# scan reads a row group at a time (Spark writes 128 MiB ones), and a consumer's read of
# a woken tiered segment decodes one and keeps it for the next read. Never more than
# ``ROW_GROUP_MAX_RECORDS`` records, so tiny records do not make huge groups.
ROW_GROUP_BYTES = 32 * 1024 * 1024
ROW_GROUP_MAX_RECORDS = 1_048_576
TIER_COMPRESSION = "snappy"  # Spark's own default: its scans of the tier run at its speed
# Columns with few distinct values; a dictionary of values, offsets or properties (nearly
# all distinct) only costs a scan the work of giving it up.
_DICTIONARY_COLUMNS = ["key", "publish_time", "producer_id", "sequence", "hash", "segment_id"]
_READ_STEP = 10_000  # records per local read while offloading

TIER_SCHEMA = pa.schema(
    [
        *DELIVERY_SCHEMA,
        ("producer_id", pa.string()),
        ("sequence", pa.int64()),
        # What a snapshot read returns beside the delivery columns (``clients.read_plan``),
        # so an engine scans the file as it is: a record's routing hash, its segment.
        ("hash", pa.int32()),
        ("segment_id", pa.int64()),
    ]
)
# What a read of the tiered segment needs (a file of format 1 has nothing else).
_READ_COLUMNS = [*DELIVERY_SCHEMA.names, "producer_id", "sequence"]


class TierManifest(BaseModel):
    """What a tiered segment holds; written after its records, read before them."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    format: int = TIER_FORMAT
    segment: str
    start_offset: int = Field(alias="startOffset")
    end_offset: int = Field(alias="endOffset")
    records: int
    size_bytes: int = Field(alias="sizeBytes")
    # (first offset, record count, last publish time) of each row group, in order
    row_groups: list[tuple[int, int, int]] = Field(alias="rowGroups")
    # each producer's highest stored sequence, as the log answered ``last_sequence``
    last_sequences: dict[str, int] = Field(default_factory=dict, alias="lastSequences")
    sealed_at_ms: int | None = Field(default=None, alias="sealedAtMs")
    written_at_ms: int = Field(alias="writtenAtMs")
    # [start, end) ranges of offsets no reader gets (transactions' markers and aborted
    # records), left out of the file: its offsets skip them
    hidden: list[tuple[int, int]] = Field(default_factory=list)


def open_tier(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system and base path of a tier URI; a malformed or unsupported URI is
    an ``InvalidArgumentError`` naming it."""
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as err:
        reason = str(err).replace(uri, redacted(uri))
        raise InvalidArgumentError(f"tier URI {redacted(uri)!r} cannot be used: {reason}") from None
    return filesystem, path.rstrip("/")


def check_reachable(filesystem: pafs.FileSystem, base: str) -> None:
    """Write, read back and remove a probe object under ``base``: refuses (with the
    store's reason) a tier that is unreachable, denies writes or refuses the credentials."""
    probe = f"{base}/.raytopics-probe-{time.time_ns()}"
    try:
        filesystem.create_dir(base, recursive=True)
        with filesystem.open_output_stream(probe) as out:
            out.write(b"ok")
        with filesystem.open_input_stream(probe) as stream:
            if stream.read() != b"ok":
                raise OSError("a probe object read back different bytes")
        filesystem.delete_file(probe)
    except OSError as err:
        raise UnavailableError(f"tier {base!r} is not usable: {err}") from None


def check_tier(uri: str) -> None:
    """Refuse a tier URI that cannot be parsed (``InvalidArgumentError``), or reached,
    denies writes or refuses the credentials (``TierRefusedError``, with the store's
    reason): checked when a tiering policy is set, so a bad one is refused then rather
    than failing every offload."""
    filesystem, base = open_tier(uri)
    try:
        check_reachable(filesystem, base)
    except UnavailableError as err:
        raise TierRefusedError(f"tiering.uri {redacted(uri)!r}: {err.message}") from None


def tier_directory(base: str, name: SegmentName, incarnation: str) -> str:
    """Where a segment's tiered copy lives under the tier's ``base``: the same
    tenant/namespace/topic/incarnation/segment path as its local storage."""
    topic = name.topic
    parts = (topic.tenant, topic.namespace, topic.topic, incarnation, name.descriptor)
    return "/".join((base, *parts))


def offload(
    log: SegmentLog,
    filesystem: pafs.FileSystem,
    directory: str,
    *,
    segment_id: int,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> TierManifest:
    """Copy the terminated ``log`` of segment ``segment_id`` to ``directory`` of the tier
    and commit it (its manifest).

    The log's frames are checked first and the uploaded records are compared with
    them after: a mismatch raises ``UnavailableError`` and commits nothing. Only what
    readers get is copied: transactions' markers and aborted records are left out, and
    their offsets listed in the manifest (``hidden``).
    """
    if not log.terminated:
        raise InvalidArgumentError(f"segment log {log.directory} is not sealed: it may still grow")
    if log.stable_end < log.end_offset:
        raise UnavailableError(
            f"segment log {log.directory} holds a transaction not decided yet: it stays in "
            "local storage until its marker is written"
        )
    log.verify()
    filesystem.create_dir(directory, recursive=True)
    path = f"{directory}/{RECORDS_FILE}"
    with filesystem.open_output_stream(path) as out:
        writer = pq.ParquetWriter(
            out, TIER_SCHEMA, compression=TIER_COMPRESSION, use_dictionary=_DICTIONARY_COLUMNS
        )
        for table in _row_groups(log, segment_id, row_group_bytes):
            writer.write_table(table, row_group_size=table.num_rows)
        writer.close()
    manifest = _check_upload(log, filesystem, path, segment_id, row_group_bytes)
    with filesystem.open_output_stream(f"{directory}/{MANIFEST_FILE}") as out:
        out.write(manifest.model_dump_json(by_alias=True).encode())
    return manifest


def read_manifest(filesystem: pafs.FileSystem, directory: str) -> TierManifest | None:
    """The committed manifest of a tiered segment; None when it was never committed."""
    try:
        with filesystem.open_input_stream(f"{directory}/{MANIFEST_FILE}") as stream:
            raw = stream.read()
    except FileNotFoundError:
        return None
    return TierManifest.model_validate(json.loads(raw))


def tiered_location(segment_directory: Path) -> tuple[pafs.FileSystem, str] | None:
    """The tier and directory a segment's records moved to; None while they are local."""
    try:
        record = json.loads((segment_directory / TIERED_RECORD).read_bytes())
    except FileNotFoundError:
        return None
    filesystem, _ = open_tier(record["uri"])
    return filesystem, record["directory"]


def delete_tiered_copies(directory: Path) -> None:
    """Delete the tiered copy of every segment stored under ``directory`` (a segment's,
    an incarnation's or a topic's), before its local storage goes. A store that is down
    does not stop it: those objects are left, and said in the log."""
    for record in directory.rglob(TIERED_RECORD):
        try:
            location = tiered_location(record.parent)
            if location is not None:
                delete_tiered(*location)
        except (OSError, ScalableTopicsError) as err:
            logger.warning("the tiered copy of %s was not deleted, left: %s", record.parent, err)


def delete_tiered(filesystem: pafs.FileSystem, directory: str) -> None:
    """Remove a tiered segment, manifest first (so a crash leaves no half segment)."""
    for name in (MANIFEST_FILE, RECORDS_FILE):
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(f"{directory}/{name}")
    with contextlib.suppress(OSError):  # object stores may have no directory to remove
        filesystem.delete_dir(directory)


class TieredSegment:
    """A tiered segment, read as its sealed ``SegmentLog`` was: the same reads, seeks and
    answers to a producer, from the object store. Appends are refused as a sealed log
    refuses them, a retried one with the offsets it got the first time."""

    terminated = True

    def __init__(self, filesystem: pafs.FileSystem, directory: str) -> None:
        manifest = read_manifest(filesystem, directory)
        if manifest is None:
            raise UnavailableError(f"no tiered segment at {directory}: its manifest is missing")
        self.manifest, self.directory = manifest, directory
        self._file = pq.ParquetFile(filesystem.open_input_file(f"{directory}/{RECORDS_FILE}"))
        self._firsts = [first for first, _, _ in manifest.row_groups]
        self._last_times = [last for _, _, last in manifest.row_groups]
        self._stored_sequences: dict[tuple[str, int], AppendResult] | None = None
        self._decoded: tuple[int, pa.Table] | None = None  # ``_group``'s last
        # one row group's offsets and publish times (``_offsets_and_times``)
        self._times: tuple[int, np.ndarray, np.ndarray] | None = None

    @property
    def start_offset(self) -> int:
        return self.manifest.start_offset

    @property
    def end_offset(self) -> int:
        return self.manifest.end_offset

    @property
    def size_bytes(self) -> int:
        return self.manifest.size_bytes

    @property
    def last_publish_time_ms(self) -> int | None:
        return self._last_times[-1] if self._last_times else None

    @property
    def terminated_at_ms(self) -> int | None:
        return self.manifest.sealed_at_ms

    def last_sequence(self, producer_id: str) -> int:
        return self.manifest.last_sequences.get(producer_id, -1)

    def read(self, offset: int, max_records: int) -> list[StoredBatch]:
        """Up to ``max_records`` records from ``offset``, one ``StoredBatch`` per stored
        batch (a run of one publish time, producer and sequence)."""
        if max_records <= 0:
            raise InvalidArgumentError(f"max_records must be positive, got {max_records}")
        if offset < self.start_offset:
            raise InvalidArgumentError(
                f"offset {offset} is below the start offset {self.start_offset} "
                f"of tiered segment {self.manifest.segment}"
            )
        if offset >= self.end_offset:
            return []
        first = max(bisect.bisect_right(self._firsts, offset) - 1, 0)
        last = max(bisect.bisect_left(self._firsts, offset + max_records), first + 1)
        groups = [self._group(group) for group in range(first, last)]
        table = groups[0] if len(groups) == 1 else pa.concat_tables(groups)
        offsets = table.column("offset").to_numpy()
        skip = int(np.searchsorted(offsets, offset, side="left"))  # hidden ones are absent
        return list(_stored_runs(table.slice(skip, max_records)))

    @property
    def stable_end(self) -> int:
        """Its end: only a log whose transactions are all decided is moved to the tier."""
        return self.end_offset

    def read_committed(
        self, offset: int, max_records: int, end: int | None = None
    ) -> tuple[list[StoredBatch], int]:
        """``read`` below ``end`` (the file holds committed records only), and the offset
        to read from next, past the hidden ranges that follow."""
        stop = self.end_offset if end is None else min(end, self.end_offset)
        stored = self.read(offset, max_records) if offset < stop else []
        stored = _below(stored, stop)
        after = stored[-1].base_offset + stored[-1].records.num_rows if stored else offset
        if sum(batch.records.num_rows for batch in stored) < max_records:
            # Nothing readable before ``stop`` is left: step over the hidden ranges that
            # follow, as the local log's read does (``LogIndex.visible_from``).
            for start, finish in self.manifest.hidden:  # sorted, apart
                if start <= after < finish and finish <= stop:
                    after = finish
        return stored, after

    def hidden_ranges(self, offset: int) -> list[tuple[int, int]]:
        """The manifest's ranges no reader gets, from ``offset`` on."""
        return [(max(s, offset), e) for s, e in self.manifest.hidden if e > offset]

    def _group(self, index: int) -> pa.Table:
        """Row group ``index``, decoded; the last one is kept, since a consumer reads on
        from where it stopped, mostly in the same group."""
        if self._decoded is None or self._decoded[0] != index:
            self._decoded = (index, self._file.read_row_group(index, columns=_READ_COLUMNS))
        return self._decoded[1]

    def publish_time_at(self, offset: int) -> int | None:
        """When the record at ``offset`` was published; ``None`` outside the segment."""
        if not self.start_offset <= offset < self.end_offset:
            return None
        group = bisect.bisect_right(self._firsts, offset) - 1
        offsets, times = self._offsets_and_times(group)
        at = int(np.searchsorted(offsets, offset, side="left"))
        return int(times[at]) if at < len(offsets) and offsets[at] == offset else None

    def offset_at_time(self, time_ms: int) -> int:
        """The first offset published at or after ``time_ms``; the end when none was."""
        group = bisect.bisect_left(self._last_times, time_ms)
        if group == len(self._firsts):
            return self.end_offset
        offsets, times = self._offsets_and_times(group)
        return int(offsets[int(np.searchsorted(times, time_ms, side="left"))])

    def _offsets_and_times(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """Row group ``group``'s offsets and publish times (ms); the last asked is kept."""
        if self._times is None or self._times[0] != group:
            table = self._file.read_row_group(group, columns=["offset", "publish_time"])
            offsets = table.column("offset").to_numpy()
            self._times = (group, offsets, table.column("publish_time").cast(pa.int64()).to_numpy())
        return self._times[1], self._times[2]

    def append_all(self, appends: Sequence[Append]) -> list[AppendResult | ScalableTopicsError]:
        """A retried ``(producer, sequence)`` gets its original offsets; anything else is
        refused with ``SegmentTerminated``, so its producer routes it to the children."""
        outcomes: list[AppendResult | ScalableTopicsError] = []
        for append in appends:
            found = None
            if append.producer_id is not None and append.sequence is not None:
                found = self._sequences().get((append.producer_id, append.sequence))
            outcomes.append(
                found
                or SegmentTerminated(
                    f"append refused: segment {self.manifest.segment} is sealed (and tiered); "
                    "route the message to its children"
                )
            )
        return outcomes

    def terminate(self) -> None:
        """Already sealed for good (a resumed split or merge seals again: nothing to do)."""

    def retain(
        self, oldest_publish_ms: int | None, max_bytes: int | None, keep_from: int | None = None
    ) -> int:
        """A sealed segment is retained whole (pruned), never from its head."""
        return self.start_offset

    def sync(self) -> None:
        """Nothing to flush: the tier was written and checked once."""

    def close(self) -> None:
        """Nothing held open but the reader, which the garbage collector closes."""

    def _sequences(self) -> dict[tuple[str, int], AppendResult]:
        """Where each sequenced batch went, read once from the file when first needed."""
        if self._stored_sequences is None:
            columns = self._file.read(columns=["offset", "publish_time", "producer_id", "sequence"])
            found: dict[tuple[str, int], AppendResult] = {}
            for batch in _stored_runs_of(columns):
                if batch[1] is not None and batch[2] is not None:
                    base, count = batch[0], batch[3]
                    found[(batch[1], batch[2])] = AppendResult(base, count, duplicate=True)
            self._stored_sequences = found
        return self._stored_sequences


# --- internals -------------------------------------------------------------------------


def _row_groups(log: SegmentLog, segment_id: int, group_bytes: int) -> Iterator[pa.Table]:
    """The log's records as tables of one row group each: whole stored batches, until
    about ``group_bytes`` or ``ROW_GROUP_MAX_RECORDS``."""
    pending: list[pa.Table] = []
    size = rows = 0
    for batch in _stored(log):
        table = _as_tier_table(batch, segment_id)
        pending.append(table)
        size, rows = size + table.nbytes, rows + table.num_rows
        if size >= group_bytes or rows >= ROW_GROUP_MAX_RECORDS:
            yield pa.concat_tables(pending)
            pending, size, rows = [], 0, 0
    if pending:
        yield pa.concat_tables(pending)


def _stored(log: SegmentLog) -> Iterator[StoredBatch]:
    """What readers get of the log, in order (``read_committed``)."""
    offset = log.start_offset
    while offset < log.end_offset:
        batches, following = log.read_committed(offset, _READ_STEP)
        if following <= offset:
            return
        yield from batches
        offset = following


def _as_tier_table(batch: StoredBatch, segment_id: int) -> pa.Table:
    n = batch.records.num_rows
    records = batch.records
    columns = [records.column(name) for name in BATCH_SCHEMA.names]
    columns.append(pa.array(np.arange(batch.base_offset, batch.base_offset + n), pa.int64()))
    columns.append(
        pa.array(np.full(n, batch.publish_time_ms, dtype=np.int64)).cast(
            DELIVERY_SCHEMA.field("publish_time").type
        )
    )
    columns.append(pa.repeat(pa.scalar(batch.producer_id, pa.string()), n))
    columns.append(pa.repeat(pa.scalar(batch.sequence, pa.int64()), n))
    hashes = key_hashes(records.column("key"))
    columns.append(pa.array(hashes, type=pa.int32(), mask=hashes < 0))
    columns.append(pa.repeat(pa.scalar(segment_id, pa.int64()), n))
    return pa.Table.from_arrays(columns, schema=TIER_SCHEMA)


def _check_upload(
    log: SegmentLog, filesystem: pafs.FileSystem, path: str, segment_id: int, group_bytes: int
) -> TierManifest:
    """Read the uploaded file back and compare it with the log, row group by row group."""
    uploaded = pq.ParquetFile(filesystem.open_input_file(path))
    expected = _row_groups(log, segment_id, group_bytes)
    groups: list[tuple[int, int, int]] = []
    for index in range(uploaded.num_row_groups):
        got = uploaded.read_row_group(index)
        want = next(expected, None)
        if want is None or not got.equals(want):
            raise UnavailableError(f"the tiered copy at {path} differs from the log: not committed")
        offsets = got.column("offset")
        last_time = got.column("publish_time").cast(pa.int64())[-1].as_py()
        groups.append((offsets[0].as_py(), got.num_rows, last_time))
    if next(expected, None) is not None:
        raise UnavailableError(f"the tiered copy at {path} is missing records: not committed")
    records = sum(count for _, count, _ in groups)
    hidden = log.hidden_ranges(log.start_offset)
    if records != log.end_offset - log.start_offset - sum(end - start for start, end in hidden):
        raise UnavailableError(f"the tiered copy at {path} holds {records} records, not all")
    return TierManifest(
        segment=str(log.directory),
        last_sequences=log.last_sequences(),
        sealed_at_ms=log.terminated_at_ms,
        start_offset=log.start_offset,
        end_offset=log.end_offset,
        records=records,
        size_bytes=filesystem.get_file_info(path).size,
        row_groups=groups,
        written_at_ms=time.time_ns() // 1_000_000,
        hidden=hidden,
    )


def _run_starts(table: pa.Table, names: Sequence[str]) -> np.ndarray:
    """Row positions where any of the columns ``names`` changes (0 first): the starts of
    the stored batches, found by Arrow kernels, not a Python loop over records."""
    changed = np.zeros(max(table.num_rows - 1, 0), dtype=bool)
    for name in names:
        if name == _GAP:
            offsets = table.column("offset").to_numpy()
            changed |= np.diff(offsets) != 1
            continue
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.int64())
        column = pc.fill_null(column, "" if pa.types.is_string(column.type) else -1)
        differs = pc.not_equal(column.slice(1), column.slice(0, len(column) - 1))
        changed |= differs.to_numpy(zero_copy_only=False).astype(bool)
    return np.concatenate([[0], np.flatnonzero(changed) + 1]).astype(np.int64)


_GAP = "offset gap"  # for ``_run_starts``: a row whose offset does not follow the one before


def _stored_runs_of(table: pa.Table) -> Iterator[tuple[int, str | None, int | None, int]]:
    """(first offset, producer, sequence, records) of each run of one producer sequence."""
    for begin, end, first in _runs(table, ("producer_id", "sequence")):
        yield first["offset"], first["producer_id"], first["sequence"], end - begin


def _runs(table: pa.Table, names: Sequence[str]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(begin, end, first row's offset, publish time in ms, producer and sequence) of each
    run of rows alike in the columns ``names``."""
    if table.num_rows == 0:
        return
    starts = _run_starts(table, names)
    heads = pa.table(
        {
            "offset": table.column("offset"),
            "publish_ms": table.column("publish_time").cast(pa.int64()),
            "producer_id": table.column("producer_id"),
            "sequence": table.column("sequence"),
        }
    ).take(pa.array(starts))
    ends = [*starts[1:].tolist(), table.num_rows]
    yield from zip(starts.tolist(), ends, heads.to_pylist(), strict=True)


def _stored_runs(table: pa.Table) -> Iterator[StoredBatch]:
    """Split rows into runs of one stored batch (publish time, producer, sequence, and
    consecutive offsets: two batches alike on either side of a hidden range are two)."""
    records = pa.Table.from_arrays(
        [table.column(name) for name in BATCH_SCHEMA.names], schema=BATCH_SCHEMA
    )
    for begin, end, first in _runs(table, ("publish_time", "producer_id", "sequence", _GAP)):
        yield StoredBatch(
            base_offset=first["offset"],
            publish_time_ms=first["publish_ms"],
            producer_id=first["producer_id"],
            sequence=first["sequence"],
            records=records.slice(begin, end - begin).combine_chunks().to_batches()[0],
        )


def _below(stored: list[StoredBatch], stop: int) -> list[StoredBatch]:
    """``stored`` cut at offset ``stop``."""
    kept = []
    for batch in stored:
        if batch.base_offset >= stop:
            break
        n = min(batch.records.num_rows, stop - batch.base_offset)
        kept.append(
            batch
            if n == batch.records.num_rows
            else replace(batch, records=batch.records.slice(0, n))
        )
    return kept
