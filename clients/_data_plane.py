"""Clients' TCP connections to a segment's data plane.

``SegmentChannel`` is a producer's pipelined connection. It owns delivery:
every frame stays pending until its response arrives, and after a broken
connection (the segment actor restarted, say) it reconnects — asking Ray for
the actor's new address — and resends every pending frame in sequence order.
The segment drops frames it already stored (same producer id and sequence), so
resending is always safe, and in-order resending keeps the segment from
waiting on a gap.

``ReadChannel`` is a stream consumer's connection: one long-poll read at a
time, each carrying the cumulative ack of what was read before. A Ray call per
read cost ~2.4 ms of CPU between the two processes here, the TCP exchange
~0.5 ms, and a consumer reads every segment it holds about as often as
producers append to it.

Both open each connection with a HELLO carrying the client's credential
(``runtime.wire``), written together with the first frames. A refusal, at the
HELLO or later (the token was revoked), fails what is pending with the typed
error and is not retried: the next append or read tries once more, so a
restored grant works again, but nothing loops. When the segment speaks TLS
(``RAYTOPICS_TLS_CERT``/``_KEY`` on its side) the client verifies its
certificate and address against ``RAYTOPICS_TLS_CA``; a client without that CA,
or with a CA and a plaintext segment, gets ``TlsError`` instead of talking to it.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pyarrow as pa

from runtime import tls, wire
from runtime.batch import deserialize_batch
from runtime.errors import (
    InvalidArgumentError,
    NotLeaderError,
    ScalableTopicsError,
    SegmentNotFoundError,
    TlsError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableError,
)

# What ends a client's work with a segment instead of a retry: the cluster refused its
# credential, or the data plane cannot be reached securely.
REFUSALS = (UnauthenticatedError, UnauthorizedError, TlsError)
# How much longer than its long-poll a read may take before the segment counts as stuck.
READ_GRACE_S = 30.0
# How long a producer's connection waits before it looks a replicated segment up again
# when a replica that does not lead answered it (its leader not chosen yet, or moved).
LEADER_WAIT_S = 0.2
# While a new connection after a broken one waits for the segment's actor to say where
# it listens, the segment is looked up again this often at first, then ever less often.
MOVED_POLL_S = (0.05, 0.25)
_STREAM_LIMIT = 4 << 20  # buffer whole deliveries instead of pausing the socket every 128 KB
# Bytes of frames handed to the transport ahead of the socket. The rest wait in
# ``_pending`` until answers show the segment took some: a transport buffer that
# grows with everything in flight keeps moving into fresh memory, which the
# producer pays for in system time on every append (bench/README.md has the figures).
_WRITE_AHEAD = 4 << 20


_T = TypeVar("_T")

_tls_contexts: dict[tuple[str, int] | None, ssl.SSLContext | None] = {}


def _client_tls() -> ssl.SSLContext | None:
    """This process's client context: one per CA file and version of it, since loading
    it costs per connection, and a CA the operator replaced in place must be the one
    verified against from the next connection on."""
    ca = os.environ.get(tls.CA_ENV) or None
    key = (ca, _modified_ns(ca)) if ca else None
    if key not in _tls_contexts:
        _tls_contexts[key] = tls.client_context()
    return _tls_contexts[key]


def _modified_ns(path: str) -> int:
    """When ``path`` last changed (-1 if it is missing: ``tls.client_context`` says so)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def unreachable() -> tuple[type[BaseException], ...]:
    """What a failed attempt to connect raises that a later one may not: a socket's
    error, the segment not served at this moment (a gateway's answer), and in a Ray
    driver the segment's actor restarting. Ray's exceptions are looked up only where Ray
    was imported: a client outside Ray never imports it."""
    retried: tuple[type[BaseException], ...] = (OSError, SegmentNotFoundError, UnavailableError)
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is None:
        return retried
    return (*retried, ray_exceptions.RayActorError, ray_exceptions.ActorUnschedulableError)


async def _endpoint(segment: Any, credential: str | None) -> wire.Endpoint:
    """Where ``segment`` listens now: a Ray driver asks its actor, a client outside Ray
    the gateway (``clients._remote.RemoteSegment``)."""
    from clients._remote import RemoteSegment  # here: it builds on this module

    if isinstance(segment, RemoteSegment):
        return await segment.locate()
    from runtime.remote import call

    return await call(segment.data_endpoint.remote(credential=credential))


