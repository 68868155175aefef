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
because engines read it as it is: Spark scans the file directly, by row group,
with no segment process involved.

Any ``pyarrow.fs`` URI works: ``file:///…`` and ``s3://bucket/prefix`` (with
``endpoint_override``, ``scheme``, credentials… as URI query parameters, as
``pyarrow.fs.FileSystem.from_uri`` takes them).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import re
import time
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pydantic import BaseModel, ConfigDict, Field

from runtime.batch import BATCH_SCHEMA, DELIVERY_SCHEMA
from runtime.errors import InvalidArgumentError, UnavailableError
from storage.appends import StoredBatch
from storage.segment_log import SegmentLog

TIER_FORMAT = 1
RECORDS_FILE = "records.parquet"
MANIFEST_FILE = "manifest.json"
ROW_GROUP_RECORDS = 65_536
_READ_STEP = 10_000  # records per local read while offloading
# query parameters of a URI that hold credentials, hidden wherever the URI is shown
_SECRET = re.compile(r"(?i)secret|key|token|password|session")

TIER_SCHEMA = pa.schema(
    [
        *DELIVERY_SCHEMA,
        ("producer_id", pa.string()),
        ("sequence", pa.int64()),
    ]
)


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
    written_at_ms: int = Field(alias="writtenAtMs")


