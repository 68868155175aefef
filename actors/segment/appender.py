"""How a segment actor takes appends, from Ray calls and data-plane frames alike.

A plain object, not actor methods: Ray wraps every actor method for tracing, a
cost the data plane would pay per frame. The frames of one read are stored
together (``SegmentLog.append_all``: one write, at most one flush), so the
cost per batch is mostly the copy of its bytes. Per producer, batches are
stored in sequence order: Ray may start pipelined calls out of order, and a
frame can arrive on a new connection before the old one's are stored, so a
batch that comes before its predecessor waits for its turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pyarrow as pa

from actors.metrics import SegmentMetrics
from actors.segment.txn_joins import TxnJoins
from runtime import wire
from runtime.batch import check_batch, deserialize_batch
from runtime.errors import OutOfOrderSequenceError, ScalableTopicsError, TransactionNotOpenError
from runtime.limits import LiveLimits
from runtime.names import SegmentName
from storage.appends import Append, AppendResult
from storage.segment_store import SegmentStore

SEQUENCE_WAIT_S = 30.0


class SegmentAppender:
    def __init__(
        self,
        name: SegmentName,
        store: SegmentStore,
        limits: LiveLimits,
        metrics: SegmentMetrics,
        on_appended: Callable[[], None],
        joins: TxnJoins,
    ) -> None:
        """``on_appended``: called after every stored group (wakes long-polling readers)."""
        self._name = name
        self._store = store
        self._limits = limits
        self._metrics = metrics
        self._on_appended = on_appended
        self._joins = joins
        self._turns: dict[str, asyncio.Event] = {}
        self._refused: dict[str, int] = {}  # per producer, the last sequence refused

    async def append(
        self,
        batch: pa.RecordBatch,
        producer_id: str | None,
        sequence: int | None,
        txn_id: str | None = None,
    ) -> tuple[int, int]:
        """A Ray call's append: (base offset, count), or the error that refused it."""
        await self._join(producer_id, sequence, txn_id)
        await self.await_turn(producer_id, sequence)
        append = Append(batch, producer_id, sequence, txn_id=txn_id)
        self._admit(append)
        (outcome,) = self._store_all([append])
        if isinstance(outcome, ScalableTopicsError):
            raise outcome
        return outcome.base_offset, outcome.count

    def append_frames(self, bodies: list[memoryview]) -> list[bytes]:
        """Responses to the longest prefix of ``bodies`` that can be stored now: the
        first frame left out (and so every later one) must wait for its turn, or is
        not an append (a read is answered after the appends before it, in order)."""
        responses: list[bytes | Append] = []  # an append stands for its answer until stored
        appends: list[Append] = []
        admitted: dict[str, int] = {}  # the last sequence of each producer in this group
        for body in bodies:
            if not wire.is_append(body):
                break
            try:
                producer_id, sequence, txn_id, payload = wire.decode_txn_append(body)
            except (ScalableTopicsError, ValueError) as err:
                responses.append(wire.encode_failure(err))
                continue
            if self._must_wait(producer_id, sequence, admitted):
                break
            if txn_id is not None and not self._joins.joined(txn_id):
                break  # joined first, parked (``append_parked``)
            try:
                batch = deserialize_batch(payload, restore_absent=False)
                append = Append(batch, producer_id, sequence, payload, txn_id)
            except (pa.ArrowException, ValueError) as err:
                self._refuse(producer_id, sequence)
                responses.append(wire.encode_failure(err))
                continue
            try:
                self._admit(append)
            except ScalableTopicsError as err:
                responses.append(wire.encode_failure(err))
                continue
            if sequence is not None:
                admitted[producer_id] = sequence
            appends.append(append)
            responses.append(append)
        try:
            outcomes = iter(self._store_all(appends))
        except ScalableTopicsError as err:  # the segment is gone: every frame hears why
            outcomes = iter([err] * len(appends))
        return [
            _answer(next(outcomes)) if isinstance(response, Append) else response
            for response in responses
        ]

    async def append_parked(self, body: bytes) -> bytes:
        """A frame that had to wait: its transaction's join, its turn, then its append."""
        try:
            producer_id, sequence, txn_id, _ = wire.decode_txn_append(body)
            await self._join(producer_id, sequence, txn_id)
            await self.await_turn(producer_id, sequence)
        except (ScalableTopicsError, ValueError) as err:
            return wire.encode_failure(err)
        responses = self.append_frames([memoryview(body)])
        if not responses:  # its transaction was decided here meanwhile (its marker came)
            self._refuse(producer_id, sequence)
            why = f"transaction {txn_id} ended here before this batch was stored"
            return wire.encode_failure(TransactionNotOpenError(why))
        return responses[0]

    async def _join(self, producer_id: str | None, sequence: int | None, txn: str | None) -> None:
        """Join the batch's transaction (``TxnJoins``); refused, its sequence is used up."""
        if txn is None:
            return
        try:
            await self._joins.ensure(txn)
        except ScalableTopicsError as err:
            self._metrics.rejected(err.code)
            self._refuse(producer_id, sequence)
            raise

    async def await_turn(self, producer_id: str | None, sequence: int | None) -> None:
        """Wait for the predecessor; a terminated segment ends the wait at once, since the
        predecessor will be refused too and the producer must re-route, not time out."""
        deadline = asyncio.get_running_loop().time() + SEQUENCE_WAIT_S
        while self._must_wait(producer_id, sequence, {}):
            remaining = deadline - asyncio.get_running_loop().time()
            turn = self._turns.setdefault(producer_id, asyncio.Event())
            try:
                await asyncio.wait_for(turn.wait(), timeout=max(remaining, 0))
            except TimeoutError:
                self._metrics.rejected(OutOfOrderSequenceError.code)
                raise OutOfOrderSequenceError(
                    f"{self._name}: batch {sequence} of producer {producer_id!r} waited "
                    f"{SEQUENCE_WAIT_S:.0f}s for batch "
                    f"{self._store.last_sequence(producer_id) + 1}, which never arrived"
                ) from None

    def release_turns(self) -> None:
        """Wake every waiting append so it re-checks (and sees the termination)."""
        for turn in self._turns.values():
            turn.set()
        self._turns.clear()

    def _must_wait(
        self, producer_id: str | None, sequence: int | None, admitted: dict[str, int]
    ) -> bool:
        if sequence is None or admitted.get(producer_id) == sequence - 1:
            return False  # the common case: the next in a group
        if producer_id is None or self._store.terminated:
            return False
        last = max(
            self._store.last_sequence(producer_id),
            self._refused.get(producer_id, -1),
            admitted.get(producer_id, -1),
        )
        return sequence > last + 1

    def _admit(self, append: Append) -> None:
        """Limits are checked before anything is written."""
        try:
            check_batch(self._limits.current, append.batch)
        except ScalableTopicsError as err:
            self._metrics.rejected(err.code)
            self._refuse(append.producer_id, append.sequence)
            raise

    def _refuse(self, producer_id: str | None, sequence: int | None) -> None:
        """A sequence refused before it was stored is used up: its producer learns the
        error, and the next sequence must not wait for a batch that never comes (it
        did, for 30 s, and failed with ``OutOfOrderSequenceError``, and so did every
        later one). Kept in memory only: once a later sequence is stored the log's own
        record covers the gap; a restart in between leaves the successor waiting."""
        if producer_id is None or sequence is None:
            return
        self._refused[producer_id] = max(self._refused.get(producer_id, -1), sequence)
        if producer_id in self._turns:
            self._turns.pop(producer_id).set()

    def _store_all(self, appends: list[Append]) -> list[AppendResult | ScalableTopicsError]:
        if not appends:
            return []
        started = time.perf_counter()
        outcomes = self._store.append_all(appends)
        latency_s = time.perf_counter() - started
        count = nbytes = 0
        for append, outcome in zip(appends, outcomes, strict=True):
            if isinstance(outcome, ScalableTopicsError):
                self._metrics.rejected(outcome.code)
            elif not outcome.duplicate:
                count += outcome.count
                nbytes += len(append.payload) if append.payload is not None else append.batch.nbytes
        if count:  # one record per group: the hot path stays cheap
            self._metrics.appended(count, nbytes, latency_s)
        if self._turns:  # the next sequence of a producer may be waiting for one of these
            for producer_id in self._turns.keys() & {append.producer_id for append in appends}:
                self._turns.pop(producer_id).set()
        self._on_appended()
        return outcomes


def _answer(outcome: AppendResult | ScalableTopicsError) -> bytes:
    if isinstance(outcome, ScalableTopicsError):
        return wire.encode_failure(outcome)
    return wire.encode_ok(outcome.base_offset, outcome.count)
