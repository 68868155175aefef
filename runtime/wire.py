"""The segment data plane's wire format: appends and reads as length-prefixed binary frames.

Ray actor calls cost about a millisecond each on a small machine, which caps a
segment at ~1,000 appends/s however large the machine's disk bandwidth. So the
hot paths — appending batches and a stream consumer's long-poll reads — also
run over a plain TCP connection to the segment actor (Ray stays the control
plane: it finds, starts and restarts the actor and hands out its address).
Append frames carry the Arrow IPC bytes the log stores, untouched; a read is
answered with the delivery batch as an Arrow IPC stream.

    hello    = u32 length | u8 op=HELLO | u8 wire version | u8 access wanted
               (1 produce, 2 consume) | credential (UTF-8, the rest of the frame)
    append   = u32 length | u8 op=APPEND | u16 len(producer id) | producer id
               | i64 sequence (-1: none) | Arrow IPC stream bytes
    read     = u32 length | u8 op=READ | i64 offset | u32 max records | u32 wait ms
               | i64 cumulative ack (-1: none) | u16 len(subscription) | subscription
    welcome  = u32 length | u8 status=OK | u8 access granted
    appended = u32 length | u8 status=OK | i64 base offset | i64 count
    take     = u32 length | u8 op=QUEUE_TAKE | u32 max records | u32 wait ms
               | u16 len(subscription) | subscription | consumer (UTF-8, the rest)
    share    = u32 length | u8 op=SHARE_READ | i64 offset | u32 max records
               | u32 wait ms | i64 cumulative ack (-1: none) | u32 first bucket
               | u32 bucket after the last | u32 buckets per segment (0: every key)
               | u16 len(subscription) | subscription
    settle   = u32 length | u8 op=QUEUE_SETTLE | u8 kind (1 ack, 2 negative ack,
               3 consumer left) | u32 delay ms | u16 len(subscription) | subscription
               | u16 len(consumer) | consumer | i64 offsets (the rest)
    records  = u32 length | u8 status=OK | i64 end offset | u8 flags (1 terminated;
               2 drained: sealed and all of it acknowledged, answering a take)
               | Arrow IPC stream bytes (the delivery batch)
    shared   = u32 length | u8 status=OK | i64 end offset | u8 flags
               | i64 next offset (past every record looked at) | Arrow IPC stream bytes
    error    = u32 length | u8 status=ERROR | JSON {"error": code, "message": ...}

A follower's fetch from its leader and the leader's shipment are
``runtime.replica_frames``.

Anyone who can reach a segment's port can send it bytes, so the first frame of
every connection is a HELLO and the segment looks at nothing else until it has
checked the credential in it (against the cluster's policy) for the access the
client asks for. It is checked once per connection, not per frame: an accepted
connection then carries append frames if it was granted produce and read frames
if it was granted consume. A refusal is an error frame, after which the segment
closes the connection. A client sends its HELLO and its first frames together,
so the handshake costs no round trip. Before the HELLO is accepted a frame may
be at most ``MAX_HELLO`` bytes: an unauthenticated peer cannot make the segment
hold a large buffer.

A read's cumulative ack, applied before it reads, saves the consumer a call per
acknowledgement. A queue consumer takes messages no other consumer of its
subscription holds (``take``, answered like a read, with how often each was
delivered before in the batch's schema metadata) and settles them
(``settle``: acknowledged, handed back, or all of a departing consumer's handed
back; answered like an append, with the count of offsets). A stream subscription's
consumer reads its *share* (``runtime.assignment.Share``: the segment, or some of its
key buckets) with ``share``: what the subscription acknowledged already is skipped, as
are keys of other buckets, so the answer says where the next read starts; a share's
individual acknowledgements go as ``settle`` frames. Responses come back in request
order on each connection.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    UnauthenticatedError,
    UnauthorizedError,
    error_from_code,
)

LENGTH = struct.Struct("!I")
_REQUEST = struct.Struct("!BH")
_SEQUENCE = struct.Struct("!q")
_OK = struct.Struct("!Bqq")
_OK_FRAME = struct.Struct("!IBqq")  # length prefix and body in one pack
_READ = struct.Struct("!BqIIqH")
_RECORDS = struct.Struct("!BqB")
_HELLO = struct.Struct("!BBB")
_WELCOME = struct.Struct("!BB")
_TAKE = struct.Struct("!BIIH")
_SETTLE = struct.Struct("!BBIH")
_SHARE = struct.Struct("!BqIIqIIIH")
_SHARED = struct.Struct("!BqBq")
_NAME_LENGTH = struct.Struct("!H")
_OFFSET = struct.Struct("!q")
_TXN_LENGTH = struct.Struct("!B")
OP_APPEND = 1
OP_READ = 2
OP_HELLO = 3
OP_QUEUE_TAKE = 4
OP_QUEUE_SETTLE = 5
OP_SHARE_READ = 6
OP_REPLICA_FETCH = 7  # between a segment's replicas: runtime.replica_frames
OP_TXN_APPEND = 8  # an append of a transaction's batch: OP_APPEND's, with its id
STATUS_OK = 0
STATUS_ERROR = 1
MAX_FRAME = 256 << 20
WIRE_VERSION = 1
MAX_CREDENTIAL = 4096  # bytes of UTF-8; tokens are tens of characters
MAX_HELLO = _HELLO.size + MAX_CREDENTIAL
# What a connection may carry (bits of the HELLO's access byte). REPLICATE is a
# segment's replica fetching from its leader: the system's own credential only.
PRODUCE = 1
CONSUME = 2
REPLICATE = 4
ALL_ACCESS = PRODUCE | CONSUME | REPLICATE
ACCESS_NAMES = {PRODUCE: "produce", CONSUME: "consume", REPLICATE: "replicate"}
# What each kind of frame needs its connection to have been granted.
ACCESS_OF_OP = {
    OP_APPEND: PRODUCE,
    OP_TXN_APPEND: PRODUCE,
    OP_READ: CONSUME,
    OP_QUEUE_TAKE: CONSUME,
    OP_QUEUE_SETTLE: CONSUME,
    OP_SHARE_READ: CONSUME,
    OP_REPLICA_FETCH: REPLICATE,
}


def frame_at(buffer: bytes | bytearray, start: int, end: int) -> tuple[int, int] | None:
    """``(body start, body end)`` of the frame at ``start`` once all of it is in
    ``buffer[:end]``, ``None`` while bytes are missing; a length over ``MAX_FRAME``
    raises ``InvalidArgumentError`` (the stream is not ours, or is corrupt)."""
    if end - start < LENGTH.size:
        return None
    (length,) = LENGTH.unpack_from(buffer, start)
    if length > MAX_FRAME:
        raise InvalidArgumentError(f"data plane frame of {length} bytes, over {MAX_FRAME}")
    body = start + LENGTH.size
    return (body, body + length) if end - body >= length else None


class Endpoint(NamedTuple):
    """Where a segment's data plane listens, and whether it speaks TLS there."""

    host: str
    port: int
    tls: bool = False


