"""What an append is, what it returns, and how a segment tells a producer's retry from
a new message (its window of recent sequences).

Producers retry blindly: a resent ``(producer_id, sequence)`` must get the offsets
it got the first time, not be stored twice. Each producer's last
``PRODUCER_WINDOW`` sequences are remembered with where they went; a retry older
than that cannot be told apart from a new message and is refused instead.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import pyarrow as pa

from runtime.batch import BATCH_SCHEMA, VALUES_SCHEMA, serialize_batch
from runtime.errors import InvalidArgumentError, ScalableTopicsError
from runtime.names import is_valid_part
from storage.frames import MAX_PRODUCER_ID

PRODUCER_WINDOW = 1000


class Append(NamedTuple):
    """One batch to store; ``payload``: its Arrow IPC bytes, when the caller has them;
    ``txn_id``: the transaction it belongs to (``runtime.transactions``), if any."""

    batch: pa.RecordBatch
    producer_id: str | None = None
    sequence: int | None = None
    payload: bytes | memoryview | None = None
    txn_id: str | None = None


class AppendResult(NamedTuple):
    base_offset: int
    count: int
    duplicate: bool = False


@dataclass(frozen=True)
class StoredBatch:
    """Records as read back, with the metadata their producer attached.

    ``base_offset`` is the offset of ``records[0]``, which can lie inside the
    batch as originally appended when a read starts mid-batch.
    """

    base_offset: int
    publish_time_ms: int
    producer_id: str | None
    sequence: int | None
    records: pa.RecordBatch


class Placed(Protocol):
    """Where a stored batch went (the log's index entry for it)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def count(self) -> int: ...


class ProducerWindow:
    """The recent sequences of one producer, so that retries are answered, not re-stored."""

    def __init__(self) -> None:
        self.last_sequence = -1
        # Ordered: the oldest goes in O(1). A plain dict's first key is found by
        # scanning past the slots its deletes left, a cost ``perf`` saw per append.
        self.results: OrderedDict[int, Placed] = OrderedDict()

    def remember(self, sequence: int, stored: Placed) -> None:
        """``stored``: where ``sequence`` went, what a retry of it is answered."""
        self.results[sequence] = stored
        if sequence > self.last_sequence:
            self.last_sequence = sequence
        if len(self.results) > PRODUCER_WINDOW:
            self.results.popitem(last=False)

    def check(self, producer_id: str, sequence: int) -> AppendResult | None:
        """The original result for a retried sequence, None for a new one."""
        if sequence > self.last_sequence:
            return None
        stored = self.results.get(sequence)
        if stored is not None:
            return AppendResult(stored.base_offset, stored.count, duplicate=True)
        oldest = next(iter(self.results))
        if sequence < oldest:
            raise InvalidArgumentError(
                f"sequence {sequence} of producer {producer_id!r} is older than the "
                f"retained window (oldest {oldest}); it cannot be checked for duplicates"
            )
        raise InvalidArgumentError(
            f"sequence {sequence} of producer {producer_id!r} is out of order: "
            f"{self.last_sequence} was already stored and {sequence} never was"
        )


def checked(append: Append) -> Append | ScalableTopicsError:
    """The append with its payload (a batch given without one is encoded here), or why
    it is refused."""
    try:
        _check_arguments(append.batch, append.producer_id, append.sequence)
        if append.txn_id is not None:
            _check_transaction(append.txn_id, append.producer_id)
    except ScalableTopicsError as err:
        return err
    if append.payload is None:
        return append._replace(payload=serialize_batch(append.batch))
    return append


def _check_arguments(batch: pa.RecordBatch, producer_id: str | None, sequence: int | None) -> None:
    if not isinstance(batch, pa.RecordBatch) or not (
        batch.schema.equals(BATCH_SCHEMA) or batch.schema.equals(VALUES_SCHEMA)
    ):
        raise InvalidArgumentError(
            "append needs a pyarrow.RecordBatch in BATCH_SCHEMA (or VALUES_SCHEMA, as a "
            "batch without keys and properties is stored)"
        )
    if batch.num_rows == 0:
        raise InvalidArgumentError("append refused: the batch is empty")
    if producer_id is not None and not (
        isinstance(producer_id, str) and 0 < len(producer_id.encode()) <= MAX_PRODUCER_ID
    ):
        raise InvalidArgumentError(
            f"producer_id must be 1-{MAX_PRODUCER_ID} bytes of UTF-8, got {producer_id!r}"
        )
    if sequence is not None and (producer_id is None or sequence < 0):
        raise InvalidArgumentError(
            f"sequence {sequence} needs a producer_id and must be >= 0: "
            "duplicates are detected per producer"
        )


def _check_transaction(txn_id: str, producer_id: str | None) -> None:
    """A transaction id is a name part (never a ``/``: ``storage.frames`` joins it to the
    producer id with one), and the two fit a frame's producer field."""
    if not is_valid_part(txn_id):
        raise InvalidArgumentError(f"invalid transaction id {txn_id!r}")
    if len(f"{txn_id}/{producer_id or ''}".encode()) > MAX_PRODUCER_ID:
        raise InvalidArgumentError(
            f"producer_id and transaction id together exceed {MAX_PRODUCER_ID} bytes"
        )
