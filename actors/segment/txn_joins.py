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
import time

from actors.registry import ADMIN_SERVICE, lookup
from runtime.remote import call
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


# How long a segment keeps asking for a sweep while the admin service is not back yet.
SWEEP_ASK_S = 300.0
_asking: set[asyncio.Task] = set()  # kept referenced until done


def ask_for_sweep(credential: str) -> None:
    """Have the transaction coordinator's sweeper run: this segment opened holding a
    transaction not decided here yet, and after a restart of Ray no client may ever
    finish it (its readers would wait at it for good). Not waited for: asked in the
    background, again each second while the admin service is not back (Ray restores it
    with the cluster, as it is detached, but maybe after this segment). The service is
    found by name, and it began every transaction there is."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # opened outside an event loop: one attempt
        loop = asyncio.new_event_loop()
        loop.run_until_complete(_keep_asking(credential, 0.0))
        loop.close()
        return
    task = loop.create_task(_keep_asking(credential, SWEEP_ASK_S))
    _asking.add(task)
    task.add_done_callback(_asking.discard)


async def _keep_asking(credential: str, for_s: float) -> None:
    deadline = time.monotonic() + for_s
    while True:
        try:
            await call(lookup(ADMIN_SERVICE).sweep_transactions.remote(credential=credential))
            return
        except Exception:  # noqa: BLE001 - not back yet, or restarting: asked again
            if time.monotonic() >= deadline:
                logging.getLogger(__name__).warning(
                    "could not ask for a transaction sweep", exc_info=True
                )
                return
            await asyncio.sleep(1.0)
