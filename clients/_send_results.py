"""Where a producer's sends end: the futures its callers hold, and the chunks a bulk
send is cut into on its way to the segments (``clients.producer``).
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from clients.message import BatchResult, MessageId
from runtime.batch import (
    batch_bytes,
    equal_runs,
)

ROW_OVERHEAD = 64  # bytes charged per message on top of key and value


# --- where results go -------------------------------------------------------------


class SendFuture(concurrent.futures.Future):
    """A send's future that remembers whether its caller looked at the outcome
    (``result``, ``exception`` or a done-callback, which ``send_async`` uses): a
    failure nobody looked at is raised by the producer's ``close()`` instead of
    vanishing. The producer's own bookkeeping goes through ``_watch``, unseen."""

    def __init__(self) -> None:
        super().__init__()
        self.observed = False

    def result(self, timeout: float | None = None) -> Any:
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        self.observed = True
        super().add_done_callback(fn)

    def _watch(self, fn: Callable[[SendFuture], object]) -> None:
        super().add_done_callback(fn)  # type: ignore[arg-type]

    def _failure(self) -> BaseException | None:
        """The failure of a done future, without counting as looked at."""
        return super().exception(0)


class MessageSink:
    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future = SendFuture()

    def fill(self, positions: np.ndarray, segment_id: int, offsets: np.ndarray) -> None:
        if not self.future.done():
            self.future.set_result(MessageId(segment_id, int(offsets[0])))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class BulkSink:
    __slots__ = ("future", "segment_ids", "offsets", "remaining")

    def __init__(self, rows: int) -> None:
        self.future = SendFuture()
        self.segment_ids = np.full(rows, -1, dtype=np.int64)
        self.offsets = np.full(rows, -1, dtype=np.int64)
        self.remaining = rows

    def fill(self, positions: np.ndarray, segment_id: int, offsets: np.ndarray) -> None:
        self.segment_ids[positions] = segment_id
        self.offsets[positions] = offsets
        self.remaining -= len(positions)
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(BatchResult(self.segment_ids, self.offsets))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


_Sink = MessageSink | BulkSink


@dataclass
class Chunk:
    """Rows bound for one segment, and which sink/position each row reports to."""

    batch: pa.RecordBatch
    sinks: np.ndarray  # object array, one sink per row
    positions: np.ndarray
    uniform: bool = False  # every row reports to the same (bulk) sink
    txn: str | None = None  # the transaction its rows belong to: one append, one transaction

    @functools.cached_property
    def message_bytes(self) -> int:
        return batch_bytes(self.batch)

    @property
    def nbytes(self) -> int:
        return charge_of(self.batch)

    def resolve(self, segment_id: int, base_offset: int) -> None:
        """Each run of rows reporting to the same sink fills it in one call."""
        offsets = np.arange(base_offset, base_offset + self.batch.num_rows, dtype=np.int64)
        if self.uniform:
            self.sinks[0].fill(self.positions, segment_id, offsets)
            return
        for start, end in equal_runs(self.sinks):
            self.sinks[start].fill(self.positions[start:end], segment_id, offsets[start:end])

    def fail(self, error: BaseException) -> None:
        for sink in {id(s): s for s in self.sinks}.values():
            sink.fail(error)

    def take(self, rows: np.ndarray) -> Chunk:
        taken = self.batch.take(pa.array(rows))
        return Chunk(taken, self.sinks[rows], self.positions[rows], self.uniform, self.txn)

    @staticmethod
    def joined(chunks: list[Chunk]) -> Chunk:
        """One append instead of several (of one transaction, or none): their rows, in
        order, copied once."""
        first = chunks[0].sinks[0]
        uniform = all(c.uniform and c.sinks[0] is first for c in chunks)
        return Chunk(
            pa.concat_batches([c.batch for c in chunks]),
            np.concatenate([c.sinks for c in chunks]),
            np.concatenate([c.positions for c in chunks]),
            uniform,
            chunks[0].txn,
        )

    def slice(self, start: int, length: int) -> Chunk:
        """Rows ``start`` to ``start + length``, without copying them."""
        end = start + length
        sliced = self.batch.slice(start, length)
        return Chunk(
            sliced, self.sinks[start:end], self.positions[start:end], self.uniform, self.txn
        )


def charge_of(batch: pa.RecordBatch) -> int:
    """Bytes a batch holds against the in-flight budget (same rule as at submit).

    Additive over any split of the rows, so the chunks of a batch release
    exactly what the batch was charged; O(1), from the offsets of the columns.
    """
    return batch_bytes(batch) + ROW_OVERHEAD * batch.num_rows
