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
import logging

from actors.registry import ADMIN_SERVICE, lookup
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

    def joined(self, txn_id: str) -> bool:
        """Whether this segment is known to be joined to ``txn_id`` (no wait needed)."""
        joining = self._joins.get(txn_id)
        return joining is not None and joining.done() and joining.exception() is None

    def forget(self, txn_id: str) -> None:
        """``txn_id`` is decided here (its marker is stored): nothing joins it again."""
        self._joins.pop(txn_id, None)


def ask_for_sweep(credential: str) -> None:
    """Have the transaction coordinator's sweeper run: this segment opened holding a
    transaction not decided here yet, and after a restart of Ray no client may ever
    finish it (its readers would wait at it for good). Not waited for. The admin service
    is found by name: Ray brings it back with the cluster (it is detached), and it
    began every transaction there is."""
    try:
        lookup(ADMIN_SERVICE).sweep_transactions.remote(credential=credential)
    except Exception:  # noqa: BLE001 - the next opening, or any client's call, asks again
        logging.getLogger(__name__).warning("could not ask for a transaction sweep", exc_info=True)
