"""A transaction as its application holds it: an id, and the commit or abort that ends it.

``admin.new_transaction(timeout_s=...)`` begins one in the cluster's transaction
coordinator (``actors.admin.txn_service``); the segments that take its messages join it
themselves, so this object only carries its id. As a context manager it commits when
the block ends normally and aborts when it raises, as Pulsar's and Kafka's clients
recommend using theirs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from runtime.errors import InvalidArgumentError, TransactionNotOpenError


class _Coordinator(Protocol):
    def transaction_acknowledge(
        self, txn_id: str, segment_topic: str, subscription: str, offset: int, cumulative: bool
    ) -> dict[str, Any]: ...

    async def commit_transaction_async(self, txn_id: str) -> dict[str, Any]: ...

    async def abort_transaction_async(self, txn_id: str) -> dict[str, Any]: ...

    def commit_transaction(self, txn_id: str) -> dict[str, Any]: ...

    def abort_transaction(self, txn_id: str) -> dict[str, Any]: ...


class Transaction:
    def __init__(self, coordinator: _Coordinator, txn_id: str, deadline_ms: int) -> None:
        self._coordinator = coordinator
        self.id = txn_id
        self.deadline_ms = deadline_ms  # wall-clock ms after which it can only abort
        self._sends: list[concurrent.futures.Future] = []
        self._committed: list[Callable[[], None]] = []  # a consumer's own acks, once committed
        self._lock = threading.Lock()

    def commit(self) -> dict[str, Any]:
        """Wait for every send made in it, then commit; a send that failed aborts the
        transaction instead (``TransactionNotOpenError`` saying which), as Pulsar's
        commit fails once an operation of the transaction did."""
        self._raise_if_a_send_failed(self._settled_sends())
        return self._after_commit(self._coordinator.commit_transaction(self.id))

    def abort(self) -> dict[str, Any]:
        """Wait for the sends made in it, then abort: none of its messages is ever read.
        Its sends' own failures count as seen (the abort answers for them)."""
        _seen(self._settled_sends())
        return self._coordinator.abort_transaction(self.id)

    async def commit_async(self) -> dict[str, Any]:
        sends = await asyncio.to_thread(self._settled_sends)
        await self._raise_if_a_send_failed_async(sends)
        return self._after_commit(await self._coordinator.commit_transaction_async(self.id))

    async def abort_async(self) -> dict[str, Any]:
        _seen(await asyncio.to_thread(self._settled_sends))
        return await self._coordinator.abort_transaction_async(self.id)

    def _acknowledge(
        self,
        segment: str,
        subscription: str,
        offset: int,
        cumulative: bool,
        on_commit: Callable[[], None],
    ) -> None:
        """A consumer's acknowledgement in this transaction: recorded by the coordinator
        now, applied by it on commit; ``on_commit`` tells the consumer afterwards."""
        self._coordinator.transaction_acknowledge(
            self.id, segment, subscription, offset, cumulative
        )
        with self._lock:
            self._committed.append(on_commit)

    def _after_commit(self, shown: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            hooks, self._committed = self._committed, []
        for hook in hooks:
            hook()
        return shown

    def _sent(self, future: concurrent.futures.Future) -> None:
        """A producer's send of this transaction (``Producer.send(..., txn=)``)."""
        with self._lock:
            self._sends.append(future)

    def _settled_sends(self) -> list[concurrent.futures.Future]:
        with self._lock:
            sends = list(self._sends)
        concurrent.futures.wait(sends)
        return sends

    def _failed_send(self, sends: list[concurrent.futures.Future]) -> BaseException | None:
        return next((f.exception() for f in sends if f.exception() is not None), None)

    def _raise_if_a_send_failed(self, sends: list[concurrent.futures.Future]) -> None:
        failure = self._failed_send(sends)
        if failure is not None:
            self.abort()
            raise self._not_committed(failure)

    async def _raise_if_a_send_failed_async(self, sends: list[concurrent.futures.Future]) -> None:
        failure = self._failed_send(sends)
        if failure is not None:
            await self.abort_async()
            raise self._not_committed(failure)

    def _not_committed(self, failure: BaseException) -> TransactionNotOpenError:
        return TransactionNotOpenError(
            f"transaction {self.id} is aborted, not committed: a send of it failed "
            f"({type(failure).__name__}: {failure})"
        )

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


def _seen(sends: list[concurrent.futures.Future]) -> None:
    for future in sends:
        future.exception()  # a producer's close then does not raise it as unseen


def _transaction_id(txn: Transaction | None) -> str | None:
    """The id a send carries for ``txn``; anything but a ``Transaction`` is refused."""
    if txn is None:
        return None
    if not isinstance(txn, Transaction):
        raise InvalidArgumentError(
            f"txn must be a Transaction (admin.new_transaction()), got {type(txn).__name__}"
        )
    return txn.id
