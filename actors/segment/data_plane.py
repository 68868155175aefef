"""The server side of a segment's data plane: its listening socket and one protocol per connection.

A buffered protocol rather than ``asyncio.StreamReader``: frames are received
straight into one reusable buffer (no per-frame ``bytes`` copies, no pausing
and resuming a small stream buffer around every 100 KB frame), the complete
frames of a read are appended together, and their responses leave in one write.
A frame that cannot be answered at once parks the connection: an append that
must wait for its producer's previous sequence (it arrived on a new connection
before the old one's frames were stored), or a consumer's long-poll read. It
and every later frame go through an async backlog, in order, until the backlog
is empty again. A frame can also be handled at once and answered later (an append
a replicated segment stored, whose answer waits until enough replicas hold it):
its answer is an awaitable, and it and every later answer wait in the backlog, so
appends keep being stored while earlier ones wait for their quorum.

Whoever reaches the port can send bytes, so a connection is a stranger until
its first frame, a HELLO (``runtime.wire``), names a credential that the
segment's ``authorize`` accepts for the access asked. Until then the connection
holds a buffer just big enough for a HELLO, gets ``HELLO_TIMEOUT_S`` to send
it, and nothing it sends is parsed as an append or a read; a refusal is an
error frame and the end of the connection. The check runs once per connection,
never per frame: what a frame needs afterwards is one comparison of its op
byte with what the connection was granted. Tokens are revoked and grants
withdrawn while connections are open, so every open connection is re-checked
whenever the policy's version changes, and refused if it no longer passes. One
``PolicyWatch`` per process looks at the version every ``RECHECK_S`` for all of a
host's segments, and only while one of them has a connection: what a host does
while idle does not grow with its segments.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from runtime import wire
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableError,
)
from runtime.listen import PORTS_ENV, PortRange

log = logging.getLogger(__name__)

# Responses to the longest prefix of these frames that could be handled now: each the
# answer, or what will be the answer (a frame handled now whose answer waits).
HandleNow = Callable[[list[memoryview]], list[bytes | asyncio.Future[bytes]]]
HandleLater = Callable[[bytes], Awaitable[bytes]]
# Raises the typed refusal when the credential may not have this access (wire bits).
Authorize = Callable[[str | None, int], None]

HELLO_TIMEOUT_S = 10.0  # a connection that sent no HELLO by then is closed
RECHECK_S = 1.0  # how often the policy's version is looked at while connections are open

_HELLO_BUFFER = 16 << 10
_INITIAL_BUFFER = 4 << 20
_MIN_FREE = 256 << 10


class DataPlaneServer:
    """A segment's data plane: the socket, its connections and their admission."""

    def __init__(
        self,
        handle_now: HandleNow,
        handle_later: HandleLater,
        authorize: Authorize,
        policy: PolicyWatch,
        on_refused: Callable[[ScalableTopicsError], None] = lambda error: None,
    ) -> None:
        self.handle_now = handle_now
        self.handle_later = handle_later
        self._authorize = authorize
        self._policy = policy
        self._on_refused = on_refused
        self.connections: set[DataPlaneProtocol] = set()
        self.endpoint: wire.Endpoint | None = None
        self._server: asyncio.Server | None = None

    async def start(
        self,
        host: str,
        tls: ssl.SSLContext | None,
        ports: PortRange | None = None,
        advertised: str | None = None,
    ) -> wire.Endpoint:
        """Listen on ``host``, at the first free port of ``ports`` (any port without
        one), and tell clients ``advertised`` (``runtime.listen``) instead of ``host``
        when given. ``UnavailableError`` naming the range when every port is taken."""
        for port in ports or (0,):
            try:
                self._server = await asyncio.get_running_loop().create_server(
                    lambda: DataPlaneProtocol(self),
                    host=host,
                    port=port,
                    ssl=tls,
                    ssl_handshake_timeout=HELLO_TIMEOUT_S if tls is not None else None,
                )
                break
            except OSError as err:
                if ports is None or err.errno != errno.EADDRINUSE:
                    raise
        else:
            raise UnavailableError(
                f"no free port in {PORTS_ENV}={ports} on {host}: each segment's data plane "
                "needs one of its own; widen the range"
            )
        bound_host, port = self._server.sockets[0].getsockname()[:2]
        self.endpoint = wire.Endpoint(advertised or bound_host, port, tls is not None)
        return self.endpoint

    def connected(self, connection: DataPlaneProtocol) -> None:
        """A connection opened: the policy is watched for it until it closes."""
        self.connections.add(connection)
        self._policy.watch(self)

    def stop(self) -> None:
        """Stop listening and drop every connection: the segment closed (it hibernates or
        was deleted), and its clients find it again through its host."""
        if self._server is not None:
            self._server.close()
        self._policy.forget(self)
        self.drop_connections()

    def drop_connections(self, keep: int = 0) -> None:
        """Drop every connection but those granted any access in ``keep``, still
        listening: their clients connect again and learn what changed (a replica that no
        longer leads refuses them, naming why)."""
        for connection in list(self.connections):
            if not connection.access & keep:
                connection.drop()

    def admit(self, credential: str | None, access: int) -> None:
        """Raise the typed refusal unless ``credential`` may have ``access`` now."""
        try:
            self._authorize(credential, access)
        except ScalableTopicsError:
            raise
        except Exception as err:  # noqa: BLE001 - the policy could not be read
            log.warning("data plane: could not check a credential: %r", err)
            raise UnavailableError("the segment could not check the credential now") from None

    def refused(self, error: ScalableTopicsError) -> None:
        self._on_refused(error)

    def recheck(self) -> None:
        """Refuse every admitted connection whose credential no longer passes."""
        for connection in list(self.connections):
            if not connection.access:
                continue
            try:
                self._authorize(connection.credential, connection.access)
            except ScalableTopicsError as err:
                connection.refuse(err)
            except Exception as err:  # noqa: BLE001 - unknown is not revoked: look again later
                log.warning("data plane: could not re-check a connection: %r", err)


