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
    """Unpack a segment's delivery batch (``storage.segment_store.DELIVERY_SCHEMA``)."""
    columns = batch.to_pydict()
    return [
        Message(
            key=key,
            value=value,
            segment_id=segment_id,
            offset=offset,
            publish_time=published,
            properties=dict(props) if props else {},
        )
        for key, value, props, offset, published in zip(
            columns["key"],
            columns["value"],
            columns["properties"],
            columns["offset"],
            columns["publish_time"],
            strict=True,
        )
    ]
