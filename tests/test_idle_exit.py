"""When a host ends itself (``actors.idle_exit``): once it holds nothing and had no call
for the quiet time, not before, and once."""

from __future__ import annotations

import asyncio
import time

from actors.idle_exit import IdleExit

QUIET_S = 0.05


def _host(holding: list[str]) -> tuple[IdleExit, list[float]]:
    ended: list[float] = []
    idle = IdleExit(lambda: bool(holding), lambda: ended.append(time.monotonic()), QUIET_S)
    return idle, ended


def test_a_host_holding_nothing_ends_once_after_the_quiet_time() -> None:
    async def scenario() -> list[float]:
        idle, ended = _host([])
        started = time.monotonic()
        idle.look()
        idle.look()  # one timer at most
        await asyncio.sleep(3 * QUIET_S)
        assert all(at - started >= QUIET_S for at in ended)
        return ended

    assert len(asyncio.run(scenario())) == 1


def test_a_call_starts_the_quiet_time_again() -> None:
    async def scenario() -> None:
        idle, ended = _host([])
        idle.look()
        await asyncio.sleep(QUIET_S * 0.6)
        idle.called()
        await asyncio.sleep(QUIET_S * 0.6)
        assert ended == [], "ended although called within the quiet time"
        await asyncio.sleep(QUIET_S)
        assert len(ended) == 1

    asyncio.run(scenario())


def test_a_host_holding_something_stays_until_it_lets_go_and_looks() -> None:
    async def scenario() -> None:
        holding = ["segment"]
        idle, ended = _host(holding)
        idle.look()
        await asyncio.sleep(2 * QUIET_S)
        assert ended == []
        holding.clear()
        idle.look()
        await asyncio.sleep(2 * QUIET_S)
        assert len(ended) == 1

    asyncio.run(scenario())


def test_a_charge_taken_while_the_timer_runs_keeps_the_host() -> None:
    async def scenario() -> None:
        holding: list[str] = []
        idle, ended = _host(holding)
        idle.look()
        holding.append("controller")
        await asyncio.sleep(2 * QUIET_S)
        assert ended == []

    asyncio.run(scenario())


def test_an_end_that_finds_a_reason_to_stay_looks_again() -> None:
    async def scenario() -> None:
        stays = [True]
        ended: list[str] = []

        def end() -> None:
            if stays.pop() if stays else False:
                idle.look()
                return
            ended.append("ended")

        idle = IdleExit(lambda: False, end, QUIET_S)
        idle.look()
        await asyncio.sleep(3.5 * QUIET_S)
        assert ended == ["ended"]

    asyncio.run(scenario())
