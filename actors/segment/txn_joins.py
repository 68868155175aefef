"""A segment joins a transaction before it stores the transaction's first batch.

Whoever finishes a transaction writes its marker to every segment its record names
(``actors.admin.txn_service``), so a segment holding a batch of it must be named there
first. The segment records itself (``runtime.transactions.Join``, a compare-and-swap on
the record) rather than trusting its producer to, as Kafka's brokers came to verify
partitions on a transaction's first write: a client that skipped the step would
otherwise leave batches no marker ever reaches, holding every reader of the segment at
them. A transaction that is no longer open refuses the join, and so the batch.

Who calls: the segment's append, for a batch of a transaction. What it affects: the
transaction's record; joins are remembered for the life of the process (a join is
idempotent, so a restart only repeats one).
"""

from __future__ import annotations

import asyncio

from runtime.transactions import Join, SegmentRef
from storage.metadata import MetadataStore
from storage.transactions import Transactions


class TxnJoins:
    def __init__(self, segment: str, store: MetadataStore) -> None:
        self._join = Join(frozenset({SegmentRef(segment)}))
        self._transactions = Transactions(store)
        self._joins: dict[str, asyncio.Future[None]] = {}  # txn id → its join, done or going

    async def ensure(self, txn_id: str) -> None:
        """Return once this segment is joined to ``txn_id``; ``TransactionNotOpenError``
        or ``TransactionNotFoundError`` when it cannot be (then asked again next time)."""
        joining = self._joins.get(txn_id)
        if joining is None:
            joining = self._joins[txn_id] = asyncio.ensure_future(
                asyncio.to_thread(self._transactions.change, txn_id, self._join)
            )
        try:
            await asyncio.shield(joining)
        except Exception:
            if self._joins.get(txn_id) is joining:
                del self._joins[txn_id]
            raise

    def forget(self, txn_id: str) -> None:
        """``txn_id`` is decided here (its marker is stored): nothing joins it again."""
        self._joins.pop(txn_id, None)