async def _open_data_plane(
    segment: Any, credential: str | None, access: int, **options: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the segment's data plane, at the address its actor gives now,
    with the HELLO written: the caller's frames may follow at once."""
    endpoint = await _endpoint(segment, credential)
    context = _client_tls()
    if endpoint.tls and context is None:
        raise TlsError(
            f"the data plane at {endpoint.host}:{endpoint.port} speaks TLS: set "
            f"{tls.CA_ENV} to the CA that signed its certificate"
        )
    if context is not None and not endpoint.tls:
        raise TlsError(
            f"{tls.CA_ENV} is set, but the data plane at {endpoint.host}:{endpoint.port} "
            "does not speak TLS (the segment has no certificate): refusing plaintext"
        )
    try:
        reader, writer = await asyncio.open_connection(
            endpoint.host, endpoint.port, ssl=context, **options
        )
    except ssl.SSLCertVerificationError as err:
        raise TlsError(
            f"the data plane at {endpoint.host}:{endpoint.port} is not trusted: "
            f"{err.verify_message}"
        ) from None
    writer.write(wire.encode_hello(credential, access))
    return reader, writer


async def _open_following(
    segment: Any,
    relocate: Callable[[], Awaitable[Any | None]],
    credential: str | None,
    access: int,
    **options: Any,
) -> tuple[Any, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``_open_data_plane`` after a connection to ``segment`` broke, and the segment it
    was opened to (``relocate``'s answer when it moved). The actor asked where it listens
    may be dead, and Ray holds an ask to it until it declares the node dead (seconds),
    while a replicated segment's controller elects another leader sooner: while no answer
    came, the segment is looked up again, and the one it moved to is asked instead.
    ``relocate`` answers ``None`` when it is not served now."""
    opening = asyncio.ensure_future(_open_data_plane(segment, credential, access, **options))
    poll_s, most_s = MOVED_POLL_S
    try:
        while not (await asyncio.wait({opening}, timeout=poll_s))[0]:
            poll_s = min(poll_s * 2, most_s)
            moved = await relocate()
            if moved is not None and moved != segment:
                opening.cancel()
                segment = moved
                opening = asyncio.ensure_future(
                    _open_data_plane(segment, credential, access, **options)
                )
        return segment, opening.result()
    finally:
        opening.cancel()


async def check_access(segment: Any, credential: str | None, access: int) -> None:
    """Raise the segment's refusal of ``credential`` for ``access`` (``wire.PRODUCE``,
    ``wire.CONSUME``), if it refuses: the HELLO alone, answered and closed."""
    reader, writer = await _open_data_plane(segment, credential, access)
    try:
        wire.decode_welcome(await _frame(reader))
    finally:
        writer.close()


class ChannelError(ConnectionError):
    """The segment could not be reached (it stays unreachable after retries)."""


class SegmentChannel:
    def __init__(
        self,
        handle: Any,
        *,
        credential: str | None = None,
        reconnect_attempts: int = 50,
        relocate: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        """``relocate``: the segment looked up again, before each connection but the
        first (a replicated segment's leader may have moved to another node)."""
        self._handle = handle
        self._credential = credential
        self._attempts = reconnect_attempts
        self._relocate = relocate
        self._connected = False
        self._pending: OrderedDict[int, tuple[bytes, asyncio.Future]] = OrderedDict()
        self._on_wire: deque[int] = deque()  # keys written on the current connection
        self._unsent: deque[int] = deque()  # keys not yet written on it, in order
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task] = []
        self._connecting: asyncio.Task | None = None
        self._next_key = 0

    async def append(
        self,
        producer_id: str | None,
        sequence: int | None,
        payload: bytes,
        txn_id: str | None = None,
    ) -> tuple[int, int]:
        """Store ``payload`` (a batch of transaction ``txn_id``, if given); returns (base
        offset, count) or raises the segment's error.

        If the caller stops waiting, the frame stays pending until the segment
        answers it: responses are matched to frames by position on the wire.
        """
        future = asyncio.get_running_loop().create_future()
        key, self._next_key = self._next_key, self._next_key + 1
        self._pending[key] = (wire.encode_append(producer_id, sequence, payload, txn_id), future)
        self._unsent.append(key)
        if self._writer is not None:
            self._write_ahead()
        else:
            self._ensure_connecting()
        return await asyncio.shield(future)

    def open(self) -> None:
        """Connect ahead of the first append, so that it does not wait for the
        actor's address and a TCP handshake."""
        if self._writer is None:
            self._ensure_connecting()

    async def close(self) -> None:
        for task in [*self._tasks, self._connecting]:
            if task is not None:
                task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write_ahead(self) -> None:
        """Write unsent frames, in order, while the transport holds under ``_WRITE_AHEAD``.
        Frames left unsent are written as answers arrive: they do while frames are on
        the wire, and a broken connection resends everything pending anyway."""
        transport = self._writer.transport
        while self._unsent and transport.get_write_buffer_size() < _WRITE_AHEAD:
            key = self._unsent.popleft()
            self._writer.write(self._pending[key][0])
            self._on_wire.append(key)

    def _ensure_connecting(self) -> None:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self, pause_s: float = 0.0) -> None:
        """(Re)connect, after ``pause_s``, then resend everything not yet acknowledged, in
        order."""
        await asyncio.sleep(pause_s)
        failure: Exception | None = None
        for attempt in range(self._attempts):
            try:
                if self._relocate is not None and (self._connected or attempt):
                    self._handle = await self._relocate()
                if self._relocate is not None and self._connected:
                    self._handle, (reader, writer) = await _open_following(
                        self._handle, self._relocate, self._credential, wire.PRODUCE
                    )
                else:
                    reader, writer = await _open_data_plane(
                        self._handle, self._credential, wire.PRODUCE
                    )
                self._connected = True
                break
            except REFUSALS as err:  # asking again cannot change that
                self._fail_all(err)
                return
            except unreachable() as err:
                failure = err
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            except ScalableTopicsError as err:  # the segment is gone: no retry finds it
                self._fail_all(err)
                return
        else:
            self._fail_all(ChannelError(f"segment unreachable: {failure}"))
            return
        self._writer, self._on_wire, self._unsent = writer, deque(), deque(self._pending)
        self._write_ahead()
        self._tasks = [asyncio.get_running_loop().create_task(self._read(reader, writer))]

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Resolve responses as they come, every complete one of each read at once; the
        first answers the HELLO."""
        received = bytearray()
        greeted = False
        try:
            while chunk := await reader.read(1 << 16):
                received += chunk
                start = 0
                while (frame := wire.frame_at(received, start, len(received))) is not None:
                    body, start = frame
                    response = bytes(received[body:start])
                    ended = self._resolve(response) if greeted else self._greeted(response)
                    if ended:
                        return
                    greeted = True
                del received[:start]
                if self._unsent and self._writer is writer:
                    self._write_ahead()
            raise ConnectionError("the segment closed the connection")
        except (ConnectionError, OSError, InvalidArgumentError):
            if self._writer is writer:
                self._writer = None
            if self._pending:
                self._ensure_connecting()

    def _greeted(self, body: bytes) -> bool:
        """Whether the segment refused the HELLO (and so ended the connection)."""
        try:
            wire.decode_welcome(body)
        except ScalableTopicsError as err:
            self._refused(err)
            return True
        return False

    def _resolve(self, body: bytes) -> bool:
        """Responses arrive in request order: the oldest frame on the wire gets this one.
        A refusal (the credential was revoked) ends the connection: True."""
        if body[0] == wire.STATUS_OK:
            outcome: tuple[int, int] | ScalableTopicsError = wire.decode_response(body)
        else:
            outcome = wire.decode_error(body)
            if wire.is_refusal(outcome):
                self._refused(outcome)
                return True
        if not self._on_wire:
            raise InvalidArgumentError("the segment answered a frame that was never sent")
        if isinstance(outcome, NotLeaderError) and self._relocate is not None:
            self._leader_moved()
            return True
        _, future = self._pending.pop(self._on_wire.popleft())
        if not future.done():
            if isinstance(outcome, ScalableTopicsError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        return False

    def _leader_moved(self) -> None:
        """A replica that does not lead (yet) answered: this frame and all after it stay
        pending, and go again, in order, to the segment looked up anew. Resent one by one
        by their callers instead, a later frame could reach the leader before an earlier
        one and wait for it in front of it on the connection."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._on_wire, self._unsent = deque(), deque()
        if self._connecting is None or self._connecting.done():
            connect = self._connect(pause_s=LEADER_WAIT_S)
            self._connecting = asyncio.get_running_loop().create_task(connect)

    def _refused(self, error: ScalableTopicsError) -> None:
        """The segment will not take frames from this connection: everything pending
        fails with why, and the next append tries a new connection."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._on_wire, self._unsent = deque(), deque()
        self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, OrderedDict()
        for _, future in pending.values():
            if not future.done():
                future.set_exception(error)


class ReadChannel:
    """A consumer's connection to one segment: one exchange at a time (callers that
    ask at once wait their turn). A stream consumer reads through one; a queue
    consumer takes through one and settles through another, so that an
    acknowledgement never waits behind a long-poll."""

    def __init__(
        self,
        handle: Any,
        *,
        credential: str | None = None,
        relocate: Callable[[], Awaitable[Any | None]] | None = None,
    ) -> None:
        """``relocate``: for a channel to a segment looked up again after an exchange
        failed, the segment looked up anew (``_open_following``; ``None`` while it is not
        served)."""
        self.handle = handle
        self._credential = credential
        self._relocate = relocate
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._turn = asyncio.Lock()

    async def read(self, request: wire.ReadRequest) -> tuple[pa.RecordBatch, int, bool]:
        """(the delivery batch, the segment's end offset, whether it is terminated), or
        the segment's typed error; ``ChannelError`` or ``RayActorError`` if it cannot be
        reached now (the caller retries: reads and cumulative acks are idempotent)."""
        body = await self._ask(wire.encode_read(request), request.wait_s)
        end_offset, terminated, payload = self._answer(wire.decode_records, body)
        return deserialize_batch(payload), end_offset, terminated

    async def read_share(self, request: wire.ShareRead) -> tuple[pa.RecordBatch, int, bool, int]:
        """(the records of the share the subscription has not acknowledged, the segment's
        end offset, whether it is terminated, where the next read starts); errors as
        ``read``'s."""
        body = await self._ask(wire.encode_share_read(request), request.wait_s)
        end_offset, terminated, following, payload = self._answer(wire.decode_shared, body)
        return deserialize_batch(payload), end_offset, terminated, following

    async def take(self, request: wire.TakeRequest) -> tuple[pa.RecordBatch, bool]:
        """(messages no other consumer of the subscription holds, whether the segment is
        drained for it: sealed, and all of it acknowledged); errors as ``read``'s. A
        take that failed on the way may have handed out messages: they come back to
        the subscription after its ack timeout."""
        body = await self._ask(wire.encode_take(request), request.wait_s)
        _, flags, payload = self._answer(wire.decode_taken, body)
        return deserialize_batch(payload), bool(flags & wire.DRAINED)

    async def settle(self, request: wire.SettleRequest) -> None:
        """Acknowledge, hand back, or say goodbye; errors as ``read``'s (settling the
        same offsets again is harmless)."""
        self._answer(wire.decode_response, await self._ask(wire.encode_settle(request), 0.0))

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def _ask(self, frame: bytes, wait_s: float) -> bytes:
        async with self._turn:
            return await self._ask_now(frame, wait_s)

    async def _ask_now(self, frame: bytes, wait_s: float) -> bytes:
        try:
            async with asyncio.timeout(wait_s + READ_GRACE_S):  # no task, unlike wait_for
                return await self._exchange(frame)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as err:
            self.close()
            raise ChannelError(f"segment read failed: {err!r}") from err
        except BaseException:  # cancelled mid-exchange: the answer would go to the next read
            self.close()
            raise

    def _answer(self, decode: Callable[[bytes], _T], body: bytes) -> _T:
        """``decode(body)``; a refusal closes the connection (the segment closed it too)."""
        try:
            return decode(body)
        except ScalableTopicsError as err:
            if wire.is_refusal(err):
                self.close()
            raise

    async def _exchange(self, frame: bytes) -> bytes:
        fresh = self._streams is None
        if fresh:
            if self._relocate is None:
                self._streams = await _open_data_plane(
                    self.handle, self._credential, wire.CONSUME, limit=_STREAM_LIMIT
                )
            else:
                self.handle, self._streams = await _open_following(
                    self.handle, self._relocate, self._credential, wire.CONSUME,
                    limit=_STREAM_LIMIT,
                )  # fmt: skip
        reader, writer = self._streams
        writer.write(frame)
        if fresh:
            wire.decode_welcome(await _frame(reader))
        return await _frame(reader)


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
    return await reader.readexactly(length)