class PolicyWatch:
    """Re-checks the open connections of every server that shares it when the policy's
    version changes: one loop for a process's segments, running only while one of them
    has a connection.

    Who calls: ``DataPlaneServer.connected`` (``watch``) and ``stop`` (``forget``).
    What it affects: ``DataPlaneServer.recheck`` of each watched server.
    """

    def __init__(self, version: Callable[[], int]) -> None:
        self._version = version
        self._servers: set[DataPlaneServer] = set()
        self._task: asyncio.Task | None = None

    def watch(self, server: DataPlaneServer) -> None:
        """Watch ``server``'s connections until it has none; starts the loop if none runs
        on this event loop (a loop of a finished ``asyncio.run`` left its task behind)."""
        self._servers.add(server)
        running = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not running:
            self._task = running.create_task(self._recheck_while_used())

    def forget(self, server: DataPlaneServer) -> None:
        self._servers.discard(server)

    async def _recheck_while_used(self) -> None:
        seen = self._version()
        while self._servers:
            await asyncio.sleep(RECHECK_S)
            try:
                version = self._version()
            except Exception as err:  # noqa: BLE001 - keep serving; look again next round
                log.warning("data plane: could not read the policy version: %r", err)
                continue
            if version != seen:
                seen = version
                for server in list(self._servers):
                    server.recheck()
            self._servers = {server for server in self._servers if server.connections}


