"""Messages handed from a client's event loop to application threads, a batch at a time.

A consumer's readers run on the client's event loop and the application
receives on its own threads. Handing messages over one by one through a
``queue.Queue`` costs two lock round trips per message — more than unpacking
it — so readers hand over whole batches and receivers take slices of them.

Each batch carries a tag (the reader it came from), and a stream consumer hands
over its segment's Arrow delivery batches as they came, so the receiving thread
unpacks only what it takes. Messages then live only in the application's hands,
not for the whole time they wait here: fewer of them survive two young garbage
collections into the oldest generation, whose full collections stall delivery
(bench/README.md, "Design measurements").
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections import deque
from typing import Any, Generic, TypeVar

# What readers hand over: a list of messages, or an Arrow RecordBatch of them (sliced
# and unpacked by the receiving thread); anything with a length that slices.
C = TypeVar("C")
_FAILED = object()  # the tag of the marker that ``fail`` hands over
_inboxes: weakref.WeakSet[Inbox] = weakref.WeakSet()  # every consumer's, while it lives


def fail_every_inbox(error: Exception) -> None:
    """Every consumer's receives raise ``error`` from now on: the loop that fed them is
    stopped (``clients._loop``), and a receive waiting on it would wait for nothing."""
    for inbox in list(_inboxes):
        inbox.fail(error)


class Inbox(Generic[C]):
    def __init__(self) -> None:
        _inboxes.add(self)
        self._batches: queue.Queue[tuple[Any, C]] = queue.Queue()
        self._at_hand: deque[list[Any]] = deque()  # [tag, items, first not yet taken]
        self._taking = threading.Lock()
        self._counting = threading.Lock()
        self._count = 0
        self._error: Exception | None = None
        # Readers waiting for room (``wait_for_room``): their loop, the event a take sets
        # once fewer than ``limit`` wait, and the limit. Guarded by ``_counting``.
        self._room: tuple[asyncio.AbstractEventLoop, asyncio.Event, int] | None = None

    def __len__(self) -> int:
        """Messages handed over and not yet taken: what readers throttle on."""
        return self._count

    def put(self, items: C, tag: Any = None) -> None:
        """Any thread; the items are taken in this order, after earlier batches."""
        if items:
            with self._counting:
                self._count += len(items)
            self._batches.put((tag, items))

    def fail(self, error: Exception) -> None:
        """Any thread: receivers get what was handed over before, then every take
        raises ``error`` (a waiting one wakes for it, and so do readers waiting for room)."""
        if self._error is None:
            self._error = error
            self._batches.put((_FAILED, ()))
            with self._counting:
                self._wake_readers()

    async def wait_for_room(self, limit: int, look_s: float = 1.0) -> None:
        """On the readers' event loop: return once fewer than ``limit`` messages wait here
        (a reader's throttle while the application is slower than its segments), or the
        inbox failed. The take that makes room wakes it, so a full inbox costs its readers
        nothing while they wait; they look again every ``look_s`` all the same (a reader
        whose consumer closes meanwhile)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._counting:
                if self._count < limit or self._error is not None:
                    return
                if self._room is None or self._room[1].is_set():
                    self._room = (loop, asyncio.Event(), limit)
                event = self._room[1]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), look_s)

    def _wake_readers(self) -> None:
        """With ``_counting`` held: wake the readers waiting for room, if any."""
        if self._room is not None:
            loop, event, _ = self._room
            self._room = None
            with contextlib.suppress(RuntimeError):  # their loop is closed: nobody waits
                loop.call_soon_threadsafe(event.set)

    def get(self, timeout_s: float | None) -> Any:
        """The next item of an inbox of lists, waiting up to ``timeout_s`` (``None``:
        forever); ``None`` if none."""
        taken = self.get_batches(1, timeout_s)
        return taken[0][1][0] if taken else None

    def get_batches(self, max_items: int, timeout_s: float | None) -> list[tuple[Any, C]]:
        """Up to ``max_items`` in order, as ``(tag, items)`` runs, waiting up to
        ``timeout_s`` for the first (``None``: forever), then taking only what was
        already handed over; ``[]`` if none came. One lock round trip for the lot. Raises
        the error of ``fail`` once everything handed over before it is taken."""
        with self._taking:
            at_hand = self._at_hand
            if not at_hand:
                try:
                    at_hand.append([*self._batches.get(timeout=timeout_s), 0])
                except queue.Empty:
                    return []
            taken: list[tuple[Any, C]] = []
            room = max_items
            while room:
                if not at_hand:
                    try:
                        at_hand.append([*self._batches.get_nowait(), 0])
                    except queue.Empty:
                        break
                entry = at_hand[0]
                tag, items, first = entry
                if tag is _FAILED:  # stays at hand: every later take raises too
                    if taken:
                        break
                    raise self._error
                whole = first == 0 and len(items) <= room
                run = items if whole else items[first : first + room]  # no copy when whole
                entry[2] = first + len(run)
                if entry[2] == len(items):
                    at_hand.popleft()
                taken.append((tag, run))
                room -= len(run)
            with self._counting:
                self._count -= max_items - room
                if self._room is not None and self._count < self._room[2]:
                    self._wake_readers()
            return taken
