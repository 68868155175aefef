"""A queue consumer's acknowledgements are sent in the background, batched per segment:
none may be lost between being recorded and a segment's answer, whatever interrupts
the exchange (the consumer closing mid-flush, the segment unreachable for a while)."""

from __future__ import annotations

import asyncio

import pytest

from clients import queue_consumer
from clients.queue_consumer import QueueAccess, _QueueCore
from runtime import wire
from runtime.names import TopicName


class _Settles:
    """A segment's settle connection that answers nothing until ``answering`` is set
    (failing ``unreachable`` times first), and records what each answered frame held."""

    def __init__(self, unreachable: int = 0) -> None:
        self.answering = asyncio.Event()
        self.asked = asyncio.Event()
        self.unreachable = unreachable
        self.settled: list[tuple[wire.Settle, list[int]]] = []

    async def settle(self, request: wire.SettleRequest) -> None:
        self.asked.set()
        if self.unreachable:
            self.unreachable -= 1
            raise ConnectionResetError("the segment is restarting")
        await self.answering.wait()
        self.settled.append((request.kind, list(request.offsets)))


class _Segment:
    name = "segment 3"

    def __init__(self, settles: _Settles) -> None:
        self.settles = settles

    def close(self) -> None:
        pass


async def _nowhere(*args: object) -> None:
    raise AssertionError("not looked up in this test")


async def _same(name: object) -> None:
    return None


def _core(settles: _Settles) -> _QueueCore:
    access = QueueAccess(_nowhere, _nowhere, _same)
    core = _QueueCore(TopicName.parse("topic://t/ns/t"), "sub", "worker", 10, 10, None, access)
    core.segments[3] = _Segment(settles)  # type: ignore[assignment]
    return core


def test_acknowledgements_of_a_flush_cut_short_by_close_are_sent_by_close(monkeypatch) -> None:
    monkeypatch.setattr(queue_consumer, "FLUSH_EVERY_S", 0.01)

    async def scenario() -> list[tuple[wire.Settle, list[int]]]:
        settles = _Settles()
        core = _core(settles)
        core.record_ack(3, 500)
        core.record_ack(3, 501)
        core.tasks.append(asyncio.get_running_loop().create_task(core._flush_forever()))
        await asyncio.wait_for(settles.asked.wait(), 5)  # 500 and 501 are on their way
        core.record_ack(3, 502)
        settles.answering.set()  # the segment answers only the close's own exchanges
        closing = asyncio.get_running_loop().create_task(core.close())
        core.tasks[0].cancel()  # the background flush is cut short before its answer
        await asyncio.wait_for(closing, 5)
        return settles.settled

    settled = asyncio.run(scenario())
    acked = sorted(o for kind, offsets in settled if kind == wire.Settle.ACK for o in offsets)
    assert acked == [500, 501, 502], settled
    assert settled[-1] == (wire.Settle.CONSUMER_LEFT, [])  # after the acknowledgements


@pytest.mark.parametrize("failures", [1, 3])
def test_acknowledgements_to_an_unreachable_segment_wait_in_order_for_it(
    monkeypatch, failures: int
) -> None:
    monkeypatch.setattr(queue_consumer, "FLUSH_EVERY_S", 0.01)

    async def scenario() -> list[tuple[wire.Settle, list[int]]]:
        settles = _Settles(unreachable=failures)
        settles.answering.set()
        core = _core(settles)
        core.record_ack(3, 7)
        core.tasks.append(asyncio.get_running_loop().create_task(core._flush_forever()))
        for _ in range(500):
            if settles.settled:
                break
            await asyncio.sleep(0.01)
        assert settles.settled == [(wire.Settle.ACK, [7])]  # by the background flush
        core.record_ack(3, 8)
        for _ in range(500):
            if len(settles.settled) == 2:
                break
            await asyncio.sleep(0.01)
        assert not core.tasks[0].done()
        await asyncio.wait_for(core.close(), 5)
        return settles.settled

    settled = asyncio.run(scenario())
    acked = [o for kind, offsets in settled if kind == wire.Settle.ACK for o in offsets]
    assert acked == [7, 8], settled
