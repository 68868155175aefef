"""What producers return and consumers receive."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa


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


@dataclass(frozen=True)
class Message:
    key: str | None
    value: bytes
    segment_id: int
    offset: int
    publish_time: datetime
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.segment_id, self.offset)


def messages_from_delivery(segment_id: int, batch: pa.RecordBatch) -> list[Message]:
    """Unpack a segment's delivery batch (``storage.segment_store.DELIVERY_SCHEMA``).

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
    return [
        Message(key, value, segment_id, offset, published, prop)
        for key, value, offset, published, prop in zip(
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            batch.column("offset").to_pylist(),
            _publish_times(batch.column("publish_time")),
            props,
            strict=True,
        )
    ]


def _publish_times(column: pa.Array) -> list[datetime]:
    millis = column.cast(pa.int64())
    distinct = millis.unique()
    as_datetime = dict(
        zip(distinct.to_pylist(), distinct.cast(column.type).to_pylist(), strict=True)
    )
    return [as_datetime[ms] for ms in millis.to_pylist()]
