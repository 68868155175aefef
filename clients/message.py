"""What producers return and consumers receive."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from runtime.batch import equal_runs


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

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.segment_id, self.offset)


def messages_from_delivery(segment_id: int, batch: pa.RecordBatch) -> list[Message]:
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
        strict=True,
    )
    return list(map(_new_message, columns))  # no Python frame per message, unlike _make


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_new_message = functools.partial(tuple.__new__, Message)  # rows of exactly Message's fields


def _publish_times(column: pa.Array) -> list[datetime]:
    """Millisecond timestamps as UTC datetimes, converted here rather than by
    ``to_pylist``: Arrow converts zoned timestamps through pandas, and importing it
    costs a consumer process half a second and ~300 modules.

    The stored batches of a delivery share a publish time each, so the list is built
    run by run (one datetime per run): 4 instead of 58 ns a message."""
    data = np.frombuffer(column.buffers()[1], dtype=np.int64)  # to_numpy imports pandas too
    millis = data[column.offset : column.offset + len(column)]
    times: list[datetime] = []
    for start, end in equal_runs(millis):
        times += [_EPOCH + timedelta(milliseconds=int(millis[start]))] * (end - start)
    return times