def encode_hello(credential: str | None, access: int) -> bytes:
    """The first frame of a connection: ``access`` is ``PRODUCE``, ``CONSUME`` or both."""
    token = (credential or "").encode()
    if len(token) > MAX_CREDENTIAL:
        raise InvalidArgumentError(f"a credential of {len(token)} bytes, over {MAX_CREDENTIAL}")
    return (
        LENGTH.pack(_HELLO.size + len(token)) + _HELLO.pack(OP_HELLO, WIRE_VERSION, access) + token
    )


def decode_hello(body: bytes | memoryview) -> tuple[str | None, int]:
    """(credential, access wanted) of a connection's first frame. Anything else
    (an append or read frame, garbage) is ``UnauthenticatedError``: the segment
    looks at no frame before the HELLO."""
    if len(body) < _HELLO.size or body[0] != OP_HELLO:
        raise UnauthenticatedError("the first frame of a data plane connection must be a HELLO")
    _, version, access = _HELLO.unpack_from(body)
    if version != WIRE_VERSION:
        raise InvalidArgumentError(f"data plane wire version {version}, expected {WIRE_VERSION}")
    if access == 0 or access & ~ALL_ACCESS:
        raise InvalidArgumentError(
            f"data plane access {access}: a sum of 1 (produce), 2 (consume), 4 (replicate)"
        )
    try:
        credential = bytes(body[_HELLO.size :]).decode()
    except UnicodeDecodeError:
        raise UnauthenticatedError("the presented credential is not valid") from None
    return credential or None, access


def encode_welcome(granted: int) -> bytes:
    return LENGTH.pack(_WELCOME.size) + _WELCOME.pack(STATUS_OK, granted)


