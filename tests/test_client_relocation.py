"""A client's new connection after a broken one, without Ray (segments are stand-ins whose
``data_endpoint`` answers, or never does, as an actor on a dead node; data planes are
real sockets on loopback): while the segment's actor does not say where it listens, the
segment is looked up again, and the one it moved to (a new leader) is connected to
instead of waiting for Ray to declare the old one's node dead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from clients import _data_plane
from clients._data_plane import _open_following
from runtime import wire


class Segment:
    """A segment's actor: ``data_endpoint`` answers ``endpoint`` after ``delay_s``, or
    never (``endpoint`` None: its process is gone, and Ray holds the call)."""

    def __init__(self, endpoint: wire.Endpoint | None, delay_s: float = 0.0) -> None:
        self.endpoint, self.delay_s = endpoint, delay_s
        self.data_endpoint = SimpleNamespace(remote=self._answer)

    async def _answer(self, credential: str | None) -> wire.Endpoint:
        await asyncio.sleep(self.delay_s if self.endpoint is not None else 3600)
        return self.endpoint


async def data_plane(hellos: list[bytes]) -> tuple[asyncio.Server, wire.Endpoint]:
    """A data plane that records the first bytes each connection sends (its HELLO)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.read(1 << 16))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    return server, wire.Endpoint(host, port)


def looked_up(*answers: Any) -> tuple[Callable[[], Awaitable[Any]], list[float]]:
    """A look-up that gives ``answers`` in turn (the last from then on); when it was
    asked."""
    asked: list[float] = []

    async def relocate() -> Any:
        asked.append(time.monotonic())
        return answers[min(len(asked), len(answers)) - 1]

    return relocate, asked


def test_a_segment_that_moved_is_connected_to_while_the_dead_actor_never_answers() -> None:
    async def scenario() -> None:
        hellos: list[bytes] = []
        server, endpoint = await data_plane(hellos)
        dead, leader = Segment(None), Segment(endpoint)
        relocate, asked = looked_up(dead, dead, dead, leader)  # elected on the 4th look
        started = time.monotonic()
        segment, (_, writer) = await _open_following(dead, relocate, None, wire.PRODUCE)
        await writer.drain()
        took = time.monotonic() - started
        assert segment is leader and len(asked) == 4
        assert took < 1.0  # looked up again every 0.05-0.25 s, not Ray's seconds
        await asyncio.sleep(0.1)
        assert len(hellos) == 1 and hellos[0] == wire.encode_hello(None, wire.PRODUCE)
        writer.close()
        server.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_segment_that_did_not_move_is_waited_for() -> None:
    """Restarting behind the same handle (Ray restarts a crashed actor), or not served at
    the moment (the look-up says None): its answer is waited for."""

    async def scenario() -> None:
        hellos: list[bytes] = []
        server, endpoint = await data_plane(hellos)
        restarting = Segment(endpoint, delay_s=0.6)
        for answer in (restarting, None):
            relocate, asked = looked_up(answer)
            segment, (_, writer) = await _open_following(restarting, relocate, None, wire.CONSUME)
            assert segment is restarting and len(asked) >= 3  # looked, found no move
            writer.close()
        server.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_looking_up_again_slows_down_to_its_most(monkeypatch: Any) -> None:
    monkeypatch.setattr(_data_plane, "MOVED_POLL_S", (0.02, 0.1))

    async def scenario() -> None:
        hellos: list[bytes] = []
        server, endpoint = await data_plane(hellos)
        relocate, asked = looked_up(None)
        _, (_, writer) = await _open_following(
            Segment(endpoint, delay_s=1.0), relocate, None, wire.PRODUCE
        )
        gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
        assert 8 <= len(asked) <= 14 and max(gaps) < 0.2  # 0.02, 0.04, 0.08, 0.1, 0.1...
        writer.close()
        server.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
