"""The segment data plane's server protocol over real loopback TCP: framing, buffer growth,
frames split across reads, and order kept when some frames must wait their turn."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.data_plane import DataPlaneProtocol
from runtime import wire


def frame(body: bytes) -> bytes:
    return wire.LENGTH.pack(len(body)) + body


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

    server = await asyncio.get_running_loop().create_server(
        lambda: DataPlaneProtocol(now, later), "127.0.0.1", 0
    )
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
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
    server.close()
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
        server = await asyncio.get_running_loop().create_server(
            lambda: DataPlaneProtocol(lambda bodies: [], None), "127.0.0.1", 0
        )
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(wire.LENGTH.pack(wire.MAX_FRAME + 1))
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        server.close()
        return answer

    assert asyncio.run(run()) == b""
