"""The server side of a segment's data plane: one ``DataPlaneProtocol`` per client connection.

A buffered protocol rather than ``asyncio.StreamReader``: frames are received
straight into one reusable buffer (no per-frame ``bytes`` copies, no pausing
and resuming a small stream buffer around every 100 KB frame), the complete
frames of a read are appended together, and their responses leave in one write.
A frame that cannot be answered at once parks the connection: an append that
must wait for its producer's previous sequence (it arrived on a new connection
before the old one's frames were stored), or a consumer's long-poll read. It
and every later frame go through an async backlog, in order, until the backlog
is empty again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from runtime import wire
from runtime.errors import InvalidArgumentError

# Responses to the longest prefix of these frames that could be answered now.
HandleNow = Callable[[list[memoryview]], list[bytes]]
HandleLater = Callable[[bytes], Awaitable[bytes]]

_INITIAL_BUFFER = 4 << 20
_MIN_FREE = 256 << 10


class DataPlaneProtocol(asyncio.BufferedProtocol):
    def __init__(self, handle_now: HandleNow, handle_later: HandleLater) -> None:
        self._handle_now = handle_now
        self._handle_later = handle_later
        self._buffer = bytearray(_INITIAL_BUFFER)
        self._start = 0  # first byte not yet parsed
        self._end = 0  # first free byte
        self._backlog: deque[bytes] = deque()
        self._draining: asyncio.Task | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._draining is not None:
            self._draining.cancel()
        self._transport = None

    def pause_writing(self) -> None:
        self._transport.pause_reading()  # the producer is not reading its responses

    def resume_writing(self) -> None:
        self._transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < _MIN_FREE:
            self._make_room()
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        bodies = list(self._complete_frames())
        responses = self._handle_now(bodies) if bodies and not self._backlog else []
        for body in bodies[len(responses) :]:
            self._park(bytes(body))
        if responses and self._transport is not None:
            self._transport.write(b"".join(responses))

    def _complete_frames(self) -> Iterator[memoryview]:
        """Yield each whole frame's body; views valid until the next ``get_buffer``."""
        view = memoryview(self._buffer)
        try:
            while (frame := wire.frame_at(self._buffer, self._start, self._end)) is not None:
                first, self._start = frame
                yield view[first : self._start]
        except InvalidArgumentError:
            self._transport.close()
            return
        if self._start == self._end:
            self._start = self._end = 0

    def _make_room(self) -> None:
        """Move the unparsed tail to the front, into a larger buffer if its frame needs one."""
        pending = self._end - self._start
        size = len(self._buffer)
        if pending >= wire.LENGTH.size:
            (length,) = wire.LENGTH.unpack_from(self._buffer, self._start)
            size = max(size, wire.LENGTH.size + min(length, wire.MAX_FRAME) + _MIN_FREE)
        if size > len(self._buffer):
            fresh = bytearray(size)
            fresh[:pending] = self._buffer[self._start : self._end]
            self._buffer = fresh
        else:
            self._buffer[:pending] = self._buffer[self._start : self._end]
        self._start, self._end = 0, pending

    def _park(self, body: bytes) -> None:
        self._backlog.append(body)
        if self._draining is None or self._draining.done():
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._backlog:
            response = await self._handle_later(self._backlog[0])
            self._backlog.popleft()
            if self._transport is not None:
                self._transport.write(response)