def decode_welcome(body: bytes) -> int:
    """The access granted, or raise the typed error that refused the connection."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    if len(body) != _WELCOME.size:
        raise InvalidArgumentError("the segment did not answer the data plane HELLO")
    return _WELCOME.unpack(body)[1]


def is_refusal(error: Exception) -> bool:
    """Whether an error frame ended the connection (authentication or authorization)."""
    return isinstance(error, UnauthenticatedError | UnauthorizedError)


def is_append(body: bytes | memoryview) -> bool:
    """Whether a frame's body is an append (by its op byte; anything else is a read)."""
    return len(body) > 0 and body[0] in (OP_APPEND, OP_TXN_APPEND)


def encode_append(
    producer_id: str | None, sequence: int | None, payload: bytes, txn_id: str | None = None
) -> bytes:
    """An append; of transaction ``txn_id``'s batch (``OP_TXN_APPEND``: its id, one byte
    of length first, after the sequence) when one is given."""
    pid = (producer_id or "").encode()
    if txn_id is not None and not 0 < len(txn_id.encode()) <= 255:
        raise InvalidArgumentError(f"a transaction id takes 1-255 bytes, not {txn_id!r}")
    txn = b"" if txn_id is None else _TXN_LENGTH.pack(len(txn_id)) + txn_id.encode()
    body_length = _REQUEST.size + len(pid) + _SEQUENCE.size + len(txn) + len(payload)
    op = OP_APPEND if txn_id is None else OP_TXN_APPEND
    return b"".join(
        (
            LENGTH.pack(body_length),
            _REQUEST.pack(op, len(pid)),
            pid,
            _SEQUENCE.pack(-1 if sequence is None else sequence),
            txn,
            payload,
        )
    )


def decode_append(body: bytes | memoryview) -> tuple[str | None, int | None, memoryview]:
    """(producer id, sequence, Arrow IPC payload) of an append frame's body."""
    producer_id, sequence, _, payload = decode_txn_append(body)
    return producer_id, sequence, payload


def decode_txn_append(
    body: bytes | memoryview,
) -> tuple[str | None, int | None, str | None, memoryview]:
    """(producer id, sequence, transaction id or ``None``, Arrow IPC payload) of an
    append frame's body."""
    view = memoryview(body)
    if len(view) < _REQUEST.size + _SEQUENCE.size:
        raise InvalidArgumentError("data plane frame too short")
    op, pid_length = _REQUEST.unpack_from(view)
    if op not in (OP_APPEND, OP_TXN_APPEND):
        raise InvalidArgumentError(f"unknown data plane operation {op}")
    pid_end = _REQUEST.size + pid_length
    producer_id = bytes(view[_REQUEST.size : pid_end]).decode() or None
    (sequence,) = _SEQUENCE.unpack_from(view, pid_end)
    rest, txn_id = pid_end + _SEQUENCE.size, None
    if op == OP_TXN_APPEND:
        if len(view) < rest + _TXN_LENGTH.size:
            raise InvalidArgumentError("data plane frame too short for its transaction id")
        (txn_length,) = _TXN_LENGTH.unpack_from(view, rest)
        start, rest = rest + _TXN_LENGTH.size, rest + _TXN_LENGTH.size + txn_length
        if txn_length == 0 or len(view) < rest:
            raise InvalidArgumentError("data plane frame with a malformed transaction id")
        try:
            txn_id = bytes(view[start:rest]).decode()
        except UnicodeDecodeError:
            raise InvalidArgumentError("a transaction id must be UTF-8") from None
    return producer_id, (None if sequence < 0 else sequence), txn_id, view[rest:]


class ReadRequest(NamedTuple):
    offset: int
    max_records: int
    wait_s: float
    subscription: str
    ack: int | None  # the subscription's cumulative ack, applied before reading


def encode_read(request: ReadRequest) -> bytes:
    subscription = request.subscription.encode()
    wait_ms = min(round(request.wait_s * 1000), 0xFFFFFFFF)
    head = _READ.pack(
        OP_READ,
        request.offset,
        request.max_records,
        wait_ms,
        -1 if request.ack is None else request.ack,
        len(subscription),
    )
    return LENGTH.pack(len(head) + len(subscription)) + head + subscription


def decode_read(body: bytes | memoryview) -> ReadRequest:
    if len(body) < _READ.size:
        raise InvalidArgumentError("data plane read frame too short")
    op, offset, max_records, wait_ms, ack, length = _READ.unpack_from(body)
    if op != OP_READ:
        raise InvalidArgumentError(f"unknown data plane operation {op}")
    if offset < 0 or max_records < 1:
        raise InvalidArgumentError(
            f"a read needs offset >= 0 and max records >= 1, got {offset} and {max_records}"
        )
    subscription = bytes(body[_READ.size : _READ.size + length]).decode()
    return ReadRequest(offset, max_records, wait_ms / 1000, subscription, None if ack < 0 else ack)


