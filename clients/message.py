"""What producers return and consumers receive."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from runtime.batch import DELIVERY_SCHEMA, REDELIVERIES_KEY, equal_runs, int64_array, int64_values
from runtime.errors import InvalidArgumentError


@dataclass(frozen=True, order=True)
class MessageId:
    """Where a message is stored: its segment and its offset there."""

    segment_id: int
    offset: int


@dataclass(frozen=True)
class BatchResult:
    """Message ids of a ``send_batch`` call, in input order, as two columns."""

    segment_ids: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    def ids(self) -> list[MessageId]:
        return [
            MessageId(int(s), int(o)) for s, o in zip(self.segment_ids, self.offsets, strict=True)
        ]


class Message(NamedTuple):
    """A received message. A named tuple, like kafka-python's ``ConsumerRecord``: a
    consumer builds tens of thousands a second, and a frozen dataclass costs about
    three times as much to build (each field goes through ``object.__setattr__``)."""

    key: str | None
    value: bytes
    segment_id: int
    offset: int
    publish_time: datetime
    properties: dict[str, str]
    # How many times a queue subscription delivered it before (stream and checkpoint
    # consumers read in order and get each message once: always 0 there).
    redelivery_count: int = 0
    # The topic it was read from (``topic://tenant/namespace/topic``).
    topic: str | None = None

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.segment_id, self.offset)


def messages_from_delivery(
    segment_id: int, batch: pa.RecordBatch, topic: str | None = None
) -> list[Message]:
    """Unpack a segment's delivery batch (``runtime.batch.DELIVERY_SCHEMA``).

    Column by column, not row by row: converting each row's timestamp costs more
    than the rest of the message, and a delivery batch holds only a few distinct
    publish times (one per stored batch), so each is converted once.
    """
    count = batch.num_rows
    properties = batch.column("properties")
    props = (
        [dict(p) if p else {} for p in properties.to_pylist()]
        if properties.null_count < count
        else [{} for _ in range(count)]
    )
    columns = zip(
        batch.column("key").to_pylist(),
        batch.column("value").to_pylist(),
        repeat(segment_id, count),
        batch.column("offset").to_pylist(),
        _publish_times(batch.column("publish_time")),
        props,
        _redeliveries(batch),
        repeat(topic, count),
        strict=True,
    )
    return list(map(_new_message, columns))  # no Python frame per message, unlike _make


def _redeliveries(batch: pa.RecordBatch) -> Iterable[int]:
    """Each row's earlier deliveries, from a queue delivery's metadata (none listed: 0)."""
    listed = (batch.schema.metadata or {}).get(REDELIVERIES_KEY.encode())
    if listed is None:
        return repeat(0, batch.num_rows)
    counts = {int(offset): n for offset, n in json.loads(listed).items()}
    return [counts.get(offset, 0) for offset in batch.column("offset").to_pylist()]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_new_message = functools.partial(tuple.__new__, Message)  # rows of exactly Message's fields


def _publish_times(column: pa.Array) -> list[datetime]:
    """Millisecond timestamps as UTC datetimes, converted here rather than by
    ``to_pylist``: Arrow converts zoned timestamps through pandas, and importing it
    costs a consumer process half a second and ~300 modules.

    The stored batches of a delivery share a publish time each, so the list is built
    run by run (one datetime per run): 4 instead of 58 ns a message."""
    millis = int64_values(column)
    times: list[datetime] = []
    for start, end in equal_runs(millis):
        times += [_EPOCH + timedelta(milliseconds=int(millis[start]))] * (end - start)
    return times


# What ``receive_table`` returns: each message's segment, then the delivery's columns.
RECEIVED_SCHEMA = pa.schema([("segment_id", pa.int64()), *DELIVERY_SCHEMA])


def table_from_deliveries(runs: list[tuple[int, pa.RecordBatch]]) -> pa.Table:
    """Segments' delivery batches as one table, without a Python object per message:
    the columnar counterpart of ``messages_from_delivery``, as ``send_batch`` is of
    ``send``. Each run stays a chunk of its own (no copy)."""
    batches = [
        pa.RecordBatch.from_arrays(
            [int64_array(np.full(run.num_rows, segment_id, np.int64), pa.int64()), *run.columns],
            schema=RECEIVED_SCHEMA,
        )
        for segment_id, run in runs
    ]
    return pa.Table.from_batches(batches, schema=RECEIVED_SCHEMA)


def highest_offsets(table: pa.Table | pa.RecordBatch) -> dict[int, int]:
    """The highest offset per segment of a received table (any rows of it, in any order)."""
    columns = []
    for name in ("segment_id", "offset"):
        if name not in table.schema.names or table.schema.field(name).type != pa.int64():
            raise InvalidArgumentError(
                f"acknowledge_cumulative takes a table from receive_table: it needs int64 "
                f"'segment_id' and 'offset' columns, got schema {table.schema}"
            )
        column = table.column(name)
        if column.null_count:
            raise InvalidArgumentError(f"acknowledge_cumulative: '{name}' has nulls")
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        columns.append(np.concatenate([int64_values(c) for c in chunks] or [np.zeros(0, int)]))
    segments, offsets = columns
    order = np.lexsort((offsets, segments))  # by segment, then offset: each one's highest last
    segments, offsets = segments[order], offsets[order]
    last = np.flatnonzero(np.append(segments[1:] != segments[:-1], True)) if len(order) else order
    return dict(zip(segments[last].tolist(), offsets[last].tolist(), strict=True))
