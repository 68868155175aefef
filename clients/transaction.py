"""A transaction as its application holds it: an id, and the commit or abort that ends it.

``admin.new_transaction(timeout_s=...)`` begins one in the cluster's transaction
coordinator (``actors.admin.txn_service``); the segments that take its messages join it
themselves, so this object only carries its id. As a context manager it commits when
the block ends normally and aborts when it raises, as Pulsar's and Kafka's clients
recommend using theirs.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol


class _Coordinator(Protocol):
    async def commit_transaction_async(self, txn_id: str) -> dict[str, Any]: ...

    async def abort_transaction_async(self, txn_id: str) -> dict[str, Any]: ...

    def commit_transaction(self, txn_id: str) -> dict[str, Any]: ...

    def abort_transaction(self, txn_id: str) -> dict[str, Any]: ...


class Transaction:
    def __init__(self, coordinator: _Coordinator, txn_id: str, deadline_ms: int) -> None:
        self._coordinator = coordinator
        self.id = txn_id
        self.deadline_ms = deadline_ms  # wall-clock ms after which it can only abort

    def commit(self) -> dict[str, Any]:
        return self._coordinator.commit_transaction(self.id)

    def abort(self) -> dict[str, Any]:
        return self._coordinator.abort_transaction(self.id)

    async def commit_async(self) -> dict[str, Any]:
        return await self._coordinator.commit_transaction_async(self.id)

    async def abort_async(self) -> dict[str, Any]:
        return await self._coordinator.abort_transaction_async(self.id)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"Transaction({self.id!r})"
