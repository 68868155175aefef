"""A stream consumer's reader of a sealed segment rides out the segment's failover while
it reports the segment finished, and while it opens a segment (``clients._group_core``
against a stand-in coordinator and segment: no Ray). Giving up there left the segment
assigned and never finished, so its children were never read."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa

from clients import _group_core as group_core
from clients._group_core import ConsumerConfig, GroupConsumerCore
from clients._segment_reader import SegmentReader
from runtime.errors import ConflictError, NotLeaderError, UnavailableError
from runtime.names import TopicName

TOPIC = TopicName("acme", "orders", "events")
SEGMENT = TOPIC.segment(0, 0, 0x7FFF)


class Gone(Exception):
    """What the consumer's transport raises while an actor restarts."""


class Access:
    """The coordinator and the segment, failing ``failures`` times first."""

    restarting = (Gone,)

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.finished_calls: list[tuple[int, int | None]] = []
        self.released: list[tuple[int, int | None]] = []

    def _maybe_fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    async def finished(self, consumer: str, segment_id: int, position: int | None) -> None:
        self._maybe_fail()
        self.finished_calls.append((segment_id, position))

    async def release(self, consumer: str, segment_id: int, position: int | None) -> None:
        self._maybe_fail()
        self.released.append((segment_id, position))

    async def ack_cumulative(self, handle: Any, name: Any, offset: int) -> None:
        return None

    async def find(self, name: Any) -> Any:
        return "handle"

    async def find_again(self, name: Any) -> Any:
        return "handle"

    async def position(self, handle: Any, name: Any) -> int:
        self._maybe_fail()
        return 7


def core(access: Access) -> GroupConsumerCore:
    return GroupConsumerCore(
        TOPIC, "s", "c1", acknowledges=True, config=ConsumerConfig(),
        credential=None, access=access,  # type: ignore[arg-type]
    )  # fmt: skip


def test_finishing_a_segment_is_asked_again_through_its_leader_s_failover() -> None:
    failures = [NotLeaderError("moved"), UnavailableError("away"), ConflictError("not yet")]
    access = Access(failures)
    consumer = core(access)

    async def scenario() -> None:
        reader = SegmentReader(SEGMENT, None, 10, None)
        reader.end = reader.acked = reader.delivered = reader.flushed = 10
        consumer.readers[0] = reader
        await asyncio.wait_for(consumer._finish_when_settled(reader), 10)

    asyncio.run(scenario())
    assert access.finished_calls == [(0, 10)] and consumer.finished == {0}
    assert 0 not in consumer.readers


def test_opening_a_segment_waits_for_its_host_placed_again() -> None:
    access = Access([Gone("its node is gone"), NotLeaderError("moved")])
    consumer = core(access)
    handle, position = asyncio.run(consumer._open_at(SEGMENT, None))
    assert (handle, position) == ("handle", 7)


def test_a_segment_being_taken_back_that_was_never_read_here_is_released_at_once() -> None:
    """The coordinator's answer lists the segments it takes back from this consumer
    (``releasing``): one it reads is released by its reader once what it delivered is
    acknowledged; one it never read (an answer that carried it was lost) at once, with no
    position, as nothing was delivered from it."""
    access = Access([])
    consumer = core(access)
    consumer.readers[0] = SegmentReader(SEGMENT, None, 10, None)
    assignment = {"version": 4, "layoutEpoch": 1, "segments": [], "releasing": [0, 1]}

    async def scenario() -> None:
        await consumer._apply(assignment)
        assert (1, None) in access.released
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    # each once: segment 0 by its reader, which gave it up itself
    assert sorted(access.released) == [(0, None), (1, None)] and consumer.version == 4


def test_a_run_taken_as_its_segment_is_taken_back_is_acknowledged_before_the_release(
    monkeypatch,
) -> None:
    """The application's thread takes a run of a segment while the loop takes the segment
    back: the release waits until that run is acknowledged. A release before (the run
    counted as not delivered yet) lets the segment's next owner read the same messages."""
    access = Access([])
    consumer = core(access)
    reader = SegmentReader(SEGMENT, None, 10, None)
    consumer.readers[0] = reader
    consumer.messages.put(pa.RecordBatch.from_pydict({"offset": [10, 11, 12]}), reader)
    inside, go_on = threading.Event(), threading.Event()
    after = group_core._after

    def slowly_after(run: pa.RecordBatch) -> int:  # the thread mid-way through its take
        inside.set()
        go_on.wait(10)
        return after(run)

    monkeypatch.setattr(group_core, "_after", slowly_after)
    taken: list = []
    taker = threading.Thread(target=lambda: taken.extend(consumer.take(10, 5.0)))
    taker.start()
    assert inside.wait(10)

    async def scenario() -> list:
        threading.Timer(0.3, go_on.set).start()
        giving_up = asyncio.create_task(consumer._give_up(reader))
        await asyncio.sleep(0.6)
        before_the_ack = list(access.released)
        consumer.acknowledge(0, 12)
        await asyncio.wait_for(giving_up, 10)
        return before_the_ack

    before_the_ack = asyncio.run(scenario())
    taker.join(10)
    assert [len(run) for _, run in taken] == [3]  # the run reached the application
    assert before_the_ack == [] and access.released == [(0, None)]