class DataPlaneProtocol(asyncio.BufferedProtocol):
    def __init__(self, server: DataPlaneServer) -> None:
        self._server = server
        self._buffer = bytearray(_HELLO_BUFFER)
        self._start = 0  # first byte not yet parsed
        self._end = 0  # first free byte
        # Frames to handle later, answers to wait for, and a refusal after them, in order
        self._backlog: deque[bytes | asyncio.Future[bytes] | ScalableTopicsError] = deque()
        self._frames_waiting = 0  # frames in the backlog not handled yet
        self._refusal_queued = False
        self._draining: asyncio.Task | None = None
        self._transport: asyncio.Transport | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self.credential: str | None = None
        self.access = 0  # granted: 0 until the HELLO is accepted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connected(self)
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(HELLO_TIMEOUT_S, self._no_hello)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._draining is not None:
            self._draining.cancel()
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._server.connections.discard(self)
        self._transport = None

    def drop(self) -> None:
        """Close the connection without an answer, as a process that exits would."""
        if self._transport is not None:
            self._transport.abort()

    def pause_writing(self) -> None:
        self._transport.pause_reading()  # the producer is not reading its responses

    def resume_writing(self) -> None:
        self._transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._refused:
            self._start = self._end = 0  # whatever still arrives is dropped unread
        elif len(self._buffer) - self._end < (_MIN_FREE if self.access else _HELLO_BUFFER // 4):
            self._make_room()
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self._refused or (not self.access and not self._greet()):
            return
        bodies = list(self._complete_frames())
        forbidden = self._first_forbidden(bodies)
        if forbidden is not None:
            needs = wire.ACCESS_OF_OP[bodies[forbidden][0]]
            bodies = bodies[:forbidden]
        # Frames are handled now unless an earlier one waits to be handled; answers that
        # wait (appends waiting for their quorum) do not hold back storing the next ones,
        # but every answer leaves after those owed before it.
        owed = bool(self._backlog)
        handle = bodies and not self._frames_waiting and not self._refusal_queued
        responses = self._server.handle_now(bodies) if handle else []
        ready = 0 if owed else next(
            (i for i, response in enumerate(responses) if not isinstance(response, bytes)),
            len(responses),
        )  # fmt: skip
        if ready and self._transport is not None:
            self._transport.write(b"".join(responses[:ready]))  # type: ignore[arg-type]
        for answer in responses[ready:]:
            self._park(answer if not isinstance(answer, bytes) else _ready(answer))
        for body in bodies[len(responses) :]:
            self._park(bytes(body))
        if forbidden is not None:
            error = UnauthorizedError(
                f"this connection was granted {_names(self.access)} only, not "
                f"{wire.ACCESS_NAMES[needs]}"
            )
            if self._backlog:
                self._backlog.append(error)  # after the answers to the frames before it
                self._refusal_queued = True
            else:
                self.refuse(error)

    def refuse(self, error: ScalableTopicsError) -> None:
        """Answer with ``error`` and close; no frame of this connection is looked at again."""
        if self._refused:
            return
        self._refused = True
        self._server.refused(error)
        if self._draining is not None and self._draining is not asyncio.current_task():
            self._draining.cancel()
        self._backlog.clear()
        if self._transport is not None:
            self._transport.write(wire.encode_error(error))
            self._transport.close()

    # --- the handshake -----------------------------------------------------------------

    def _greet(self) -> bool:
        """Take the HELLO once all of it is in; False while it is not (or was refused)."""
        if self._end - self._start >= wire.LENGTH.size:
            (length,) = wire.LENGTH.unpack_from(self._buffer, self._start)
            if length > wire.MAX_HELLO:
                self.refuse(
                    UnauthenticatedError(
                        "the first frame of a data plane connection must be a HELLO "
                        f"(at most {wire.MAX_HELLO} bytes, got a {length}-byte frame)"
                    )
                )
                return False
        frame = wire.frame_at(self._buffer, self._start, self._end)
        if frame is None:
            return False
        first, self._start = frame
        try:
            credential, access = wire.decode_hello(memoryview(self._buffer)[first : self._start])
            self._server.admit(credential, access)
        except ScalableTopicsError as err:
            self.refuse(err)
            return False
        self.credential, self.access = credential, access
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if self._transport is not None:
            self._transport.write(wire.encode_welcome(access))
        return True

    def _no_hello(self) -> None:
        self.refuse(UnauthenticatedError(f"no data plane HELLO within {HELLO_TIMEOUT_S:g}s"))

    def _first_forbidden(self, bodies: list[memoryview]) -> int | None:
        """Index of the first frame this connection may not carry (an append without
        produce; a read, take or settle without consume); frames of no known op are
        answered as malformed, as before any access applied."""
        if self.access == wire.ALL_ACCESS:
            return None
        for index, body in enumerate(bodies):
            needs = wire.ACCESS_OF_OP.get(body[0]) if len(body) else None
            if needs is not None and not needs & self.access:
                return index
        return None

    # --- frames ------------------------------------------------------------------------

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
        """Move the unparsed tail to the front, into a larger buffer if its frame needs
        one (an admitted connection's frames only: a stranger's buffer never grows)."""
        pending = self._end - self._start
        size = len(self._buffer)
        if self.access:
            size = max(size, _INITIAL_BUFFER)
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

    def _park(self, item: bytes | asyncio.Future[bytes]) -> None:
        """Queue a frame to handle later, or an answer to wait for."""
        self._backlog.append(item)
        if isinstance(item, bytes):
            self._frames_waiting += 1
        if self._draining is None or self._draining.done():
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._backlog:
            item = self._backlog[0]
            if isinstance(item, ScalableTopicsError):
                self.refuse(item)
                return
            if isinstance(item, bytes):
                response = await self._server.handle_later(item)
                self._frames_waiting -= 1
            else:
                response = await item
            self._backlog.popleft()
            responses = [response, *self._answered()]
            if self._transport is not None:
                self._transport.write(b"".join(responses))

    def _answered(self) -> list[bytes]:
        """The answers at the head of the backlog that are ready now, taken off it: a
        quorum reached releases many waiting appends at once, and one write for them all
        is one system call instead of one each."""
        answered = []
        while self._backlog:
            item = self._backlog[0]
            if not isinstance(item, asyncio.Future) or not item.done():
                break
            if item.cancelled() or item.exception() is not None:
                break  # the loop above awaits it, and ends as it always did
            answered.append(self._backlog.popleft().result())
        return answered


def _ready(answer: bytes) -> asyncio.Future[bytes]:
    """An answer ready now, behind one that is not: it leaves after that one."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(answer)
    return future


def _names(access: int) -> str:
    return " and ".join(name for bit, name in wire.ACCESS_NAMES.items() if access & bit)