def open_tier(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system and base path of a tier URI; a malformed or unsupported URI is
    an ``InvalidArgumentError`` naming it."""
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as err:
        reason = str(err).replace(uri, redacted(uri))
        raise InvalidArgumentError(f"tier URI {redacted(uri)!r} cannot be used: {reason}") from None
    return filesystem, path.rstrip("/")


def redacted(uri: str) -> str:
    """``uri`` fit for errors, logs and stats: credentials in it replaced by ``***``."""
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{name}=***" if _SECRET.search(name) else f"{name}={value}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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


def offload(log: SegmentLog, filesystem: pafs.FileSystem, directory: str) -> TierManifest:
    """Copy a terminated ``log`` to ``directory`` of the tier and commit it (its manifest).

    The log's frames are checked first and the uploaded records are compared with
    them after: a mismatch raises ``UnavailableError`` and commits nothing.
    """
    if not log.terminated:
        raise InvalidArgumentError(f"segment log {log.directory} is not sealed: it may still grow")
    log.verify()
    filesystem.create_dir(directory, recursive=True)
    path = f"{directory}/{RECORDS_FILE}"
    with filesystem.open_output_stream(path) as out:
        writer = pq.ParquetWriter(out, TIER_SCHEMA, compression="zstd")
        for table in _row_groups(log):
            writer.write_table(table, row_group_size=ROW_GROUP_RECORDS)
        writer.close()
    manifest = _check_upload(log, filesystem, path)
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


def delete_tiered(filesystem: pafs.FileSystem, directory: str) -> None:
    """Remove a tiered segment, manifest first (so a crash leaves no half segment)."""
    for name in (MANIFEST_FILE, RECORDS_FILE):
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(f"{directory}/{name}")
    with contextlib.suppress(OSError):  # object stores may have no directory to remove
        filesystem.delete_dir(directory)


class TieredSegment:
    """Reads of a tiered segment, as ``SegmentLog`` answers them."""

    def __init__(self, filesystem: pafs.FileSystem, directory: str) -> None:
        manifest = read_manifest(filesystem, directory)
        if manifest is None:
            raise UnavailableError(f"no tiered segment at {directory}: its manifest is missing")
        self.manifest = manifest
        self._file = pq.ParquetFile(filesystem.open_input_file(f"{directory}/{RECORDS_FILE}"))
        self._firsts = [first for first, _, _ in manifest.row_groups]
        self._last_times = [last for _, _, last in manifest.row_groups]

    @property
    def start_offset(self) -> int:
        return self.manifest.start_offset

    @property
    def end_offset(self) -> int:
        return self.manifest.end_offset

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
        first = bisect.bisect_right(self._firsts, offset) - 1
        last = bisect.bisect_left(self._firsts, offset + max_records)
        table = self._file.read_row_groups(list(range(first, last)))
        skip = offset - self._firsts[first]
        return list(_stored_runs(table.slice(skip, max_records)))

    def offset_at_time(self, time_ms: int) -> int:
        """The first offset published at or after ``time_ms``; the end when none was."""
        group = bisect.bisect_left(self._last_times, time_ms)
        if group == len(self._firsts):
            return self.end_offset
        times = self._file.read_row_group(group, columns=["publish_time"]).column(0)
        stamps = times.cast(pa.int64()).to_numpy()
        return self._firsts[group] + int(np.searchsorted(stamps, time_ms, side="left"))


# --- internals -------------------------------------------------------------------------


def _row_groups(log: SegmentLog) -> Iterator[pa.Table]:
    """The log's records as tables of at most a row group each."""
    pending: list[pa.Table] = []
    size = 0
    for batch in _stored(log):
        table = _as_tier_table(batch)
        pending.append(table)
        size += table.num_rows
        if size >= ROW_GROUP_RECORDS:
            whole = pa.concat_tables(pending)
            yield whole.slice(0, ROW_GROUP_RECORDS)
            pending, size = [whole.slice(ROW_GROUP_RECORDS)], size - ROW_GROUP_RECORDS
    if size:
        yield pa.concat_tables(pending)


def _stored(log: SegmentLog) -> Iterator[StoredBatch]:
    offset = log.start_offset
    while offset < log.end_offset:
        batches = log.read(offset, _READ_STEP)
        if not batches:
            return
        yield from batches
        last = batches[-1]
        offset = last.base_offset + last.records.num_rows


def _as_tier_table(batch: StoredBatch) -> pa.Table:
    n = batch.records.num_rows
    records = batch.records
    columns = [records.column(name) for name in BATCH_SCHEMA.names]
    columns.append(pa.array(np.arange(batch.base_offset, batch.base_offset + n), pa.int64()))
    columns.append(
        pa.array(np.full(n, batch.publish_time_ms, dtype=np.int64)).cast(
            DELIVERY_SCHEMA.field("publish_time").type
        )
    )
    columns.append(pa.array([batch.producer_id] * n, pa.string()))
    columns.append(pa.array([batch.sequence] * n, pa.int64()))
    return pa.Table.from_arrays(columns, schema=TIER_SCHEMA)


def _check_upload(log: SegmentLog, filesystem: pafs.FileSystem, path: str) -> TierManifest:
    """Read the uploaded file back and compare it with the log, row group by row group."""
    uploaded = pq.ParquetFile(filesystem.open_input_file(path))
    expected = _row_groups(log)
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
    if records != log.end_offset - log.start_offset:
        raise UnavailableError(f"the tiered copy at {path} holds {records} records, not all")
    return TierManifest(
        segment=str(log.directory),
        start_offset=log.start_offset,
        end_offset=log.end_offset,
        records=records,
        size_bytes=filesystem.get_file_info(path).size,
        row_groups=groups,
        written_at_ms=time.time_ns() // 1_000_000,
    )


def _stored_runs(table: pa.Table) -> Iterator[StoredBatch]:
    """Split rows into runs of one stored batch (publish time, producer, sequence)."""
    if table.num_rows == 0:
        return
    times = table.column("publish_time").cast(pa.int64()).to_numpy()
    keys = list(
        zip(
            times.tolist(),
            table.column("producer_id").to_pylist(),
            table.column("sequence").to_pylist(),
            strict=True,
        )
    )
    starts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    records = pa.Table.from_arrays(
        [table.column(name) for name in BATCH_SCHEMA.names], schema=BATCH_SCHEMA
    )
    offsets = table.column("offset")
    for begin, end in zip(starts, [*starts[1:], len(keys)], strict=True):
        publish, producer, sequence = keys[begin]
        chunk = records.slice(begin, end - begin).combine_chunks()
        yield StoredBatch(
            base_offset=offsets[begin].as_py(),
            publish_time_ms=publish,
            producer_id=producer,
            sequence=sequence,
            records=chunk.to_batches()[0],
        )
