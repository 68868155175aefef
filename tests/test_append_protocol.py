"""The segment data plane's server protocol over real loopback TCP: framing, buffer growth,
frames split across reads, and order kept when some frames must wait their turn; each
connection first admitted by a HELLO (any credential passes here: admission has its own
tests in test_data_plane.py and test_auth_data.py)."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.segment.data_plane import DataPlaneServer, HandleLater, HandleNow, PolicyWatch
from runtime import wire

EVERYTHING = wire.PRODUCE | wire.CONSUME  # the test's frames are neither appends nor reads


def frame(body: bytes) -> bytes:
    return wire.LENGTH.pack(len(body)) + body


def admit_all(credential: str | None, access: int) -> None:
    """An authorization that lets every HELLO in."""


async def connect(
    handle_now: HandleNow, handle_later: HandleLater
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A server with these handlers on loopback, and a connection to it past its HELLO."""
    server = DataPlaneServer(handle_now, handle_later, admit_all, PolicyWatch(lambda: 0))
    endpoint = await server.start("127.0.0.1", None)
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    writer.write(wire.encode_hello("any", EVERYTHING))
    (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
    assert wire.decode_welcome(await reader.readexactly(length)) == EVERYTHING
    return reader, writer


async def exchange(bodies: list[bytes], cuts: random.Random) -> list[tuple[int, int]]:
    """Send ``bodies`` in randomly cut pieces; return the decoded responses in arrival order.

    A body starting with b"w" must wait (answered later, asynchronously, with every body
    after it on the connection); each response
    carries (index of the body, its length) so order and integrity are both visible.
    """
    seen = iter(range(len(bodies)))

    def now(bodies: list[memoryview]) -> list[bytes]:
        responses = []
        for body in bodies:
            if body[:1] == b"w":
                break
            responses.append(wire.encode_ok(next(seen), len(body)))
        return responses

    async def later(body: bytes) -> bytes:
        await asyncio.sleep(0.001)
        return wire.encode_ok(next(seen), len(body))

    reader, writer = await connect(now, later)
    stream = b"".join(frame(body) for body in bodies)
    position = 0
    while position < len(stream):
        step = cuts.choice([1, 3, 4096, 65536, 1 << 20, 5 << 20])
        writer.write(stream[position : position + step])
        await writer.drain()
        position += step
    responses = []
    for _ in bodies:
        (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
        responses.append(wire.decode_response(await reader.readexactly(length)))
    writer.close()
    return responses


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 20, 100_000, 3_000_000, 9_000_000]), max_size=12),
    waits=st.lists(st.booleans(), max_size=12),
    seed=st.integers(0, 1000),
)
def test_frames_answered_in_order_whatever_their_sizes_and_cuts(sizes, waits, seed) -> None:
    bodies = [
        (b"w" if wait else b"n") + bytes(size - 1)
        for size, wait in zip(sizes, waits + [False] * len(sizes), strict=False)
    ]
    responses = asyncio.run(exchange(bodies, random.Random(seed)))
    assert responses == [(index, len(body)) for index, body in enumerate(bodies)]


def test_an_oversized_length_closes_the_connection() -> None:
    async def run() -> bytes:
        async def never(body: bytes) -> bytes:
            raise AssertionError("nothing is answered")

        reader, writer = await connect(lambda bodies: [], never)
        writer.write(wire.LENGTH.pack(wire.MAX_FRAME + 1))
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        return answer

    assert asyncio.run(run()) == b""
