"""The consumers' inbox: batches in, runs of at most N items out, in order, with tags."""

from __future__ import annotations

import asyncio
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients._inbox import Inbox

batches = st.lists(st.lists(st.integers(), min_size=1, max_size=30), max_size=10)
takes = st.lists(st.integers(1, 40), min_size=1, max_size=30)


@given(batches, takes)
def test_runs_come_out_in_order_with_their_tags_and_never_too_many(
    put: list[list[int]], sizes: list[int]
) -> None:
    inbox: Inbox[list[int]] = Inbox()
    for tag, items in enumerate(put):
        inbox.put(items, tag)
    expected = [(tag, item) for tag, items in enumerate(put) for item in items]
    got: list[tuple[int, int]] = []
    for size in [*sizes, 10**6]:
        runs = inbox.get_batches(size, 0)
        assert sum(len(run) for _, run in runs) <= size
        got += [(tag, item) for tag, run in runs for item in run]
        assert len(inbox) == len(expected) - len(got)
    assert got == expected
    assert inbox.get(0) is None and inbox.get_batches(5, 0.01) == []


def test_arrow_batches_are_sliced_without_unpacking() -> None:
    inbox: Inbox[pa.RecordBatch] = Inbox()
    inbox.put(pa.RecordBatch.from_pydict({"offset": list(range(10))}), "reader")
    first, rest = inbox.get_batches(4, 0), inbox.get_batches(100, 0)
    assert [(tag, run.column("offset").to_pylist()) for tag, run in first + rest] == [
        ("reader", [0, 1, 2, 3]),
        ("reader", [4, 5, 6, 7, 8, 9]),
    ]


def test_a_waiting_receiver_wakes_when_a_batch_arrives() -> None:
    inbox: Inbox[list[str]] = Inbox()
    threading.Timer(0.05, inbox.put, args=(["a", "b"],)).start()
    assert inbox.get_batches(10, timeout_s=5) == [(None, ["a", "b"])]


def test_a_failure_comes_after_what_was_handed_over_and_wakes_a_waiter() -> None:
    inbox: Inbox[list[str]] = Inbox()
    inbox.put(["a", "b"])
    inbox.fail(PermissionError("refused"))
    inbox.fail(PermissionError("a later failure is not the one reported"))
    assert inbox.get_batches(10, 0) == [(None, ["a", "b"])]
    for _ in range(2):  # every later take raises it
        with pytest.raises(PermissionError, match="^refused$"):
            inbox.get_batches(10, 0)
    waiting: Inbox[list[str]] = Inbox()
    threading.Timer(0.05, waiting.fail, args=(PermissionError("revoked"),)).start()
    with pytest.raises(PermissionError, match="revoked"):
        waiting.get(timeout_s=5)


def _waiting_reader(inbox: Inbox[list[int]], limit: int) -> tuple[threading.Thread, list[float]]:
    """A reader on an event loop of its own waiting for room (``look_s`` far beyond the
    test, so only a wake-up ends the wait); how long it waited, once it returned."""
    waited: list[float] = []

    def run() -> None:
        started = time.monotonic()
        asyncio.run(inbox.wait_for_room(limit, look_s=60))
        waited.append(time.monotonic() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, waited


def test_a_reader_waiting_for_room_is_woken_by_the_take_that_makes_it() -> None:
    inbox: Inbox[list[int]] = Inbox()
    inbox.put(list(range(10)))
    thread, waited = _waiting_reader(inbox, limit=5)
    time.sleep(0.2)
    inbox.get_batches(5, 0)  # 5 left: still not under the limit
    thread.join(0.3)
    assert thread.is_alive() and not waited
    inbox.get_batches(1, 0)  # 4 left
    thread.join(5)
    assert waited and waited[0] < 5, waited


def test_a_failed_inbox_wakes_a_reader_waiting_for_room() -> None:
    inbox: Inbox[list[int]] = Inbox()
    inbox.put([1, 2, 3])
    thread, waited = _waiting_reader(inbox, limit=1)
    time.sleep(0.2)
    inbox.fail(PermissionError("refused"))
    thread.join(5)
    assert waited and waited[0] < 5, waited


def test_room_already_there_does_not_wait() -> None:
    inbox: Inbox[list[int]] = Inbox()
    inbox.put([1])
    asyncio.run(asyncio.wait_for(inbox.wait_for_room(2, look_s=60), 1))
