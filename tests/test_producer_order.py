"""A segment's sends keep their sequence order on the wire through failures
(``SegmentSender._await_turn``), tested without Ray: the segment is a stand-in that
records each append as it is written and answers when the test says.

Why it matters: a segment stores a producer's frames in sequence order, and a frame
written before its predecessor waits for it in front of it on the connection; resent
each on its own after a leader moved, a later sequence could go first and hold the
connection until the segment gave up on the missing one.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from clients._producer_core import SegmentAccess, SegmentSender
from runtime.errors import NotLeaderError, UnavailableError
from runtime.names import MAX_HASH, TopicName

TOPIC = TopicName.parse("topic://tenant/ns/orders")


@dataclass
class Chunk:
    """What a sender needs of a chunk: its batch, its transaction, and how it ends."""

    batch: object = None
    txn: str | None = None
    base: int | None = None
    error: BaseException | None = None

    def resolve(self, _segment_id: int, base: int) -> None:
        self.base = base

    def fail(self, error: BaseException) -> None:
        self.error = error


@dataclass
class Segment:
    """A leader stand-in: ``written`` is every append in the order it was written;
    each waits on a future the test resolves or fails."""

    written: list[int] = field(default_factory=list)
    answers: dict[int, asyncio.Future] = field(default_factory=dict)
    owed: set[int] = field(default_factory=set)  # failed, not written since (as seen)
    overtaken: list[tuple[int, int]] = field(default_factory=list)  # (written, owed before it)

    def __post_init__(self) -> None:
        self.append = SimpleNamespace(remote=self._append)

    def _append(self, _batch: Any, _producer_id: str, sequence: int, credential: Any) -> Any:  # noqa: ARG002
        self.written.append(sequence)
        self.overtaken += [(sequence, owed) for owed in self.owed if owed < sequence]
        self.owed.discard(sequence)
        self.answers[sequence] = asyncio.get_running_loop().create_future()
        return self._answer(sequence, self.answers[sequence])

    async def _answer(self, sequence: int, answer: asyncio.Future) -> Any:
        """The answer as the sender's task sees it: a failure is owed a resend from the
        moment the sender learns of it (an earlier write it could not know better)."""
        try:
            return await answer
        except Exception:
            self.owed.add(sequence)
            raise


def sender_for(segment: Segment, find_delays: list[float]) -> SegmentSender:
    """A sender over the Ray transport whose look-ups of the segment take the given
    delays in turn (the later ones first, in the test that needs them)."""
    delays = iter(find_delays)

    async def find(_name: object) -> Segment:
        await asyncio.sleep(next(delays, 0.0))
        return segment

    config = SimpleNamespace(transport="ray", window=8, send_timeout_s=10.0, producer_id="p1")
    core = SimpleNamespace(
        topic=TOPIC,
        config=config,
        access=SegmentAccess(find=find, unavailable=(UnavailableError,)),
        producer_id="p1",
        credential=None,
        release=lambda _chunk: None,
        segment_sealed=lambda _sender: None,
        batch_limits=lambda: (1, 1 << 20),
    )
    layout = SimpleNamespace(
        all_segments={0: SimpleNamespace(hash_range=SimpleNamespace(start=0, end=MAX_HASH))}
    )
    return SegmentSender(core, layout, 0)  # type: ignore[arg-type]


async def settle(predicate: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("error", [NotLeaderError("moved"), UnavailableError("gone")])
def test_sends_failed_together_are_written_again_in_sequence_order(error: Exception) -> None:
    async def scenario() -> None:
        segment = Segment()
        # the first look-up is the sender's; the resends' later ones return first
        sender = sender_for(segment, [0.0, 0.3, 0.2, 0.1, 0.0])
        chunks = [Chunk() for _ in range(4)]
        for chunk in chunks:
            sender.enqueue(chunk)
        sender.pump()
        await settle(lambda: len(segment.written) == 4)
        assert segment.written == [0, 1, 2, 3]
        for sequence in (3, 2, 1, 0):  # the failures arrive last first
            segment.answers[sequence].set_exception(error)
        await settle(lambda: len(segment.written) == 8)
        assert segment.written[4:] == [0, 1, 2, 3]
        for sequence in range(4):
            segment.answers[sequence].set_result((10 * sequence, 1))
        await settle(lambda: not sender.in_flight)
        assert [chunk.base for chunk in chunks] == [0, 10, 20, 30]
        assert all(chunk.error is None for chunk in chunks)

    asyncio.run(scenario())


def test_a_send_failing_while_an_earlier_one_awaits_its_answer_goes_after_it() -> None:
    """The earlier one may still be stored where it was written (its answer is coming),
    or fail too and go again: either way the later ones wait for it."""

    async def scenario() -> None:
        segment = Segment()
        sender = sender_for(segment, [0.0])
        chunks = [Chunk() for _ in range(3)]
        for chunk in chunks:
            sender.enqueue(chunk)
        sender.pump()
        await settle(lambda: len(segment.written) == 3)
        segment.answers[2].set_exception(NotLeaderError("moved"))
        segment.answers[1].set_exception(NotLeaderError("moved"))
        await asyncio.sleep(0.3)  # the retries' pause is 0.1 s
        assert segment.written == [0, 1, 2]  # both wait for 0's answer
        segment.answers[0].set_result((0, 1))
        await settle(lambda: len(segment.written) == 5)
        assert segment.written == [0, 1, 2, 1, 2]
        segment.answers[1].set_result((1, 1))
        segment.answers[2].set_result((2, 1))
        await settle(lambda: not sender.in_flight)
        assert [chunk.base for chunk in chunks] == [0, 1, 2]

    asyncio.run(scenario())


def test_random_failures_never_write_a_sequence_before_an_earlier_failed_one() -> None:
    """Answers fail and succeed at random (a segment stores in order only): a sequence
    is never written while an earlier one that failed is still to be written again,
    and every send ends stored."""

    async def scenario(seed: int) -> None:
        rng = random.Random(seed)
        segment = Segment()
        sender = sender_for(segment, [rng.uniform(0, 0.05) for _ in range(200)])
        chunks = [Chunk() for _ in range(12)]
        for chunk in chunks:
            sender.enqueue(chunk)
        sender.pump()
        stored: set[int] = set()
        async with asyncio.timeout(20):
            while sender.in_flight or sender.queue:
                await asyncio.sleep(rng.uniform(0, 0.02))
                waiting = [s for s, f in segment.answers.items() if not f.done()]
                if not waiting:
                    continue
                if rng.random() < 0.3:
                    failed = rng.choice(waiting)
                    segment.answers[failed].set_exception(NotLeaderError("moved"))
                elif stored >= set(range(sequence := min(waiting))):
                    stored.add(sequence)
                    segment.answers[sequence].set_result((sequence, 1))
        assert segment.overtaken == [], (seed, segment.written)
        assert [chunk.base for chunk in chunks] == list(range(12)), seed

    for seed in range(10):
        asyncio.run(scenario(seed))
