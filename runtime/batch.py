"""The record batch contract: how messages travel and how they are stored.

Messages move as columnar Arrow record batches so that the hot path (producer ->
segment actor -> log -> consumer) never loops in Python per message; the
per-message cost is paid once, inside Arrow's C++ code. The same bytes that
cross the wire are the bytes written to disk, so storage needs no re-encoding.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from runtime.errors import InvalidArgumentError, LimitExceededError

if TYPE_CHECKING:
    from runtime.limits import Limits

PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
BATCH_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("properties", PROPERTIES_TYPE),
    ]
)
# A batch with neither keys nor properties travels and is stored as its values alone:
# Arrow's IPC format keeps an absent string or map column's offsets (4 bytes per
# message each), 8% of a batch of 100-byte values. ``deserialize_batch`` puts the
# absent columns back, so readers see ``BATCH_SCHEMA`` whichever form was stored.
VALUES_SCHEMA = pa.schema([BATCH_SCHEMA.field("value")])
# The entries of an all-null properties column: none. ``pa.nulls``, not ``pa.array``,
# which imports pandas (~300 modules) into every process that imports this one.
_NO_ENTRIES = pa.nulls(0, pa.struct([PROPERTIES_TYPE.key_field, PROPERTIES_TYPE.item_field]))
# What a read returns: the stored columns, then each record's offset and publish time.
DELIVERY_SCHEMA = pa.schema(
    [
        *BATCH_SCHEMA,
        ("offset", pa.int64()),
        ("publish_time", pa.timestamp("ms", tz="UTC")),
    ]
)

# Arrow arrays are cast only between the 32- and 64-bit offset variants of one
# type: a silent int -> string cast would hide a producer bug.
_CASTABLE_FROM = {
    pa.binary(): pa.large_binary(),
    pa.string(): pa.large_string(),
}

BinaryLike = Sequence[bytes] | pa.Array | pa.ChunkedArray | np.ndarray
KeysLike = Sequence[str | None] | pa.Array | pa.ChunkedArray | None
PropertiesLike = Sequence[dict[str, str] | None] | pa.Array | pa.ChunkedArray | None


def make_batch(
    values: BinaryLike,
    keys: KeysLike = None,
    properties: PropertiesLike = None,
) -> pa.RecordBatch:
    """Build a batch in ``BATCH_SCHEMA``, refusing malformed input up front.

    Validation happens here, at the edge, so a bad message is reported to the
    producer that sent it instead of surfacing later as a storage error. Arrow
    arrays are only cast (never iterated), which keeps the fast path free of
    Python-level per-message work. ``str`` items among the values are stored as
    their UTF-8 bytes, because that is what Arrow's binary conversion does.
    """
    value_array = _to_array("values", values, pa.binary())
    count = len(value_array)
    key_array = _optional_column("keys", keys, pa.string(), count)
    properties_array = _optional_column("properties", properties, PROPERTIES_TYPE, count)
    return pa.RecordBatch.from_arrays(
        [key_array, value_array, properties_array], schema=BATCH_SCHEMA
    )


def message_sizes(batch: pa.RecordBatch) -> np.ndarray:
    """Bytes of key + value of each message: what size limits count."""
    keys = _keys(batch)
    sizes = _item_sizes(batch.column("value"))
    return sizes if keys is None else sizes + _item_sizes(keys)


def equal_runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal adjacent values (``==`` per element;
    identity for objects without it): per-row facts such as a row's sink or publish
    time come in a few runs, so callers handle each run once instead of each row."""
    if not len(values):
        return []
    starts = (np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()
    return list(itertools.pairwise([0, *starts, len(values)]))


def batch_bytes(batch: pa.RecordBatch) -> int:
    """Bytes of key + value of all messages, off the ends of the offsets buffers: O(1),
    so a segment learns that no message can be over a size limit without a pass per
    message. Equal to ``message_sizes(batch).sum()``."""
    keys = _keys(batch)
    return _span(batch.column("value")) + (0 if keys is None else _span(keys))


def check_batch(limits: Limits, batch: pa.RecordBatch) -> None:
    """One append's batch against ``limits``. Every append in a segment pays this, so the
    common case is settled in O(1): when all the batch's buffers together fit both size
    limits, no message and no batch total can exceed them. Otherwise the sizes per
    message are read only when the batch's total is over ``max_message_bytes``.
    """
    if batch.num_rows > limits.max_batch_messages:
        raise LimitExceededError(
            f"batch of {batch.num_rows} messages exceeds max_batch_messages "
            f"{limits.max_batch_messages}"
        )
    if batch.get_total_buffer_size() <= min(limits.max_message_bytes, limits.max_batch_bytes):
        return
    total = batch_bytes(batch)
    if total > limits.max_message_bytes:
        limits.check_message(int(message_sizes(batch).max()))
    if total > limits.max_batch_bytes:
        raise LimitExceededError(
            f"batch of {total} bytes exceeds max_batch_bytes {limits.max_batch_bytes}"
        )


def batch_slices(sizes: np.ndarray, max_messages: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut consecutive messages into ``[start, stop)`` runs within both limits.

    Every single message is assumed to fit (checked at send); a run always holds
    at least one message, so the cut always makes progress.
    """
    slices, start, total = [], 0, len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    while start < total:
        base = ends[start - 1] if start else 0
        by_bytes = int(np.searchsorted(ends, base + max_bytes, side="right"))
        stop = min(total, start + max_messages, max(by_bytes, start + 1))
        slices.append((start, stop))
        start = stop
    return slices


def _keys(batch: pa.RecordBatch) -> pa.Array | None:
    """The key column; None for a batch decoded as stored without one (``VALUES_SCHEMA``)."""
    index = batch.schema.get_field_index("key")
    return batch.column(index) if index >= 0 else None


def _span(array: pa.Array) -> int:
    if len(array) == 0:
        return 0
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)
    return int(offsets[array.offset + len(array)] - offsets[array.offset])


def _item_sizes(array: pa.Array) -> np.ndarray:
    """Bytes of each item of a binary or string array, read off its offsets buffer: a
    third of the time of Arrow's compute kernels, and every append in a segment pays
    it. A null item spans no bytes (or, in a batch built by hand, the bytes it spans)."""
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)
    return np.diff(offsets[array.offset : array.offset + len(array) + 1]).astype(np.int64)


def int64_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """Wrap int64 NumPy values as ``arrow_type`` (int64 or a timestamp) without copying.
    Not ``pa.array``: on NumPy input it imports pandas, which would cost every segment
    and consumer process a second and ~50 MB; nor a ``cast`` to the timestamp type,
    which imports ``pyarrow.compute``."""
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def int64_values(array: pa.Array) -> np.ndarray:
    """The values of a null-free int64 (or timestamp) Arrow array as a NumPy view, for
    the same reason: ``to_numpy`` imports pandas too."""
    data = np.frombuffer(array.buffers()[1], dtype=np.int64)
    return data[array.offset : array.offset + len(array)]


# Arrow IPC body compressions a producer may ask for (``Producer(compression=...)``).
COMPRESSIONS = ("zstd", "lz4")


def check_compression(codec: object) -> str | None:
    """``codec`` if it is one of ``COMPRESSIONS`` or None; else ``InvalidArgumentError``
    naming them."""
    if codec is None or codec in COMPRESSIONS:
        return codec  # type: ignore[return-value]
    allowed = ", ".join(repr(c) for c in COMPRESSIONS)
    raise InvalidArgumentError(f"compression must be one of {allowed} or None, got {codec!r}")


def serialize_batch(batch: pa.RecordBatch, compression: str | None = None) -> bytes:
    """Encode with the Arrow IPC stream format, uncompressed unless ``compression``.

    Uncompressed by default: compression costs more CPU than it saves on local disks
    at the target rate, but repetitive values (JSON events) shrink several times, and
    a segment stores what the producer sent as it is. The stream format is
    self-describing (a compressed body says so), so a frame on disk can be decoded
    without any outside schema.
    """
    if compression is None:
        return b"".join(ipc_parts(batch))
    batch = _values_only(batch)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_write_options(compression)) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@functools.lru_cache(maxsize=4)
def _write_options(compression: str) -> pa.ipc.IpcWriteOptions:
    return pa.ipc.IpcWriteOptions(compression=check_compression(compression))


def ipc_parts(batch: pa.RecordBatch) -> tuple[bytes | pa.Buffer, ...]:
    """The bytes of ``serialize_batch`` in pieces, for a caller that joins them with
    more (one copy in all): the schema's message, the batch's, the end-of-stream
    marker. The same bytes a stream writer writes, for a third of the CPU: opening
    a writer costs twice what encoding a 200-record batch does. A batch without keys
    and properties is written as ``VALUES_SCHEMA``."""
    batch = _values_only(batch)
    return (_schema_bytes(batch.schema), batch.serialize(), _END_OF_STREAM)


def _values_only(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch in ``BATCH_SCHEMA`` without keys and properties as ``VALUES_SCHEMA``
    (the checks cost ~1 us; 8 KB fewer bytes per 1,000 messages took 4-7 us off a
    segment's ~57 us); any other batch (one with keys, a delivery batch) as it is."""
    rows = batch.num_rows
    if not batch.schema.equals(BATCH_SCHEMA) or rows == 0:
        return batch
    if batch.column(0).null_count < rows or batch.column(2).null_count < rows:
        return batch
    return pa.RecordBatch.from_arrays([batch.column(1)], schema=VALUES_SCHEMA)


def _with_absent_columns(values: pa.RecordBatch) -> pa.RecordBatch:
    """A ``VALUES_SCHEMA`` batch back in ``BATCH_SCHEMA``."""
    keys, properties = _absent_columns(values.num_rows)
    return pa.RecordBatch.from_arrays([keys, values.column(0), properties], schema=BATCH_SCHEMA)


@functools.lru_cache(maxsize=8)
def _absent_columns(count: int) -> tuple[pa.Array, pa.Array]:
    """Immutable, so shared: producers send batches of a few sizes, and building the
    columns anew cost ~1.5 us per batch decoded."""
    return (
        _optional_column("keys", None, pa.string(), count),
        _optional_column("properties", None, PROPERTIES_TYPE, count),
    )


def deserialize_batch(
    buf: bytes | memoryview | pa.Buffer, *, restore_absent: bool = True
) -> pa.RecordBatch:
    """Decode one batch without copying: the result keeps ``buf`` alive and views into it.

    A batch stored without keys and properties comes back in ``BATCH_SCHEMA``, their
    columns all null, unless ``restore_absent`` is False: a segment's append path needs
    only the rows and sizes of what it stores, and rebuilding the batch cost it ~1.1 us.

    A stream that starts with one of our schemas' bytes (every batch our clients
    write, every read a segment answers) skips schema parsing, which is most of
    the cost for a 1,000-record batch; anything else goes through the general reader.
    """
    view = memoryview(buf)
    # Copied out once to compare: a memoryview of signed chars (what a socket buffer
    # gives) never equals bytes over 127.
    head = bytes(view[:_LONGEST_PREFIX])
    for prefix, schema in _KNOWN_SCHEMAS:
        if len(view) > len(prefix) and head.startswith(prefix):
            batch = pa.ipc.read_record_batch(pa.py_buffer(view[len(prefix) :]), schema)
            break
    else:
        batch = pa.ipc.open_stream(pa.py_buffer(view)).read_next_batch()
    if restore_absent and batch.schema.equals(VALUES_SCHEMA):
        return _with_absent_columns(batch)
    return batch


@functools.lru_cache(maxsize=8)
def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch with no rows (one per schema: batches are immutable). Not
    ``RecordBatch.from_pylist([])``: that imports pandas, which would cost every
    actor process that imports this module a second of CPU."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


@functools.lru_cache(maxsize=8)
def _schema_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def _optional_column(what: str, data: Any, arrow_type: pa.DataType, count: int) -> pa.Array:
    """An absent column is built directly, never from a list of ``None``: all null, in the
    fewest bytes the IPC format allows (for keys that is what ``pa.nulls`` gives)."""
    if data is None and arrow_type == PROPERTIES_TYPE:
        return _no_properties(count)
    if data is None:
        return pa.nulls(count, arrow_type)
    array = _to_array(what, data, arrow_type)
    if len(array) != count:
        raise InvalidArgumentError(f"{what} has {len(array)} items but there are {count} values")
    return array


def _no_properties(count: int) -> pa.Array:
    """All-null properties with nothing but a bitmap and offsets. ``pa.nulls`` gives the
    map's empty key and value columns buffers of ``4 * count`` bytes, which the IPC
    writer stores whole: 8 KB of zeros per 1,000 messages, 7% of a batch of 100-byte
    values, on the wire, on disk and in every copy between."""
    offsets = pa.py_buffer(bytes(4 * (count + 1)))  # all zero: every map is empty
    validity = offsets.slice(0, (count + 7) // 8)  # all zero bits: every map is null
    return pa.Array.from_buffers(
        PROPERTIES_TYPE, count, [validity, offsets], null_count=count, children=[_NO_ENTRIES]
    )


def _to_array(what: str, data: Any, arrow_type: pa.DataType) -> pa.Array:
    """Convert any accepted input shape to one Arrow array of ``arrow_type``."""
    if isinstance(data, str | bytes | bytearray | dict):
        raise InvalidArgumentError(
            f"{what} must be a list or an array with one item per message, "
            f"got a single {type(data).__name__}"
        )
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    try:
        if isinstance(data, pa.Array):
            return _cast_array(what, data, arrow_type)
        return pa.array(data, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise InvalidArgumentError(f"{what} cannot be converted to {arrow_type}: {exc}") from exc


def _cast_array(what: str, array: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    if array.type == arrow_type:
        return array
    if array.type != _CASTABLE_FROM.get(arrow_type):
        raise InvalidArgumentError(f"{what} must be an Arrow {arrow_type} array, got {array.type}")
    return array.cast(arrow_type)


_KNOWN_SCHEMAS = [
    (_schema_bytes(schema), schema) for schema in (VALUES_SCHEMA, BATCH_SCHEMA, DELIVERY_SCHEMA)
]
_LONGEST_PREFIX = max(len(prefix) for prefix, _ in _KNOWN_SCHEMAS)
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


# In a queue delivery's schema metadata: JSON of offset → how many times it was
# delivered before (only offsets delivered before are listed).
REDELIVERIES_KEY = "raytopics.redeliveries"

# In a read's schema metadata: "{after} {following}", where the next read starts
# (``following``) when that is not right after the read's last record (``after``): the
# read stepped over transaction markers or aborted records. A slice of the batch that
# ends earlier (a consumer's run) does not end at ``after``, so it says nothing.
FOLLOWING_KEY = "raytopics.following"
# In a read's schema metadata: the offset the read started from, when retention had
# dropped the one asked for. A reader that must not lose records silently (Spark's
# source, with failOnDataLoss) tells the records it lost from those it was never to
# get (a transaction's, stepped over) by it.
STARTED_KEY = "raytopics.started"


def with_following(
    batch: pa.RecordBatch, offset: int, following: int, asked: int | None = None
) -> pa.RecordBatch:
    """``batch``, read from ``offset``, saying that the next read starts at ``following``
    when that is not what its records imply (``following``), and that it started at
    ``offset`` when the read asked for ``asked``, before it."""
    after = _after(batch, offset)
    stated = {}
    if following > after:
        stated[FOLLOWING_KEY] = f"{after} {following}"
    if asked is not None and asked < offset:
        stated[STARTED_KEY] = str(offset)
    return batch.replace_schema_metadata(stated) if stated else batch


def following(batch: pa.RecordBatch, offset: int) -> int:
    """Where the read after ``batch`` (read from ``offset``) starts: after its last
    record, or further when the segment stepped over records no reader gets."""
    after = _after(batch, offset)
    stated = (batch.schema.metadata or {}).get(FOLLOWING_KEY.encode())
    if stated is None:
        return after
    stated_after, stated_following = map(int, stated.split())
    # An empty read may have started further on than asked (retention dropped the head).
    ends_there = stated_after == after or (not batch.num_rows and stated_after > after)
    return max(after, stated_following) if ends_there else after


def _after(batch: pa.RecordBatch, offset: int) -> int:
    return batch.column("offset")[-1].as_py() + 1 if batch.num_rows else offset
