"""Transactions that readers must step over, for the tests of every kind of reader."""

from __future__ import annotations

from typing import Any


def commit_beside_an_abort(admin: Any, producer: Any, count: int) -> list[str]:
    """Send ``count`` plain messages, as many in a transaction that commits and as many in
    one that aborts, interleaved under four keys, and decide both (the abort's records
    then lie in the middle of each segment, the markers at its end); the committed
    values, sorted: what every reader must get."""
    kept, dropped = admin.new_transaction(), admin.new_transaction()
    for i in range(count):
        key = f"k{i % 4}"
        producer.send(f"plain-{i}".encode(), key=key)
        producer.send(f"kept-{i}".encode(), key=key, txn=kept)
        producer.send(f"dropped-{i}".encode(), key=key, txn=dropped)
    producer.flush()
    dropped.abort()
    kept.commit()
    return sorted(f"{kind}-{i}" for kind in ("plain", "kept") for i in range(count))