class ShareRead(NamedTuple):
    offset: int
    max_records: int
    wait_s: float
    subscription: str
    ack: int | None  # cumulative, for a whole segment's reader only
    start: int = 0  # buckets [start, end) of count; count 0: every key
    end: int = 0
    count: int = 0


def encode_share_read(request: ShareRead) -> bytes:
    subscription = request.subscription.encode()
    head = _SHARE.pack(
        OP_SHARE_READ,
        request.offset,
        request.max_records,
        millis(request.wait_s),
        -1 if request.ack is None else request.ack,
        request.start,
        request.end,
        request.count,
        len(subscription),
    )
    return LENGTH.pack(len(head) + len(subscription)) + head + subscription


def decode_share_read(body: bytes | memoryview) -> ShareRead:
    if len(body) < _SHARE.size:
        raise InvalidArgumentError("data plane share read frame too short")
    op, offset, max_records, wait_ms, ack, start, end, count, length = _SHARE.unpack_from(body)
    _expect(op, OP_SHARE_READ)
    if offset < 0 or max_records < 1:
        raise InvalidArgumentError(
            f"a read needs offset >= 0 and max records >= 1, got {offset} and {max_records}"
        )
    if count and not 0 <= start < end <= count:
        raise InvalidArgumentError(
            f"a share's buckets must be 0 <= start < end <= count, got [{start}, {end}) of {count}"
        )
    subscription, _ = _name(body, _SHARE.size, length)
    ack_ = None if ack < 0 else ack
    return ShareRead(offset, max_records, wait_ms / 1000, subscription, ack_, start, end, count)


def encode_shared(
    end_offset: int, terminated: bool, next_offset: int, payload: Sequence[Any]
) -> bytes:
    head = _SHARED.pack(STATUS_OK, end_offset, TERMINATED if terminated else 0, next_offset)
    size = len(head) + sum(len(part) for part in payload)
    return b"".join((LENGTH.pack(size), head, *payload))


