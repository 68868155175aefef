"""Messages handed from a client's event loop to application threads, a batch at a time.

A consumer's readers run on the client's event loop and the application
receives on its own threads. Handing messages over one by one through a
``queue.Queue`` costs two lock round trips per message — more than unpacking
it — so readers hand over whole batches and receivers take from the batch at
hand.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    def __init__(self) -> None:
        self._batches: queue.Queue[list[T]] = queue.Queue()
        self._at_hand: deque[T] = deque()
        self._taking = threading.Lock()
        self._counting = threading.Lock()
        self._count = 0

    def __len__(self) -> int:
        """Messages handed over and not yet taken: what readers throttle on."""
        return self._count

    def put(self, items: list[T]) -> None:
        """Any thread; the items are taken in this order, after earlier batches."""
        if items:
            with self._counting:
                self._count += len(items)
            self._batches.put(items)

    def get(self, timeout_s: float | None) -> T | None:
        """The next item, waiting up to ``timeout_s`` (``None``: forever); ``None`` if none."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._taking:
            if not self._at_hand:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    self._at_hand.extend(self._batches.get(timeout=remaining))
                except queue.Empty:
                    return None
            with self._counting:
                self._count -= 1
            return self._at_hand.popleft()
