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
    after it on the connection); one starting with b"f" is handled now and answered
    later (a replicated append waiting for its quorum), after a random delay, so later
    answers are ready before it. Each response carries (index of the body, its length)
    so order and integrity are both visible.
    """
    seen = iter(range(len(bodies)))
    loop = asyncio.get_running_loop()

    def now(bodies: list[memoryview]) -> list[bytes | asyncio.Future[bytes]]:
        responses: list[bytes | asyncio.Future[bytes]] = []
        for body in bodies:
            if body[:1] == b"w":
                break
            answer = wire.encode_ok(next(seen), len(body))
            if body[:1] == b"f":
                future = loop.create_future()
                loop.call_later(cuts.random() / 100, future.set_result, answer)
                responses.append(future)
            else:
                responses.append(answer)
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
    kinds=st.lists(st.sampled_from([b"w", b"f", b"n"]), max_size=12),
    seed=st.integers(0, 1000),
)
def test_frames_answered_in_order_whatever_their_sizes_and_cuts(sizes, kinds, seed) -> None:
    bodies = [
        kind + bytes(size - 1)
        for size, kind in zip(sizes, kinds + [b"n"] * len(sizes), strict=False)
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


def test_answers_ready_early_wait_for_an_earlier_frames_later_answer() -> None:
    """Frames handled together: the first one's answer comes late (a replicated append
    waiting for its quorum), the others' at once; they leave in the frames' order."""
    bodies = [b"f" + bytes(19), b"n" + bytes(19), b"f" + bytes(9), b"n" + bytes(3), b"w", b"n"]
    responses = asyncio.run(exchange(bodies, random.Random(1)))
    assert responses == [(index, len(body)) for index, body in enumerate(bodies)]
