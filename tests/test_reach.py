"""``runtime.remote.reach``: a call that must reach an actor is asked again while the
actor cannot be reached, then fails with a typed, retryable error; the segment fleet
waits so for replicated segments only (no Ray needed: the calls are stand-ins that
raise what Ray raises)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnschedulableError

import runtime.remote as remote
from runtime.errors import InvalidArgumentError, UnavailableError
from runtime.names import MAX_HASH, TopicName


def failing(times: int, error: Exception) -> tuple[list[float], object]:
    """A call that raises ``error`` its first ``times`` calls, then answers 7."""
    calls: list[float] = []

    async def call() -> int:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise error
        return 7

    return calls, call


@pytest.fixture(autouse=True)
def quick_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "REACH_PAUSE_S", 0.01)


@pytest.mark.parametrize(
    "error",
    [ActorUnschedulableError("its node is gone"), ActorDiedError(), UnavailableError("no disk")],
)
def test_an_unreachable_actor_is_asked_again_until_it_answers(error: Exception) -> None:
    calls, call = failing(3, error)
    assert asyncio.run(remote.reach("segment 4", call, wait_s=5.0)) == 7
    assert len(calls) == 4


def test_past_the_wait_it_is_a_typed_retryable_error_naming_what() -> None:
    calls, call = failing(1000, ActorUnschedulableError("its node is gone"))
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="segment 4: its actor cannot be reached") as err:
        asyncio.run(remote.reach("segment 4", call, wait_s=0.2))
    assert 0.2 <= time.monotonic() - started < 2.0
    assert len(calls) > 2 and err.value.http_status == 503
    _, once = failing(1000, ActorUnschedulableError("gone"))
    with pytest.raises(UnavailableError):
        asyncio.run(remote.reach("segment 4", once))  # no wait: one call


def test_other_errors_are_not_asked_again() -> None:
    calls, call = failing(1, InvalidArgumentError("not active"))
    with pytest.raises(InvalidArgumentError):
        asyncio.run(remote.reach("segment 4", call, wait_s=5.0))
    assert len(calls) == 1


def fleet_with(replicated: set[int], answers: list[Exception | int]) -> tuple[Any, list[int]]:
    """A ``SegmentFleet`` with stand-ins for what ``_reach`` uses: its segments' actors
    (each call takes the next answer) and the replica sets of the ``replicated`` ids."""
    from actors.control.segment_fleet import SegmentFleet

    calls: list[int] = []

    async def answer() -> int:
        calls.append(len(calls))
        result = answers[min(len(calls) - 1, len(answers) - 1)]
        if isinstance(result, Exception):
            raise result
        return result

    fleet = object.__new__(SegmentFleet)
    fleet.node_local = True
    fleet.replicas = SimpleNamespace(
        sets=lambda: SimpleNamespace(get=lambda i: ("set", 1) if i in replicated else None)
    )
    fleet.handle = lambda _name: SimpleNamespace(call=answer)
    return fleet, calls


def test_the_fleet_waits_for_a_replicated_segments_new_leader_only() -> None:
    """A replicated segment's lost leader is replaced within a round: worth waiting for.
    A segment with one copy on a lost node is not coming back soon: refused at once."""
    topic = TopicName.parse("topic://tenant/ns/orders")
    gone = ActorUnschedulableError("its node is gone")
    fleet, calls = fleet_with({1}, [gone, gone, 7])
    one = topic.segment(1, 0, MAX_HASH)
    assert asyncio.run(fleet._reach(one, lambda handle: handle.call())) == 7
    assert len(calls) == 3
    fleet, calls = fleet_with({1}, [gone])
    zero = topic.segment(0, 0, MAX_HASH)
    with pytest.raises(UnavailableError, match="cannot be reached"):
        asyncio.run(fleet._reach(zero, lambda handle: handle.call()))
    assert len(calls) == 1