def decode_shared(body: bytes) -> tuple[int, bool, int, memoryview]:
    """(the segment's end offset, whether it is terminated, where the next read starts,
    the records' Arrow IPC stream), or raise the typed error the segment reported."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    _, end_offset, flags, next_offset = _SHARED.unpack_from(body)
    return end_offset, bool(flags & TERMINATED), next_offset, memoryview(body)[_SHARED.size :]


class Settle(enum.IntEnum):
    """What a ``settle`` frame does with its offsets."""

    ACK = 1
    NEGATIVE_ACK = 2  # handed back for redelivery, after its delay
    CONSUMER_LEFT = 3  # everything the consumer holds handed back (no offsets)


class TakeRequest(NamedTuple):
    subscription: str
    consumer: str
    max_records: int
    wait_s: float


class SettleRequest(NamedTuple):
    kind: Settle
    subscription: str
    consumer: str
    offsets: list[int]
    delay_s: float = 0.0


def encode_take(request: TakeRequest) -> bytes:
    subscription, consumer = request.subscription.encode(), request.consumer.encode()
    head = _TAKE.pack(OP_QUEUE_TAKE, request.max_records, millis(request.wait_s), len(subscription))
    return (
        LENGTH.pack(len(head) + len(subscription) + len(consumer)) + head + subscription + consumer
    )


def decode_take(body: bytes | memoryview) -> TakeRequest:
    if len(body) < _TAKE.size:
        raise InvalidArgumentError("data plane take frame too short")
    op, max_records, wait_ms, length = _TAKE.unpack_from(body)
    _expect(op, OP_QUEUE_TAKE)
    if max_records < 1:
        raise InvalidArgumentError(f"a take needs max records >= 1, got {max_records}")
    subscription, end = _name(body, _TAKE.size, length)
    return TakeRequest(subscription, text(body[end:]), max_records, wait_ms / 1000)


def encode_settle(request: SettleRequest) -> bytes:
    subscription, consumer = request.subscription.encode(), request.consumer.encode()
    parts = (
        _SETTLE.pack(OP_QUEUE_SETTLE, request.kind, millis(request.delay_s), len(subscription)),
        subscription,
        _NAME_LENGTH.pack(len(consumer)),
        consumer,
        struct.pack(f"!{len(request.offsets)}q", *request.offsets),
    )
    return LENGTH.pack(sum(map(len, parts))) + b"".join(parts)


def decode_settle(body: bytes | memoryview) -> SettleRequest:
    if len(body) < _SETTLE.size:
        raise InvalidArgumentError("data plane settle frame too short")
    op, kind, delay_ms, length = _SETTLE.unpack_from(body)
    _expect(op, OP_QUEUE_SETTLE)
    try:
        settle = Settle(kind)
    except ValueError:
        raise InvalidArgumentError(f"unknown settle kind {kind}") from None
    subscription, end = _name(body, _SETTLE.size, length)
    if len(body) < end + _NAME_LENGTH.size:
        raise InvalidArgumentError("data plane settle frame too short")
    (length,) = _NAME_LENGTH.unpack_from(body, end)
    consumer, end = _name(body, end + _NAME_LENGTH.size, length)
    rest = memoryview(body)[end:]
    if len(rest) % _OFFSET.size:
        raise InvalidArgumentError("a settle frame's offsets are not whole 8-byte integers")
    offsets = list(struct.unpack(f"!{len(rest) // _OFFSET.size}q", rest))
    return SettleRequest(settle, subscription, consumer, offsets, delay_ms / 1000)


def millis(seconds: float) -> int:
    return min(max(round(seconds * 1000), 0), 0xFFFFFFFF)


def _expect(op: int, wanted: int) -> None:
    if op != wanted:
        raise InvalidArgumentError(f"unknown data plane operation {op}")


def _name(body: bytes | memoryview, start: int, length: int) -> tuple[str, int]:
    """The UTF-8 name of ``length`` bytes at ``start``, and where it ends."""
    end = start + length
    if len(body) < end:
        raise InvalidArgumentError("data plane frame too short for its names")
    return text(body[start:end]), end


def text(view: bytes | memoryview) -> str:
    try:
        return bytes(view).decode()
    except UnicodeDecodeError:
        raise InvalidArgumentError("a name in a data plane frame is not UTF-8") from None


TERMINATED = 1
DRAINED = 2


def encode_records(
    end_offset: int, terminated: bool, payload: Sequence[Any], flags: int = 0
) -> bytes:
    """``payload``: the pieces of the records' IPC stream (``batch.ipc_parts``);
    ``flags``: ``DRAINED`` beside the segment's being terminated."""
    head = _RECORDS.pack(STATUS_OK, end_offset, flags | (TERMINATED if terminated else 0))
    size = len(head) + sum(len(part) for part in payload)
    return b"".join((LENGTH.pack(size), head, *payload))  # one copy


def decode_records(body: bytes) -> tuple[int, bool, memoryview]:
    """(the segment's end offset, whether it is terminated, Arrow IPC stream of the
    records read), or raise the typed error the segment reported."""
    end_offset, flags, payload = decode_taken(body)
    return end_offset, bool(flags & TERMINATED), payload


def decode_taken(body: bytes) -> tuple[int, int, memoryview]:
    """(the segment's end offset, its flags, the records' Arrow IPC stream), or raise
    the typed error the segment reported."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    _, end_offset, flags = _RECORDS.unpack_from(body)
    return end_offset, flags, memoryview(body)[_RECORDS.size :]


def encode_ok(base_offset: int, count: int) -> bytes:
    return _OK_FRAME.pack(_OK.size, STATUS_OK, base_offset, count)


def encode_error(error: ScalableTopicsError) -> bytes:
    body = bytes([STATUS_ERROR]) + json.dumps(error.to_dict()).encode()
    return LENGTH.pack(len(body)) + body


def encode_failure(error: Exception) -> bytes:
    """A typed error as itself; anything else (a frame that did not decode) as a
    malformed-frame ``InvalidArgumentError``."""
    if not isinstance(error, ScalableTopicsError):
        error = InvalidArgumentError(f"malformed data plane frame: {error}")
    return encode_error(error)


def decode_response(body: bytes) -> tuple[int, int]:
    """(base offset, count), or raise the typed error the segment reported."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    _, base, count = _OK.unpack(body)
    return base, count


def decode_error(body: bytes) -> ScalableTopicsError:
    """The typed error of an error frame's body."""
    try:
        data = json.loads(body[1:])
        return error_from_code(data.get("error"), data.get("message", "data plane error"), 409)
    except (ValueError, AttributeError):
        return InvalidArgumentError("the segment sent a malformed error frame")


def _raise_error(body: bytes) -> None:
    raise decode_error(body)
