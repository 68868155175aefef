"""How a controller's maintenance round reads its segments' stats
(``actors.control.segment_calls.SegmentCalls.observe``), given stand-ins for the segment
hosts: a host that is gone (its process, or its node: a host pinned to a node that is
gone is unschedulable, which Ray does not count as an actor error) answers nothing, and
its segments are looked up afresh next round, where a replicated segment's new leader
is found. Kept, the cached handle would be asked, and fail, every round for good."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import ActorUnschedulableError, RayActorError

from actors.control import segment_calls
from actors.control.segment_calls import SegmentCalls
from actors.segment.handle import SegmentHandle
from runtime.hibernation import HibernationMarks
from runtime.names import SegmentName, TopicName

TOPIC = TopicName.parse("topic://acme/calls/t")
LIVE, GONE = TOPIC.segment(0, 0, 0x7FFF), TOPIC.segment(1, 0x8000, 0xFFFF)


class Host:
    """A segment host's stand-in: ``stats_of`` answers, or fails with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.stats_of = self

    def remote(self, segments: list[str], credential: str | None = None) -> Any:
        async def answer() -> dict[str, Any]:
            if self.error is not None:
                raise self.error
            return {segment: {"endOffset": 7} for segment in segments}

        return answer()


class Calls(SegmentCalls):
    topic = TOPIC

    def __init__(self, hosts: dict[SegmentName, Host]) -> None:
        self._marks = HibernationMarks()
        self.hosts = hosts
        self.forgotten: list[SegmentName] = []

    def watched(self, name: SegmentName) -> SegmentHandle | None:
        return SegmentHandle(self.hosts[name], str(name))  # type: ignore[arg-type]

    def forget(self, name: SegmentName) -> None:
        self.forgotten.append(name)


class Guard:
    def internal_token(self) -> str:
        return "token"


@pytest.mark.parametrize(
    "gone",
    [RayActorError(), ActorUnschedulableError("its node is gone")],
    ids=["process gone", "node gone"],
)
def test_a_host_that_is_gone_is_looked_up_afresh_next_round(
    gone: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segment_calls, "guard", Guard)
    calls = Calls({LIVE: Host(), GONE: Host(gone)})
    stats = asyncio.run(calls.observe({0: LIVE, 1: GONE}, on_demand=set(), wait_s=1.0))
    assert stats == {0: {"endOffset": 7}}
    assert calls.forgotten == [GONE]
